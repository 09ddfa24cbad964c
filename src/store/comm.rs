//! MXNet's `Comm` (`src/kvstore/comm.h`): reduces the values pushed for one
//! key into one value, and broadcasts a value into several outputs.
//! `CommCPU` (the `local` store's) sums `v0` plus groups of four into a merge
//! buffer on `cpu_pinned(0)`; `CommDevice` (`device`) sums left to right
//! into a merge buffer it places on the least-loaded of the pushing devices,
//! and applies gradient compression. The local store and the distributed
//! worker (before it sends) reduce with it.
#![forbid(unsafe_code)]

use super::compression::CompressionParams;
use super::group::stdsort_by;
use crate::ensure;
use crate::error::Result;
use crate::ndarray::dtype::DType;
use crate::ndarray::kernels::SumOrder;
use crate::ndarray::sparse::{sum_row_sparse, sum_row_sparse_into, Spare};
use crate::ndarray::{
    copy_to_many, sum_into, sum_into_and_copy, Context, NDArray, Shape, StorageType,
};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

/// One key's state in a [`Comm`] (MXNet's `merge_buf_[key]`), made from
/// the key's initial value. A key's shape and dtype never change.
pub struct CommKey {
    shape: Shape,
    dtype: DType,
    /// Element count (the device placement puts the largest keys first).
    size: usize,
    /// Where multi-value pushes are summed.
    merge: Mutex<Merge>,
    /// Gradient-compression residuals, one per position in the pushed list.
    residuals: Mutex<Vec<Vec<f32>>>,
    /// Serialises [`Comm::reduce_to_send`] of this key (its merge buffer is
    /// shared); the local store serialises with its own per-key lock.
    serial: Mutex<()>,
}

/// A key's merge buffer: its context (placed on a device comm as MXNet's
/// CommDevice places it) and the dense buffer, made on first use.
#[derive(Default)]
struct Merge {
    ctx: Option<Context>,
    dense: Option<NDArray>,
    /// Parts for the next row_sparse value assigned without an updater.
    spare: Spare,
}

impl CommKey {
    /// The state of a key whose initial value is `value`.
    pub fn new(value: &NDArray) -> Arc<CommKey> {
        Arc::new(CommKey {
            shape: value.shape().clone(),
            dtype: value.dtype(),
            size: value.size(),
            merge: Mutex::new(Merge::default()),
            residuals: Mutex::new(Vec::new()),
            serial: Mutex::new(()),
        })
    }

    /// Runs `f` with the key's spare row_sparse parts (not holding the
    /// merge lock meanwhile: the caller serialises pushes of the key).
    pub fn with_spare<R>(&self, f: impl FnOnce(&mut Spare) -> R) -> R {
        let mut spare = std::mem::take(&mut self.merge.lock().spare);
        let r = f(&mut spare);
        self.merge.lock().spare = spare;
        r
    }

    /// The context of the key's merge buffer, once a `device` store placed it.
    pub fn placed(&self) -> Option<Context> {
        self.merge.lock().ctx
    }

    /// The key's dense merge buffer.
    fn merge_buffer(&self, ctx: Context) -> Result<NDArray> {
        let mut m = self.merge.lock();
        if let Some(b) = &m.dense {
            return Ok(b.clone());
        }
        let b = NDArray::zeros(self.shape.clone(), self.dtype, ctx)?;
        m.dense = Some(b.clone());
        Ok(b)
    }
}

/// The device communicator's merge-buffer bookkeeping (MXNet's `CommDevice`).
#[derive(Default)]
struct DeviceKeys {
    /// Every key ever initialised, in init order.
    keys: Vec<Arc<CommKey>>,
    /// (position in `keys`, size) of every key: MXNet's `sorted_key_attrs_`,
    /// new keys appended at init and the whole list sorted in place at each
    /// placement. The order equal sizes end up in depends on the order the
    /// list had before (std::sort is not stable beyond 16 elements), so it is
    /// kept from one placement to the next, as MXNet keeps it.
    sorted: Vec<(usize, usize)>,
    /// Merge buffers have been placed since the last init. Before that, a
    /// broadcast copies the value into one output and that output into the
    /// others (so dtype conversions chain, as in MXNet).
    ready: bool,
}

/// MXNet's `CommCPU` (`device == false`) or `CommDevice` (`device == true`).
pub struct Comm {
    device: bool,
    devices: Mutex<DeviceKeys>,
    compression: RwLock<Option<CompressionParams>>,
}

