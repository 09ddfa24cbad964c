//! The `local` and `device` stores: values live in this process; pushes are
//! grouped by key, summed in MXNet's order for the chosen communicator, and
//! applied by the updater (or assigned). Every call checks all of its inputs
//! before it changes anything.
#![forbid(unsafe_code)]

use super::group::{group, stdsort_by};
use super::keys::{Keys, KindLock, StrRegistry};
use super::{KvStore, Updater};
use crate::error::Result;
use crate::ndarray::dtype::DType;
use crate::ndarray::kernels::SumOrder;
use crate::ndarray::{sum_into, Context, NDArray, StorageType};
use crate::{bail, ensure};
use parking_lot::{Mutex, ReentrantMutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One key's state.
struct Entry {
    /// The internal key (the int key, or the string key's id).
    id: i32,
    /// The key as the caller wrote it (for messages).
    name: String,
    /// The caller's string for string keys (handed to string updaters).
    str_key: Option<Vec<u8>>,
    /// The stored value, on `cpu_pinned(0)`; its identity never changes.
    value: NDArray,
    /// Serialises pushes (and orders pulls) of this key; reentrant so that an
    /// updater may call back into the store on its own thread.
    update: ReentrantMutex<()>,
    /// The merge buffer for multi-value pushes, made on first use.
    merge: Mutex<Option<NDArray>>,
}

/// The device communicator's merge-buffer bookkeeping (MXNet's `CommDevice`).
#[derive(Default)]
struct DeviceComm {
    /// (key, element count) of every key ever initialised, in init order.
    keys: Vec<(i32, usize)>,
    /// Merge buffers have been placed since the last init. Before that, a
    /// pull copies the stored value into one output and that output into the
    /// others (so dtype conversions chain, as in MXNet).
    ready: bool,
}

pub struct LocalStore {
    type_name: Vec<u8>,
    device: bool,
    comm: Mutex<DeviceComm>,
    kind: KindLock,
    strs: RwLock<StrRegistry>,
    entries: RwLock<HashMap<i32, Arc<Entry>>>,
    updater: RwLock<Option<Arc<dyn Updater>>>,
    warned_sparse_pull: Mutex<HashSet<i32>>,
}

fn duplicate(name: &str) -> crate::error::Error {
    crate::error::Error::new(format!(
        "duplicate init of key {name}. Please double check if you called kv.init or kv.broadcast with this key multiple times"
    ))
}

fn not_inited(name: &str) -> crate::error::Error {
    crate::error::Error::new(format!("key {name} has not been inited"))
}

/// Checks that a value can be stored or pushed.
fn check_value(v: &NDArray, what: &str) -> Result<()> {
    match v.stype() {
        StorageType::Default => Ok(()),
        StorageType::Undefined => bail!("{what}: the value is an empty NDArray (MXNDArrayCreateNone) with no shape or data"),
        StorageType::RowSparse => bail!("{what}: row_sparse values are not supported yet (dense only)"),
        StorageType::Csr => bail!("Unexpected storage type detected during kvstore {what}: 2 (csr values cannot be stored)"),
    }
}

/// What a pull does with one output: write it, or skip it (sparse output with
/// `ignore_sparse`).
fn check_output(stored: &NDArray, out: &NDArray, ignore_sparse: bool) -> Result<bool> {
    match out.stype() {
        StorageType::Default => {
            ensure!(
                out.shape() == stored.shape(),
                "operands shape mismatch from.shape = {} to.shape={}",
                stored.shape(),
                out.shape()
            );
            Ok(true)
        }
        StorageType::Undefined => bail!(
            "pull: the output is an empty NDArray (MXNDArrayCreateNone); outputs must be allocated"
        ),
        StorageType::RowSparse | StorageType::Csr if ignore_sparse => Ok(false),
        _ => bail!("pull into sparse outputs is not supported yet"),
    }
}

impl LocalStore {
    pub fn new(type_name: Vec<u8>, device: bool) -> LocalStore {
        LocalStore {
            type_name,
            device,
            comm: Mutex::new(DeviceComm::default()),
            kind: KindLock::default(),
            strs: RwLock::new(StrRegistry::default()),
            entries: RwLock::new(HashMap::new()),
            updater: RwLock::new(None),
            warned_sparse_pull: Mutex::new(HashSet::new()),
        }
    }

    fn order(&self) -> SumOrder {
        if self.device {
            SumOrder::LeftToRight
        } else {
            SumOrder::GroupsOfFour
        }
    }

    /// Resolves keys to entries; every key must be initialised.
    fn entries_for(&self, keys: Keys<'_>) -> Result<Vec<Arc<Entry>>> {
        let ids: Vec<i32> = match keys {
            Keys::Int(k) => k.to_vec(),
            Keys::Str(k) => {
                let strs = self.strs.read();
                k.iter().map(|s| strs.lookup(s)).collect::<Result<_>>()?
            }
        };
        let map = self.entries.read();
        ids.iter()
            .enumerate()
            .map(|(i, id)| {
                map.get(id)
                    .cloned()
                    .ok_or_else(|| not_inited(&keys.show(i)))
            })
            .collect()
    }

    /// Checks a pull and returns (entry, output) pairs to write.
    fn plan_pull<'o>(
        &self,
        entries: Vec<Arc<Entry>>,
        outs: &'o [NDArray],
        ignore_sparse: bool,
    ) -> Result<Vec<(Arc<Entry>, &'o NDArray)>> {
        let mut plan = Vec::with_capacity(outs.len());
        for (entry, out) in entries.into_iter().zip(outs) {
            if check_output(&entry.value, out, ignore_sparse)? {
                plan.push((entry, out));
            } else {
                self.warn_sparse_pull(&entry);
            }
        }
        Ok(plan)
    }

    fn warn_sparse_pull(&self, entry: &Entry) {
        let id = self
            .entries
            .read()
            .iter()
            .find(|(_, e)| std::ptr::eq(Arc::as_ptr(e), entry))
            .map(|(k, _)| *k);
        if let Some(id) = id {
            if self.warned_sparse_pull.lock().insert(id) {
                eprintln!("Warning: non-default weights detected during kvstore pull. This call has been ignored. Please make sure to use kv.row_sparse_pull() or module.prepare() with row_ids.");
            }
        }
    }

    fn run_pull(&self, plan: &[(Arc<Entry>, &NDArray)]) -> Result<()> {
        if self.device && !self.comm.lock().ready {
            // MXNet's CommDevice before its merge buffers exist: the value
            // goes to output `key % n` of that key's outputs (grouped as a
            // push groups values), which is then copied to the others.
            let ids: Vec<i32> = plan.iter().map(|(e, _)| e.id).collect();
            for (id, pos) in group(&ids) {
                let entry = &plan[pos[0]].0;
                let _order = entry.update.lock();
                let first = ((id as i64 as u64) % pos.len() as u64) as usize;
                let head = plan[pos[first]].1;
                head.copy_from(&entry.value)?;
                for (i, &p) in pos.iter().enumerate() {
                    if i != first {
                        plan[p].1.copy_from(head)?;
                    }
                }
            }
            return Ok(());
        }
        for (entry, out) in plan {
            let _order = entry.update.lock();
            out.copy_from(&entry.value)?;
        }
        Ok(())
    }

    /// MXNet's `CommDevice::InitMergeBuffer`: every key gets a merge buffer
    /// on the least-loaded of the contexts `devs` (those of the first
    /// multi-value push since the last init), largest keys first.
    fn place_merge_buffers(&self, devs: &[Context]) {
        let mut comm = self.comm.lock();
        if comm.ready {
            return;
        }
        let mut keys = comm.keys.clone();
        stdsort_by(&mut keys, &|a: &(i32, usize), b: &(i32, usize)| a.1 > b.1);
        // An unordered_map keyed by device id: iterated in reverse order of
        // first insertion; each id keeps the context assigned to it last.
        let mut slots: Vec<(i32, Context, usize)> = Vec::new();
        for d in devs {
            match slots.iter_mut().find(|s| s.0 == d.dev_id) {
                Some(s) => s.1 = *d,
                None => slots.push((d.dev_id, *d, 0)),
            }
        }
        slots.reverse();
        let map = self.entries.read();
        for (id, size) in keys {
            let mut pick = 0;
            let mut min = usize::MAX;
            for (i, s) in slots.iter().enumerate() {
                if s.2 <= min {
                    pick = i;
                    min = s.2;
                }
            }
            if let Some(entry) = map.get(&id) {
                let mut m = entry.merge.lock();
                if m.is_none() {
                    let v = &entry.value;
                    *m = NDArray::zeros(v.shape().clone(), v.dtype(), slots[pick].1).ok();
                }
            }
            slots[pick].2 += size;
        }
        comm.ready = true;
    }

    /// Validates and copies init values onto the store's context.
    fn copies_of(vals: &[NDArray]) -> Result<Vec<NDArray>> {
        vals.iter()
            .map(|v| {
                check_value(v, "init")?;
                v.copy_to_ctx(Context::PINNED0)
            })
            .collect()
    }

    /// Init, optionally followed by a pull whose outputs are checked before
    /// anything is stored: all or nothing.
    fn init_then_pull(
        &self,
        keys: Keys<'_>,
        vals: &[NDArray],
        pull: Option<(Keys<'_>, &[NDArray])>,
    ) -> Result<()> {
        self.kind.check(keys.kind())?;
        if let Some((okeys, _)) = pull {
            self.kind.check(okeys.kind())?;
        }
        let copies = Self::copies_of(vals)?;
        let mut strs = self.strs.write();
        let mut map = self.entries.write();
        // The ids the new keys will get, checked for duplicates.
        let mut new: Vec<(i32, Arc<Entry>)> = Vec::with_capacity(copies.len());
        let mut seen: HashSet<i32> = HashSet::with_capacity(copies.len());
        let mut new_strs: HashMap<&[u8], i32> = HashMap::new();
        for (i, value) in copies.into_iter().enumerate() {
            let name = keys.show(i);
            let (id, str_key) = match keys {
                Keys::Int(k) => (k[i], None),
                Keys::Str(k) => {
                    if strs.get(k[i]).is_some() || new_strs.contains_key(k[i]) {
                        return Err(duplicate(&name));
                    }
                    let id = strs.next_id() + new_strs.len() as i32;
                    new_strs.insert(k[i], id);
                    (id, Some(k[i].to_vec()))
                }
            };
            if map.contains_key(&id) || !seen.insert(id) {
                return Err(duplicate(&name));
            }
            let entry = Entry {
                id,
                name,
                str_key,
                value,
                update: ReentrantMutex::new(()),
                merge: Mutex::new(None),
            };
            new.push((id, Arc::new(entry)));
        }
        let mut plan = Vec::new();
        if let Some((okeys, outs)) = pull {
            ensure!(
                okeys.len() == outs.len(),
                "{} keys for {} outputs",
                okeys.len(),
                outs.len()
            );
            for (i, out) in outs.iter().enumerate() {
                let id = match okeys {
                    Keys::Int(k) => k[i],
                    Keys::Str(k) => match new_strs.get(k[i]) {
                        Some(id) => *id,
                        None => strs.lookup(k[i])?,
                    },
                };
                let entry = new
                    .iter()
                    .find(|(nid, _)| *nid == id)
                    .map(|(_, e)| e.clone())
                    .or_else(|| map.get(&id).cloned())
                    .ok_or_else(|| not_inited(&okeys.show(i)))?;
                if check_output(&entry.value, out, true)? {
                    plan.push((entry, out));
                }
            }
        }
        if let Keys::Str(k) = keys {
            for s in k {
                strs.register(s);
            }
        }
        if self.device {
            let mut comm = self.comm.lock();
            comm.keys
                .extend(new.iter().map(|(id, e)| (*id, e.value.size())));
            comm.ready = false;
        }
        map.extend(new);
        drop(map);
        drop(strs);
        self.run_pull(&plan)
    }

    /// Checks one key's pushed values against its stored value.
    fn check_push_group(&self, entry: &Entry, vals: &[&NDArray]) -> Result<()> {
        let key = &entry.value;
        for v in vals {
            ensure!(
                v.shape() == key.shape(),
                "operands shape mismatch from.shape = {} to.shape={}: a value pushed for key {} must have the key's shape",
                v.shape(),
                key.shape(),
                entry.name
            );
        }
        ensure!(
            vals[0].dtype() == key.dtype(),
            "dtype mismatch: key {} holds {} but the first value pushed for it is {}",
            entry.name,
            key.dtype().name(),
            vals[0].dtype().name()
        );
        ensure!(
            vals.len() == 1 || key.dtype() != DType::Bool,
            "Unknown type enum 7: bool values of key {} cannot be summed",
            entry.name
        );
        Ok(())
    }

    /// Sums several values of one key into its merge buffer.
    fn merge(&self, entry: &Entry, vals: &[&NDArray]) -> Result<NDArray> {
        let key = &entry.value;
        if self.device {
            self.place_merge_buffers(&vals.iter().map(|v| v.ctx()).collect::<Vec<_>>());
        }
        let buf = {
            let mut m = entry.merge.lock();
            match &*m {
                Some(b) => b.clone(),
                None => {
                    let ctx = if self.device {
                        vals[0].ctx()
                    } else {
                        Context::PINNED0
                    };
                    let b = NDArray::zeros(key.shape().clone(), key.dtype(), ctx)?;
                    *m = Some(b.clone());
                    b
                }
            }
        };
        // Values of another dtype are converted first, as MXNet's copy
        // buffers do.
        let inputs = vals
            .iter()
            .map(|v| {
                if v.dtype() == key.dtype() {
                    Ok((*v).clone())
                } else {
                    let c = NDArray::zeros(key.shape().clone(), key.dtype(), v.ctx())?;
                    c.copy_from(v)?;
                    Ok(c)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        sum_into(&inputs, &buf, self.order())?;
        Ok(buf)
    }

    fn push_inner(&self, keys: Keys<'_>, vals: &[NDArray]) -> Result<()> {
        ensure!(
            keys.len() == vals.len(),
            "{} keys for {} values",
            keys.len(),
            vals.len()
        );
        for v in vals {
            check_value(v, "push")?;
        }
        let entries = self.entries_for(keys)?;
        let ids: Vec<i32> = match keys {
            Keys::Int(k) => k.to_vec(),
            Keys::Str(_) => {
                let strs = self.strs.read();
                (0..keys.len())
                    .map(|i| match keys {
                        Keys::Str(k) => strs.lookup(k[i]),
                        Keys::Int(_) => unreachable!(),
                    })
                    .collect::<Result<_>>()?
            }
        };
        let groups = group(&ids);
        let mut work = Vec::with_capacity(groups.len());
        for (id, pos) in groups {
            let entry = &entries[pos[0]];
            let group_vals: Vec<&NDArray> = pos.iter().map(|&p| &vals[p]).collect();
            self.check_push_group(entry, &group_vals)?;
            work.push((id, entry.clone(), group_vals));
        }
        let updater = self.updater.read().clone();
        for (id, entry, group_vals) in work {
            let _serial = entry.update.lock();
            let merged = if group_vals.len() == 1 {
                group_vals[0].clone()
            } else {
                self.merge(&entry, &group_vals)?
            };
            match &updater {
                Some(u) => u.update(id, entry.str_key.as_deref(), &merged, &entry.value),
                None => entry.value.copy_from(&merged)?,
            }
        }
        Ok(())
    }
}

impl KvStore for LocalStore {
    fn type_name(&self) -> &[u8] {
        &self.type_name
    }

    fn init(&self, keys: Keys<'_>, vals: &[NDArray]) -> Result<()> {
        ensure!(
            keys.len() == vals.len(),
            "{} keys for {} values",
            keys.len(),
            vals.len()
        );
        self.init_then_pull(keys, vals, None)
    }

    fn push(&self, keys: Keys<'_>, vals: &[NDArray], _priority: i32) -> Result<()> {
        self.kind.check(keys.kind())?;
        self.push_inner(keys, vals)
    }

    fn pull(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
        ignore_sparse: bool,
    ) -> Result<()> {
        self.kind.check(keys.kind())?;
        ensure!(
            keys.len() == outs.len(),
            "{} keys for {} outputs",
            keys.len(),
            outs.len()
        );
        let plan = self.plan_pull(self.entries_for(keys)?, outs, ignore_sparse)?;
        self.run_pull(&plan)
    }

    fn pull_row_sparse(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        row_ids: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        self.kind.check(keys.kind())?;
        ensure!(
            keys.len() == outs.len() && outs.len() == row_ids.len(),
            "{} keys, {} outputs and {} row id arrays: the counts must be equal",
            keys.len(),
            outs.len(),
            row_ids.len()
        );
        for (out, rows) in outs.iter().zip(row_ids) {
            ensure!(
                out.stype() == StorageType::RowSparse,
                "Check failed: val_stype == kRowSparseStorage ({} vs. 1) : Expected row_sparse storage type for row_sparse_pull values, but detected storage type {}",
                out.stype().code(),
                out.stype().code()
            );
            ensure!(
                rows.stype() == StorageType::Default,
                "Check failed: rowid_stype == kDefaultStorage ({} vs. 0) : Expected default storage type for row_sparse_pull rowids, but detected storage type {}",
                rows.stype().code(),
                rows.stype().code()
            );
        }
        self.entries_for(keys)?;
        bail!("row_sparse pull is not supported yet: this build stores dense values only")
    }

    fn push_pull(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        self.kind.check(vkeys.kind())?;
        self.kind.check(okeys.kind())?;
        ensure!(
            okeys.len() == outs.len(),
            "{} keys for {} outputs",
            okeys.len(),
            outs.len()
        );
        // Check the pull half first so that a bad output pushes nothing.
        let plan = self.plan_pull(self.entries_for(okeys)?, outs, true)?;
        self.push_inner(vkeys, vals)?;
        self.run_pull(&plan)
    }

    fn broadcast(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        ensure!(
            vkeys.len() == vals.len(),
            "{} keys for {} values",
            vkeys.len(),
            vals.len()
        );
        self.init_then_pull(vkeys, vals, Some((okeys, outs)))
    }

    fn set_updater(&self, updater: Option<Arc<dyn Updater>>) {
        *self.updater.write() = updater;
    }

    fn set_gradient_compression(&self, _params: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        bail!("gradient compression is not supported yet by this build")
    }
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs)]
mod tests {
    use super::*;
    use crate::ndarray::Shape;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn arr(v: &[f32]) -> NDArray {
        NDArray::from_bytes(
            Shape(vec![v.len() as i64]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(v),
        )
        .unwrap()
    }

    fn get(a: &NDArray) -> Vec<f32> {
        a.read().typed::<f32>().to_vec()
    }

    fn pull1(s: &LocalStore, k: i32, n: usize) -> Vec<f32> {
        let out = arr(&vec![0.0; n]);
        s.pull(Keys::Int(&[k]), &[out.clone()], 0, true).unwrap();
        get(&out)
    }

    #[test]
    fn init_push_pull_and_aggregation_orders() {
        for (device, want) in [(false, 1.0f32), (true, 0.0)] {
            let s = LocalStore::new(b"local".to_vec(), device);
            s.init(Keys::Int(&[3]), &[arr(&[2.0])]).unwrap();
            assert_eq!(pull1(&s, 3, 1), vec![2.0]);
            s.push(
                Keys::Int(&[3, 3, 3]),
                &[arr(&[1.0]), arr(&[1e8]), arr(&[-1e8])],
                0,
            )
            .unwrap();
            assert_eq!(pull1(&s, 3, 1), vec![want]);
        }
    }

    #[test]
    fn init_is_all_or_nothing_and_copies() {
        let s = LocalStore::new(b"local".to_vec(), false);
        let a = arr(&[1.0]);
        let e = s
            .init(
                Keys::Int(&[1, 2, 1]),
                &[a.clone(), arr(&[2.0]), arr(&[3.0])],
            )
            .unwrap_err();
        assert!(e.message().starts_with("duplicate init of key 1."));
        assert!(s.pull(Keys::Int(&[2]), &[arr(&[0.0])], 0, true).is_err());
        s.init(Keys::Int(&[1]), &[a.clone()]).unwrap();
        a.copy_from_bytes(bytemuck::cast_slice(&[9.0f32])).unwrap();
        assert_eq!(pull1(&s, 1, 1), vec![1.0]);
        // A single-value push copies too.
        let p = arr(&[5.0]);
        s.push(Keys::Int(&[1]), &[p.clone()], 0).unwrap();
        p.copy_from_bytes(bytemuck::cast_slice(&[6.0f32])).unwrap();
        assert_eq!(pull1(&s, 1, 1), vec![5.0]);
    }

    #[test]
    fn errors_keep_mxnet_wording() {
        let s = LocalStore::new(b"local".to_vec(), false);
        let e = s
            .pull(Keys::Int(&[99]), &[arr(&[0.0])], 0, true)
            .unwrap_err();
        assert_eq!(e.message(), "key 99 has not been inited");
        let e = s
            .push(Keys::Int(&[99, 99]), &[arr(&[0.0]), arr(&[1.0])], 0)
            .unwrap_err();
        assert_eq!(e.message(), "key 99 has not been inited");
        let e = s.init(Keys::Str(&[b"w"]), &[arr(&[0.0])]).unwrap_err();
        assert!(e.message().starts_with("Mixed key types are not allowed"));
        s.init(Keys::Int(&[3]), &[arr(&[0.0, 0.0, 0.0])]).unwrap();
        let e = s
            .pull(Keys::Int(&[3]), &[arr(&[0.0, 0.0])], 0, true)
            .unwrap_err();
        assert_eq!(
            e.message(),
            "operands shape mismatch from.shape = [3] to.shape=[2]"
        );
        let e = s.push(Keys::Int(&[3]), &[arr(&[0.0, 0.0])], 0).unwrap_err();
        assert!(e.message().contains("shape mismatch"));
        assert_eq!(pull1(&s, 3, 3), vec![0.0, 0.0, 0.0]);
    }

    #[test]
    fn string_keys_and_updater() {
        let s = LocalStore::new(b"local".to_vec(), false);
        s.init(Keys::Str(&[b"b", b"a"]), &[arr(&[1.0]), arr(&[2.0])])
            .unwrap();
        s.init(Keys::Str(&[b"c"]), &[arr(&[3.0])]).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        s.set_updater(Some(Arc::new(
            move |k: i32, sk: Option<&[u8]>, recv: &NDArray, local: &NDArray| {
                seen2.lock().push((k, sk.map(|v| v.to_vec())));
                let r = get(recv);
                let l = get(local);
                let n: Vec<f32> = l.iter().zip(&r).map(|(l, r)| l + 2.0 * r).collect();
                local.copy_from_bytes(bytemuck::cast_slice(&n)).unwrap();
            },
        )));
        s.push(
            Keys::Str(&[b"c", b"a", b"b", b"a"]),
            &vec![arr(&[1.0]); 4],
            0,
        )
        .unwrap();
        assert_eq!(
            *seen.lock(),
            vec![
                (0, Some(b"b".to_vec())),
                (1, Some(b"a".to_vec())),
                (2, Some(b"c".to_vec()))
            ]
        );
        let out = arr(&[0.0]);
        s.pull(Keys::Str(&[b"a"]), &[out.clone()], 0, true).unwrap();
        assert_eq!(get(&out), vec![6.0]);
        let e = s
            .push(Keys::Str(&[b"nope"]), &[arr(&[1.0])], 0)
            .unwrap_err();
        assert_eq!(e.message(), "key nope doesn't exist. Did you init?");
    }

    #[test]
    fn updater_may_call_back_into_the_store() {
        let s = Arc::new(LocalStore::new(b"local".to_vec(), false));
        s.init(Keys::Int(&[1]), &[arr(&[1.0])]).unwrap();
        let weak = Arc::downgrade(&s);
        s.set_updater(Some(Arc::new(
            move |k: i32, _: Option<&[u8]>, recv: &NDArray, local: &NDArray| {
                let s = weak.upgrade().unwrap();
                let out = arr(&[0.0]);
                s.pull(Keys::Int(&[k]), &[out.clone()], 0, true).unwrap();
                let v = get(&out)[0] + get(recv)[0];
                local.copy_from_bytes(bytemuck::cast_slice(&[v])).unwrap();
            },
        )));
        s.push(Keys::Int(&[1]), &[arr(&[2.0])], 0).unwrap();
        assert_eq!(pull1(&s, 1, 1), vec![3.0]);
    }

    #[test]
    fn eight_threads_give_exact_sums() {
        let s = Arc::new(LocalStore::new(b"local".to_vec(), false));
        s.init(Keys::Int(&[0, 1]), &[arr(&[0.0; 64]), arr(&[0.0; 64])])
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        s.set_updater(Some(Arc::new(
            move |_: i32, _: Option<&[u8]>, recv: &NDArray, local: &NDArray| {
                c2.fetch_add(1, Ordering::Relaxed);
                let n: Vec<f32> = get(local)
                    .iter()
                    .zip(get(recv))
                    .map(|(l, r)| l + r)
                    .collect();
                local.copy_from_bytes(bytemuck::cast_slice(&n)).unwrap();
            },
        )));
        std::thread::scope(|sc| {
            for _ in 0..8 {
                let s = s.clone();
                sc.spawn(move || {
                    for _ in 0..250 {
                        s.push(
                            Keys::Int(&[0, 1, 0]),
                            &[arr(&[1.0; 64]), arr(&[1.0; 64]), arr(&[1.0; 64])],
                            0,
                        )
                        .unwrap();
                        pull1(&s, 1, 64);
                    }
                });
            }
        });
        assert_eq!(pull1(&s, 0, 64), vec![4000.0; 64]);
        assert_eq!(pull1(&s, 1, 64), vec![2000.0; 64]);
        assert_eq!(calls.load(Ordering::Relaxed), 4000);
    }

    #[test]
    fn broadcast_is_all_or_nothing() {
        let s = LocalStore::new(b"local".to_vec(), false);
        let out = arr(&[0.0, 0.0]);
        let e = s
            .broadcast(
                Keys::Str(&[b"w"]),
                &[arr(&[4.0])],
                Keys::Str(&[b"w"]),
                &[out.clone()],
                0,
            )
            .unwrap_err();
        assert!(e.message().contains("shape mismatch"));
        let out = arr(&[0.0]);
        s.broadcast(
            Keys::Str(&[b"w"]),
            &[arr(&[4.0])],
            Keys::Str(&[b"w"]),
            &[out.clone()],
            0,
        )
        .unwrap();
        assert_eq!(get(&out), vec![4.0]);
    }
}