impl Comm {
    pub fn new(device: bool) -> Comm {
        Comm {
            device,
            devices: Mutex::new(DeviceKeys::default()),
            compression: RwLock::new(None),
        }
    }

    pub fn is_device(&self) -> bool {
        self.device
    }

    /// `Comm::Init` of new keys: a device comm places merge buffers again
    /// at the next multi-value push. MXNet calls `CommDevice::Init` once per
    /// key and each call clears `inited_`, so a call with no keys (an
    /// `init([], [])`, a `broadcast` of no keys) leaves the placed buffers,
    /// and the way `broadcast` writes outputs, as they were.
    pub fn init<'a>(&self, keys: impl IntoIterator<Item = &'a Arc<CommKey>>) {
        if self.device {
            let mut d = self.devices.lock();
            for key in keys {
                let pos = d.keys.len();
                d.sorted.push((pos, key.size));
                d.keys.push(key.clone());
                d.ready = false;
            }
        }
    }

    /// Sets gradient compression (used by a device comm only).
    pub fn set_compression(&self, params: CompressionParams) {
        *self.compression.write() = Some(params);
    }

    /// The compression pushes get now: set on a device comm, else `None`.
    /// A push reads it once, checks its values against it and reduces with
    /// it ([`Comm::check_with`], [`Comm::reduce`], [`Comm::reduce_into`]), so
    /// compression switched on meanwhile from another thread never meets
    /// values checked without it.
    pub fn compression(&self) -> Option<CompressionParams> {
        if self.device {
            *self.compression.read()
        } else {
            None
        }
    }

    fn order(&self) -> SumOrder {
        if self.device {
            SumOrder::LeftToRight
        } else {
            SumOrder::GroupsOfFour
        }
    }

    /// Checks one key's pushed values (at least one) against the key: its
    /// shape, the first value's dtype, no sum of bools, and what compression
    /// refuses. `name` is the key as the caller wrote it.
    pub fn check(&self, name: &str, key: &CommKey, vals: &[&NDArray]) -> Result<()> {
        self.check_with(name, key, vals, self.compression())
    }

    /// [`Comm::check`] against the compression `gc` (read once for the push).
    pub fn check_with(
        &self,
        name: &str,
        key: &CommKey,
        vals: &[&NDArray],
        gc: Option<CompressionParams>,
    ) -> Result<()> {
        for v in vals {
            ensure!(
                v.shape() == &key.shape,
                "operands shape mismatch from.shape = {} to.shape={}: a value pushed for key {} must have the key's shape",
                v.shape(),
                key.shape,
                name
            );
        }
        ensure!(
            vals[0].dtype() == key.dtype,
            "dtype mismatch: key {} holds {} but the first value pushed for it is {}",
            name,
            key.dtype.name(),
            vals[0].dtype().name()
        );
        ensure!(
            vals.len() == 1 || key.dtype != DType::Bool,
            "Unknown type enum 7: bool values of key {} cannot be summed",
            name
        );
        if gc.is_some() {
            for v in vals {
                ensure!(
                    v.stype() == StorageType::Default,
                    "Check failed: gradient_compression_->get_type() == CompressionType: :kNone: Gradient compression for row sparse storage type is not supported (key {})",
                    name
                );
                ensure!(
                    v.dtype() == DType::F32,
                    "Check failed: dtype == mshadow: :kFloat32 ({} vs. 0) : Gradient compression is only supported for float32 type of parameters (key {})",
                    v.dtype().code(),
                    name
                );
            }
        }
        Ok(())
    }

    /// MXNet's `CommDevice::InitMergeBuffer`: every key gets a merge buffer
    /// on the least-loaded of the contexts `devs` (those of the first
    /// multi-value push since the last init), largest keys first.
    fn place_merge_buffers(&self, devs: &[Context]) {
        let mut d = self.devices.lock();
        if d.ready {
            return;
        }
        let (order, picks) = placement(std::mem::take(&mut d.sorted), devs);
        for (pos, ctx) in picks {
            d.keys[pos].merge.lock().ctx.get_or_insert(ctx);
        }
        d.sorted = order;
        d.ready = true;
    }

    /// Whether a `device` store's merge buffers are placed (MXNet's
    /// `CommDevice::inited_`): a pull then copies through them; until then
    /// it writes output `key % n` first and copies the others from it.
    /// Always false for `local`.
    pub fn is_ready(&self) -> bool {
        self.device && self.devices.lock().ready
    }

    /// The context a reduce of `vals` for `key` puts its merged value on,
    /// without placing any buffer: `cpu_pinned(0)` on `local`; on `device`
    /// the key's merge buffer's context, or the one the placement a push of
    /// `vals` would make gives it.
    pub fn peek_merge_ctx(&self, key: &CommKey, devs: &[Context]) -> Context {
        if !self.device {
            return Context::PINNED0;
        }
        if let Some(ctx) = key.placed() {
            return ctx;
        }
        let d = self.devices.lock();
        if d.ready {
            return devs[0];
        }
        let Some(me) = d.keys.iter().position(|k| std::ptr::eq(&**k, key)) else {
            return devs[0];
        };
        let (_, picks) = placement(d.sorted.clone(), devs);
        picks
            .into_iter()
            .find(|&(pos, _)| pos == me)
            .map_or(devs[0], |(_, ctx)| ctx)
    }

    /// The context of a key's merged values.
    fn merge_ctx(&self, key: &CommKey, vals: &[&NDArray]) -> Context {
        if !self.device {
            return Context::PINNED0;
        }
        self.place_merge_buffers(&vals.iter().map(|v| v.ctx()).collect::<Vec<_>>());
        *key.merge.lock().ctx.get_or_insert(vals[0].ctx())
    }

    /// Combines the (checked) values pushed for one key into one: MXNet's
    /// `Reduce`. A single value is returned as given (a row_sparse one on
    /// `local` as a copy on `cpu_pinned(0)`); a dense sum is the key's merge
    /// buffer, valid until the next reduce of the key. `gc`: the compression
    /// the values were checked against.
    pub fn reduce(
        &self,
        key: &CommKey,
        vals: &[&NDArray],
        gc: Option<CompressionParams>,
    ) -> Result<NDArray> {
        if let Some(gc) = gc {
            return self.reduce_compressed(key, vals, gc);
        }
        if vals[0].stype() == StorageType::RowSparse {
            // The first value decides: sum as row_sparse.
            if vals.len() == 1 {
                return if self.device {
                    Ok(vals[0].clone())
                } else {
                    vals[0].copy_to_ctx(Context::PINNED0)
                };
            }
            let ctx = self.merge_ctx(key, vals);
            let rows = row_sparse_inputs(vals)?;
            return sum_row_sparse(&rows, &key.shape, key.dtype, ctx);
        }
        if vals.len() == 1 {
            return Ok(vals[0].clone());
        }
        let ctx = self.merge_ctx(key, vals);
        let buf = key.merge_buffer(ctx)?;
        sum_into(&dense_inputs(key, vals)?, &buf, self.order())?;
        Ok(buf)
    }

    /// MXNet's `comm_->Reduce` for a distributed worker
    /// (`KVStoreDist::PushImpl`): the (checked) values of one key reduced
    /// into a value of its own (a single value is returned as given; a sum
    /// is a new array).
    pub fn reduce_to_send(&self, key: &CommKey, vals: &[&NDArray]) -> Result<NDArray> {
        if vals.len() == 1 {
            return Ok(vals[0].clone());
        }
        let _serial = key.serial.lock();
        let merged = self.reduce(key, vals, self.compression())?;
        merged.copy_to_ctx(merged.ctx())
    }

    /// Sums two or more (checked) values straight into `stored`, the key's
    /// stored value: the same numbers as reducing and assigning, with one
    /// pass less and no merge buffer. `outs` (of the key) are written in
    /// the same pass when they can be. `None`: not applicable (compressed,
    /// one value, or the first value's storage type is not `stored`'s);
    /// `Some(wrote_outs)`. `gc`: the compression the values were checked
    /// against.
    pub fn reduce_into(
        &self,
        key: &CommKey,
        vals: &[&NDArray],
        stored: &NDArray,
        outs: &[&NDArray],
        gc: Option<CompressionParams>,
    ) -> Result<Option<bool>> {
        if gc.is_some() || vals.len() < 2 || vals[0].stype() != stored.stype() {
            return Ok(None);
        }
        if stored.stype() == StorageType::RowSparse {
            self.merge_ctx(key, vals);
            let rows = row_sparse_inputs(vals)?;
            key.with_spare(|spare| sum_row_sparse_into(&rows, stored, spare))?;
            return Ok(Some(false));
        }
        if stored.stype() != StorageType::Default {
            return Ok(None);
        }
        // Keeps a device comm's merge-buffer placement as MXNet's.
        self.merge_ctx(key, vals);
        let inputs = dense_inputs(key, vals)?;
        if !outs.is_empty() && sum_into_and_copy(&inputs, stored, outs, self.order())? {
            return Ok(Some(true));
        }
        sum_into(&inputs, stored, self.order())?;
        Ok(Some(false))
    }

    /// Device comm with compression (MXNet's `ReduceCompressed`): each
    /// pushed array is quantized with its own residual (one per position in
    /// the list) and dequantized onto the key's merge-buffer context, then
    /// the results are summed left to right. Even a single value places the
    /// merge buffers (MXNet calls `InitBuffersAndComm` first) and comes back
    /// on the merge buffer's context.
    fn reduce_compressed(
        &self,
        key: &CommKey,
        vals: &[&NDArray],
        gc: CompressionParams,
    ) -> Result<NDArray> {
        let ctx = self.merge_ctx(key, vals);
        let n = key.size;
        let mut residuals = key.residuals.lock();
        while residuals.len() < vals.len() {
            residuals.push(vec![0f32; n]);
        }
        let deq = vals
            .iter()
            .zip(residuals.iter_mut())
            .map(|(v, r)| {
                let out = NDArray::zeros(key.shape.clone(), DType::F32, ctx)?;
                {
                    let g = v.read();
                    let mut o = out.write();
                    gc.quantize_dequantize(g.typed::<f32>(), r, o.typed_mut::<f32>());
                }
                Ok(out)
            })
            .collect::<Result<Vec<_>>>()?;
        drop(residuals);
        if deq.len() == 1 {
            return Ok(deq.into_iter().next().expect("one value"));
        }
        let buf = key.merge_buffer(ctx)?;
        sum_into(&deq, &buf, SumOrder::LeftToRight)?;
        Ok(buf)
    }

    /// MXNet's `Broadcast` of the value `src` of key `key` into `outs`
    /// (at least one). A device comm before its merge buffers exist writes
    /// output `key % n`, then copies it to the others.
    pub fn broadcast(&self, key: i32, src: &NDArray, outs: &[&NDArray]) -> Result<()> {
        if self.device && !self.devices.lock().ready {
            let first = first_output(key, outs.len());
            let head = outs[first];
            head.copy_from(src)?;
            for (i, o) in outs.iter().enumerate() {
                if i != first {
                    o.copy_from(head)?;
                }
            }
            return Ok(());
        }
        copy_to_many(src, outs)
    }
}

/// The output a `device` store writes first when its merge buffers are not
/// placed (MXNet's `key % dst.size()`), of `n` outputs of `key`.
pub fn first_output(key: i32, n: usize) -> usize {
    ((key as i64 as u64) % n as u64) as usize
}

/// The context placed for each key position.
type Picks = Vec<(usize, Context)>;

/// MXNet's `CommDevice::InitMergeBuffer` placement: the keys' (position,
/// size) pairs `sorted` (in the order the previous placement left them) are
/// sorted by size, largest first, as MXNet sorts them, and each key gets the
/// least-loaded of the contexts `devs` (those of the first multi-value push
/// since the last init). Returns the new order and each position's context.
fn placement(mut order: Vec<(usize, usize)>, devs: &[Context]) -> (Vec<(usize, usize)>, Picks) {
    stdsort_by(&mut order, &|a: &(usize, usize), b: &(usize, usize)| {
        a.1 > b.1
    });
    // An unordered_map keyed by device id: iterated in reverse order of
    // first insertion; each id keeps the context assigned to it last.
    let mut slots: Vec<(i32, Context, usize)> = Vec::new();
    for dev in devs {
        match slots.iter_mut().find(|s| s.0 == dev.dev_id) {
            Some(s) => s.1 = *dev,
            None => slots.push((dev.dev_id, *dev, 0)),
        }
    }
    slots.reverse();
    let mut picks = Vec::with_capacity(order.len());
    for &(pos, size) in &order {
        let mut pick = 0;
        let mut min = usize::MAX;
        for (i, s) in slots.iter().enumerate() {
            if s.2 <= min {
                pick = i;
                min = s.2;
            }
        }
        picks.push((pos, slots[pick].1));
        slots[pick].2 += size;
    }
    (order, picks)
}

/// Dense values among row_sparse ones are summed as row_sparse.
fn row_sparse_inputs(vals: &[&NDArray]) -> Result<Vec<NDArray>> {
    vals.iter()
        .map(|v| {
            if v.stype() == StorageType::RowSparse {
                Ok((*v).clone())
            } else {
                let r = NDArray::sparse_zeros(
                    StorageType::RowSparse,
                    v.shape().clone(),
                    v.dtype(),
                    v.ctx(),
                    &[DType::I64],
                    &[Shape(vec![0])],
                )?;
                r.copy_from(v)?;
                Ok(r)
            }
        })
        .collect()
}

/// Values of another dtype or storage type are converted to the key's
/// first, as MXNet's copy buffers do.
fn dense_inputs(key: &CommKey, vals: &[&NDArray]) -> Result<Vec<NDArray>> {
    vals.iter()
        .map(|v| {
            if v.dtype() == key.dtype && v.stype() == StorageType::Default {
                Ok((*v).clone())
            } else {
                let c = NDArray::zeros(key.shape.clone(), key.dtype, v.ctx())?;
                c.copy_from(v)?;
                Ok(c)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{f32s as arr, values as get};

    #[test]
    fn sums_in_each_comms_order_and_sends_arrays_of_their_own() {
        // CommCPU: v0 + (v1 + v2); CommDevice: (v0 + v1) + v2
        for (device, want) in [(false, 1.0f32), (true, 0.0)] {
            let comm = Comm::new(device);
            let key = CommKey::new(&arr(&[0.0]));
            comm.init([&key]);
            let (a, b, c) = (arr(&[1.0]), arr(&[1e8]), arr(&[-1e8]));
            let sum = comm.reduce(&key, &[&a, &b, &c], None).unwrap();
            assert_eq!(get(&sum), vec![want], "device {device}");
            // the merge buffer is reused; what is sent is not
            let x = comm.reduce_to_send(&key, &[&a, &a]).unwrap();
            let y = comm.reduce_to_send(&key, &[&b, &a]).unwrap();
            assert_eq!((get(&x), get(&y)), (vec![2.0], vec![1e8 + 1.0]));
            assert!(!x.same(&comm.reduce(&key, &[&a, &a], None).unwrap()));
        }
    }

    #[test]
    fn an_init_of_no_keys_keeps_the_merge_buffers_placed() {
        // key 1 with outputs [f32, i32]: before the buffers are placed the
        // i32 output (1 % 2) is written first and the f32 one copied from
        // it (0.0); once placed, each output is copied from the value (0.5)
        let comm = Comm::new(true);
        let key = CommKey::new(&arr(&[0.0]));
        let i32_out = || NDArray::zeros(Shape(vec![1]), DType::I32, Context::CPU0).unwrap();
        let pull = |comm: &Comm| {
            let (f, i) = (arr(&[-3.0]), i32_out());
            comm.broadcast(1, &arr(&[0.5]), &[&f, &i]).unwrap();
            get(&f)
        };
        comm.init([&key]);
        assert_eq!(pull(&comm), vec![0.0]);
        comm.reduce(&key, &[&arr(&[1.0]), &arr(&[2.0])], None)
            .unwrap();
        assert_eq!(pull(&comm), vec![0.5]);
        comm.init(std::iter::empty::<&Arc<CommKey>>());
        assert_eq!(pull(&comm), vec![0.5], "after an init of no keys");
        let other = CommKey::new(&arr(&[0.0]));
        comm.init([&other]);
        assert_eq!(pull(&comm), vec![0.0], "after an init of a new key");
    }

    #[test]
    fn check_refuses_what_a_reduce_cannot_sum() {
        let comm = Comm::new(false);
        let key = CommKey::new(&arr(&[0.0, 0.0]));
        let e = comm.check("w", &key, &[&arr(&[1.0])]).unwrap_err();
        assert!(e
            .message()
            .starts_with("operands shape mismatch from.shape = [1] to.shape=[2]"));
        let i = NDArray::zeros(Shape(vec![2]), DType::I32, Context::CPU0).unwrap();
        let e = comm.check("w", &key, &[&i]).unwrap_err();
        assert_eq!(
            e.message(),
            "dtype mismatch: key w holds float32 but the first value pushed for it is int32"
        );
        comm.check("w", &key, &[&arr(&[1.0, 2.0]), &i]).unwrap();
    }
}
