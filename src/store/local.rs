//! The `local` and `device` stores: values live in this process, in a key
//! [`Table`]; pushes are grouped by key, reduced by the store's [`Comm`]
//! (MXNet's `CommCPU` or `CommDevice`), and applied by the updater (or
//! assigned). Every call checks all of its inputs before it changes
//! anything.
#![forbid(unsafe_code)]

use super::comm::{first_output, Comm};
use super::compression::CompressionParams;
use super::group::group;
use super::keys::Keys;
use super::table::{check_cast_copy, check_local_init_value, check_value, Entry, Table};
use super::{KvStore, Updater, UpdaterSlot};
use crate::error::Result;
use crate::ndarray::dtype::DType;
use crate::ndarray::sparse::{
    assign_row_sparse, retain_rows, row_ids as row_ids_of, share_row_sparse, Parts,
};
use crate::ndarray::{copy_to_many, Context, NDArray, Shape, StorageType};
use crate::{bail, ensure};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub struct LocalStore {
    type_name: Vec<u8>,
    comm: Comm,
    table: Table,
    updater: UpdaterSlot,
    warned_sparse_pull: Mutex<HashSet<i32>>,
}

/// What MXNet 1.9.1 copies a pull's output from: a storage type, dtype and
/// context (its copy checks depend on them; the data is the stored value's).
#[derive(Clone, Copy)]
struct Source {
    stype: StorageType,
    dtype: DType,
    ctx: Context,
}

impl Source {
    fn of(a: &NDArray) -> Source {
        Source {
            stype: a.stype(),
            dtype: a.dtype(),
            ctx: a.ctx(),
        }
    }
}

/// A key's stored value as a PushPull's pull will find it, after the push:
/// storage type and context, and on a `device` store whose merge buffers
/// the push places, the key's merge buffer context.
#[derive(Clone, Copy)]
struct After {
    stype: StorageType,
    ctx: Context,
    merge: Option<Context>,
}

/// Whether a pull skips `out` (a sparse output with `ignore_sparse`).
fn skipped(out: &NDArray, ignore_sparse: bool) -> bool {
    ignore_sparse && out.is_sparse()
}

/// Checks one copy of a pull from `src` (of the key's `shape` and element
/// count `size`) into `out`, which is not skipped. As MXNet's `CopyFromTo`,
/// a csr output takes a dense or csr value (cast_storage dense -> csr), a
/// row_sparse output a dense or row_sparse one; row_sparse <-> csr is
/// refused before anything is written, and so are the casts MXNet fails
/// (`check_cast_copy`).
fn check_output(src: Source, shape: &Shape, size: usize, out: &NDArray) -> Result<()> {
    match out.stype() {
        StorageType::Default | StorageType::RowSparse | StorageType::Csr => {
            let (from, to) = (src.stype, out.stype());
            ensure!(
                from == StorageType::Default || to == StorageType::Default || from == to,
                "Check failed: from_stype == kDefaultStorage || to_stype == kDefaultStorage || from_stype == to_stype: Copying ndarray of stype = {} to stype = {} is not supported",
                from.code(),
                to.code()
            );
            ensure!(
                out.shape() == shape,
                "operands shape mismatch from.shape = {} to.shape={}",
                shape,
                out.shape()
            );
            if from != to && size > 0 {
                check_cast_copy(src.stype, src.dtype, src.ctx, out)?;
            }
            Ok(())
        }
        StorageType::Undefined => {
            bail!("the output is an empty NDArray (MXNDArrayCreateNone); outputs must be allocated")
        }
    }
}

/// A row_sparse stored value as it was before an updater ran: its parts
/// and a copy of its indices (an updater may rewrite them in place through
/// an aux handle). Taken for every update of a row_sparse key: one read of
/// the indices before and one check after, nothing per data element.
struct RspSnapshot {
    parts: Parts,
    indices: Vec<i64>,
}

impl RspSnapshot {
    fn take(stored: &NDArray) -> Result<Option<RspSnapshot>> {
        if stored.stype() != StorageType::RowSparse {
            return Ok(None);
        }
        let parts = stored.parts()?;
        let indices = parts.aux[0].read().typed::<i64>().to_vec();
        Ok(Some(RspSnapshot { parts, indices }))
    }

    /// After the updater of `entry` returned: if it left the stored value
    /// invalid (indices unsorted, duplicated, out of range, or not one per
    /// data row), the value gets back its parts and indices from before the
    /// update, and the push fails. Rows the updater wrote in place into the
    /// old data part stay written (they are valid values).
    fn check_after_update(self, entry: &Entry, stored: &NDArray) -> Result<()> {
        if !entry.value().same(stored) {
            // A push from inside the updater replaced the value (it was
            // checked as pushed values are).
            return Ok(());
        }
        let Err(e) = stored.check_row_sparse() else {
            return Ok(());
        };
        {
            // Frozen (adopted) parts are never written in place, so only an
            // unfrozen index array can differ from the copy.
            let aux = &self.parts.aux[0];
            let changed = aux.read().typed::<i64>() != &self.indices[..];
            if changed {
                aux.write()
                    .typed_mut::<i64>()
                    .copy_from_slice(&self.indices);
            }
        }
        stored.restore_parts(self.parts);
        bail!(
            "the updater left the row_sparse value of key {} invalid ({}); the key keeps its indices from before the update",
            entry.name,
            e.message()
        )
    }
}

/// The keys of a PushPull whose outputs must wait for the pull that follows
/// every push of the call, instead of being written in a key's push pass:
/// the call's semantics are MXNet's, all pushes, then all pulls (in
/// ascending key order). An output that is a value pushed for another key
/// would be overwritten before that key's push reads it, and an output of
/// two keys would end with the value of whichever key wrote it last, not
/// that of the larger key. (A key's outputs that are its own values are
/// left to the fused kernels, which read every value before they write.)
/// `entries[i]` is the key of `vals[i]`.
fn outputs_not_to_fuse(
    entries: &[Arc<Entry>],
    vals: &[NDArray],
    pulls: &[(Arc<Entry>, &NDArray)],
) -> HashSet<i32> {
    let mut blocked = HashSet::new();
    if pulls.is_empty() {
        return blocked;
    }
    // the key of each array: Some(id) while it is used for one key only
    let mut pushed: HashMap<usize, Option<i32>> = HashMap::with_capacity(vals.len());
    for (e, v) in entries.iter().zip(vals) {
        let slot = pushed.entry(v.addr()).or_insert(Some(e.id));
        if *slot != Some(e.id) {
            *slot = None;
        }
    }
    let mut owner: HashMap<usize, Option<i32>> = HashMap::with_capacity(pulls.len());
    for (e, o) in pulls {
        let slot = owner.entry(o.addr()).or_insert(Some(e.id));
        if *slot != Some(e.id) {
            *slot = None;
        }
    }
    for (e, o) in pulls {
        let other_key_reads = matches!(pushed.get(&o.addr()), Some(k) if *k != Some(e.id));
        if other_key_reads || owner[&o.addr()].is_none() {
            blocked.insert(e.id);
        }
    }
    blocked
}

impl LocalStore {
    pub fn new(type_name: Vec<u8>, device: bool) -> LocalStore {
        crate::ndarray::kernels::init_pool();
        LocalStore {
            type_name,
            comm: Comm::new(device),
            table: Table::default(),
            updater: UpdaterSlot::default(),
            warned_sparse_pull: Mutex::new(HashSet::new()),
        }
    }

    /// Checks a pull of `outs` (`entries[i]` the key of `outs[i]`) and
    /// returns the (entry, output) pairs to write, in call order. `after`:
    /// what a PushPull's push changes before the pull reads (by key id);
    /// `ready`: whether a `device` store's merge buffers are placed when it
    /// reads.
    fn plan_pull<'o>(
        &self,
        entries: Vec<Arc<Entry>>,
        outs: &'o [NDArray],
        ignore_sparse: bool,
        after: &HashMap<i32, After>,
        ready: bool,
    ) -> Result<Vec<(Arc<Entry>, &'o NDArray)>> {
        if let ([entry], [out]) = (&entries[..], outs) {
            if skipped(out, ignore_sparse) {
                self.warn_sparse_pull(entry);
                return Ok(Vec::new());
            }
            self.check_key_outputs(entry, &[out], after.get(&entry.id), ready)?;
            return Ok(entries.into_iter().map(|e| (e, out)).collect());
        }
        let ids: Vec<i32> = entries.iter().map(|e| e.id).collect();
        let mut keep = vec![false; outs.len()];
        for (id, pos) in group(&ids) {
            let entry = &entries[pos[0]];
            let mut kept = Vec::with_capacity(pos.len());
            for p in pos {
                if skipped(&outs[p], ignore_sparse) {
                    self.warn_sparse_pull(entry);
                } else {
                    keep[p] = true;
                    kept.push(&outs[p]);
                }
            }
            self.check_key_outputs(entry, &kept, after.get(&id), ready)?;
        }
        Ok(entries
            .into_iter()
            .zip(outs)
            .zip(keep)
            .filter_map(|(pair, k)| k.then_some(pair))
            .collect())
    }

    /// Checks the copies of a pull of one key into its outputs `outs` (in
    /// the order MXNet groups them, skipped ones left out) as MXNet's
    /// `PullImpl` makes them: on `local` each from the stored value; on
    /// `device` through the key's merge buffer once the buffers are placed
    /// (`ready`), else into output `key % n` first and from it into the
    /// others (`CommDevice::Broadcast`). `after`: the stored value's storage
    /// type and context when the pull runs, if a push of the same call
    /// changes them.
    fn check_key_outputs(
        &self,
        entry: &Entry,
        outs: &[&NDArray],
        after: Option<&After>,
        ready: bool,
    ) -> Result<()> {
        if outs.is_empty() {
            return Ok(());
        }
        let stored = entry.value();
        let mut src = Source::of(&stored);
        if let Some(a) = after {
            (src.stype, src.ctx) = (a.stype, a.ctx);
        }
        let (shape, size) = (stored.shape(), stored.size());
        if !self.comm.is_device() {
            for o in outs {
                check_output(src, shape, size, o)?;
            }
            return Ok(());
        }
        if ready {
            ensure!(
                src.stype != StorageType::Csr,
                "Check failed: stype == kRowSparseStorage: unexpected storage type 2 (a device store whose merge buffers are placed pulls key {} through its merge buffer, which MXNet 1.9.1 has for dense and row_sparse values only)",
                entry.name
            );
            let merge = after
                .and_then(|a| a.merge)
                .or_else(|| entry.comm.placed())
                .unwrap_or(Context::PINNED0);
            let buf = Source { ctx: merge, ..src };
            for o in outs {
                check_output(buf, shape, size, o)?;
            }
            return Ok(());
        }
        let head = outs[first_output(entry.id, outs.len())];
        check_output(src, shape, size, head)?;
        for o in outs {
            if !o.same(head) {
                check_output(Source::of(head), shape, size, o)?;
            }
        }
        Ok(())
    }

    /// MXNet's warning for a skipped sparse output, once per key.
    fn warn_sparse_pull(&self, entry: &Entry) {
        if self.warned_sparse_pull.lock().insert(entry.id) {
            eprintln!("Warning: non-default weights detected during kvstore pull. This call has been ignored. Please make sure to use kv.row_sparse_pull() or module.prepare() with row_ids.");
        }
    }

    fn run_pull(&self, plan: &[(Arc<Entry>, &NDArray)]) -> Result<()> {
        if let [(entry, out)] = plan {
            return out.copy_from(&entry.value());
        }
        let ids: Vec<i32> = plan.iter().map(|(e, _)| e.id).collect();
        for (id, pos) in group(&ids) {
            let entry = &plan[pos[0]].0;
            let outs: Vec<&NDArray> = pos.iter().map(|&p| plan[p].1).collect();
            self.comm.broadcast(id, &entry.value(), &outs)?;
        }
        Ok(())
    }

    /// Validates and copies init values onto the store's context.
    fn copies_of(vals: &[NDArray]) -> Result<Vec<NDArray>> {
        vals.iter()
            .map(|v| {
                check_local_init_value(v)?;
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
        self.table.check_kind(keys.kind())?;
        if let Some((okeys, _)) = pull {
            self.table.check_kind(okeys.kind())?;
        }
        let copies = Self::copies_of(vals)?;
        let insert = self.table.begin_insert(keys, copies)?;
        let mut plan = Vec::new();
        if let Some((okeys, outs)) = pull {
            ensure!(
                okeys.len() == outs.len(),
                "{} keys for {} outputs",
                okeys.len(),
                outs.len()
            );
            let entries = (0..outs.len())
                .map(|i| insert.lookup(okeys, i))
                .collect::<Result<Vec<_>>>()?;
            // An init of new keys unplaces a device store's merge buffers.
            let ready = self.comm.is_ready() && insert.new_entries().next().is_none();
            plan = self.plan_pull(entries, outs, true, &HashMap::new(), ready)?;
        }
        self.comm.init(insert.new_entries().map(|e| &e.comm));
        insert.commit();
        self.run_pull(&plan)
    }

    /// Without an updater, a single pushed value is assigned; a PushPull's
    /// outputs of the key are written from the same read of the value when
    /// they hold the stored dtype (then the numbers are the same). Returns
    /// whether `outs` were written.
    fn assign(&self, entry: &Entry, val: &NDArray, outs: &[&NDArray]) -> Result<bool> {
        let stored = entry.value();
        let fused = !outs.is_empty()
            && !val.is_sparse()
            && stored.stype() == StorageType::Default
            && val.dtype() == stored.dtype()
            && outs.iter().all(|o| {
                o.stype() == StorageType::Default
                    && o.dtype() == stored.dtype()
                    && o.shape() == stored.shape()
            });
        if !fused {
            self.apply(entry, None, val)?;
            return Ok(false);
        }
        let targets: Vec<&NDArray> = [&stored].into_iter().chain(outs.iter().copied()).collect();
        copy_to_many(val, &targets)?;
        Ok(true)
    }

    /// Applies a key's merged value: the updater, or assignment (which
    /// adopts the merged value's storage type, as MXNet does). An updater's
    /// error fails the push.
    fn apply(
        &self,
        entry: &Entry,
        updater: Option<&Arc<dyn Updater>>,
        merged: &NDArray,
    ) -> Result<()> {
        let stored = entry.value();
        if let Some(u) = updater {
            let before = RspSnapshot::take(&stored)?;
            let updated = u.update(entry.id, entry.str_key.as_deref(), merged, &stored);
            let checked = match before {
                Some(before) => before.check_after_update(entry, &stored),
                None => Ok(()),
            };
            return updated.and(checked);
        }
        if stored.stype() == StorageType::RowSparse && merged.stype() == StorageType::RowSparse {
            return entry.comm.with_spare(|spare| {
                if share_row_sparse(merged, &stored, spare)? {
                    return Ok(());
                }
                assign_row_sparse(merged, &stored, spare)
            });
        }
        if stored.stype() == merged.stype() {
            return stored.copy_from(merged);
        }
        // MXNet: `local = merged.Copy(local.ctx())`.
        let replacement = match merged.stype() {
            StorageType::RowSparse => merged.copy_to_ctx(stored.ctx())?,
            _ => {
                let d = NDArray::zeros(stored.shape().clone(), merged.dtype(), stored.ctx())?;
                d.copy_from(merged)?;
                d
            }
        };
        *entry.value.lock() = replacement;
        Ok(())
    }

    /// Pushes; the outputs in `pulls` (a checked PushPull plan) that a push
    /// wrote in the same pass are removed from it.
    fn push_inner(
        &self,
        keys: Keys<'_>,
        vals: &[NDArray],
        pulls: &mut Vec<(Arc<Entry>, &NDArray)>,
    ) -> Result<()> {
        ensure!(
            keys.len() == vals.len(),
            "{} keys for {} values",
            keys.len(),
            vals.len()
        );
        for v in vals {
            check_value(v, "push")?;
        }
        let entries = self.table.entries_for(keys)?;
        let updater = self.updater.get();
        // Read once: the values are checked and reduced with the same setting.
        let gc = self.comm.compression();
        // The outputs of each key in `pulls`, found once (not once per key).
        let mut outs: HashMap<i32, Vec<&NDArray>> = HashMap::new();
        for (e, o) in pulls.iter() {
            outs.entry(e.id).or_default().push(*o);
        }
        for id in outputs_not_to_fuse(&entries, vals, pulls) {
            outs.remove(&id);
        }
        let outs_of = |id: i32| outs.get(&id).map_or(&[][..], |v| &v[..]);
        let mut written = HashSet::new();
        if let ([entry], [v]) = (&entries[..], vals) {
            // One key, one value: no grouping.
            self.comm.check_with(&entry.name, &entry.comm, &[v], gc)?;
            #[cfg(test)]
            tests::after_checks(self);
            if self.push_group(entry, &[v], updater.as_ref(), outs_of(entry.id), gc)? {
                written.insert(entry.id);
            }
            pulls.retain(|(e, _)| !written.contains(&e.id));
            return Ok(());
        }
        let ids: Vec<i32> = entries.iter().map(|e| e.id).collect();
        let groups = group(&ids);
        let mut work = Vec::with_capacity(groups.len());
        for (_, pos) in groups {
            let entry = &entries[pos[0]];
            let group_vals: Vec<&NDArray> = pos.iter().map(|&p| &vals[p]).collect();
            self.comm
                .check_with(&entry.name, &entry.comm, &group_vals, gc)?;
            work.push((entry, group_vals));
        }
        #[cfg(test)]
        tests::after_checks(self);
        for (entry, group_vals) in work {
            if self.push_group(entry, &group_vals, updater.as_ref(), outs_of(entry.id), gc)? {
                written.insert(entry.id);
            }
        }
        pulls.retain(|(e, _)| !written.contains(&e.id));
        Ok(())
    }

    /// Reduces and applies one key's (checked) values; writes the key's
    /// pull outputs `outs` too when that costs no extra pass, and then
    /// returns true. `gc`: the compression the values were checked against.
    fn push_group(
        &self,
        entry: &Arc<Entry>,
        vals: &[&NDArray],
        updater: Option<&Arc<dyn Updater>>,
        outs: &[&NDArray],
        gc: Option<CompressionParams>,
    ) -> Result<bool> {
        let _serial = entry.update.lock();
        if updater.is_none() {
            // The merged value replaces the stored one: MXNet stores the
            // merged value itself when the storage type stays, so the value
            // moves to the merged value's context (a copy when it differs;
            // the same context again on later pushes), else a copy of it on
            // the stored value's context (`apply`).
            let stored = entry.value();
            if self.merged_stype(vals, gc) == stored.stype() {
                let ctx = self.merged_ctx(entry, vals, gc);
                if ctx != stored.ctx() {
                    *entry.value.lock() = stored.copy_to_ctx(ctx)?;
                }
            }
            return self.assign_merged(entry, vals, outs, gc);
        }
        let merged = self.comm.reduce(&entry.comm, vals, gc)?;
        self.apply(entry, updater, &merged)?;
        Ok(false)
    }

    /// The storage type of a key's merged value.
    fn merged_stype(&self, vals: &[&NDArray], gc: Option<CompressionParams>) -> StorageType {
        if gc.is_some() {
            StorageType::Default
        } else {
            vals[0].stype()
        }
    }

    /// The context of a key's merged value in MXNet 1.9.1: the pushed
    /// value itself for one dense value (`CommCPU::Reduce`) or any one
    /// uncompressed value (`CommDevice::Reduce`); else the merge buffer, on
    /// `cpu_pinned(0)` on `local` and on the context the placement gave the
    /// key on `device`.
    fn merged_ctx(
        &self,
        entry: &Entry,
        vals: &[&NDArray],
        gc: Option<CompressionParams>,
    ) -> Context {
        let one = vals.len() == 1 && gc.is_none();
        if self.comm.is_device() {
            if one {
                return vals[0].ctx();
            }
            if let Some(ctx) = entry.comm.placed() {
                return ctx;
            }
            let devs: Vec<Context> = vals.iter().map(|v| v.ctx()).collect();
            return self.comm.peek_merge_ctx(&entry.comm, &devs);
        }
        if one && vals[0].stype() == StorageType::Default {
            vals[0].ctx()
        } else {
            Context::PINNED0
        }
    }

    /// What a PushPull's push of `vals` makes of the keys its pull reads
    /// (`pulled`), by key id: without an updater the pushed keys' storage
    /// type and context (an updater keeps them), and on a `device` store
    /// whose merge buffers the push places, every pulled key's merge buffer
    /// context; and whether the buffers are placed then. Empty when no
    /// check can depend on it: copies of dense values into dense outputs (a
    /// PushPull's pull skips sparse outputs) never fail.
    fn after_push(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        pulled: &[Arc<Entry>],
    ) -> Result<(HashMap<i32, After>, bool)> {
        let mut after = HashMap::new();
        let ready = self.comm.is_ready();
        let sparse_now = pulled.iter().any(|e| e.value().is_sparse());
        let sparse_pushed = vals.iter().any(|v| v.is_sparse());
        if !(sparse_now || sparse_pushed) {
            return Ok((after, ready));
        }
        let updater = self.updater.get().is_some();
        ensure!(
            vkeys.len() == vals.len(),
            "{} keys for {} values",
            vkeys.len(),
            vals.len()
        );
        let gc = self.comm.compression();
        let entries = self.table.entries_for(vkeys)?;
        let ids: Vec<i32> = entries.iter().map(|e| e.id).collect();
        let groups = group(&ids);
        // MXNet places a device store's merge buffers at the first reduce
        // that uses them, with the contexts of that key's values.
        let places = if ready || !self.comm.is_device() {
            None
        } else {
            groups
                .iter()
                .find(|(_, pos)| pos.len() > 1 || gc.is_some())
                .map(|(_, pos)| pos.iter().map(|&p| vals[p].ctx()).collect::<Vec<_>>())
        };
        for (id, pos) in groups.iter().filter(|_| !updater) {
            let entry = &entries[pos[0]];
            let group_vals: Vec<&NDArray> = pos.iter().map(|&p| &vals[p]).collect();
            let stype = self.merged_stype(&group_vals, gc);
            let ctx = if stype == entry.value().stype() {
                match (&places, group_vals.len() > 1 || gc.is_some()) {
                    (Some(devs), true) => self.comm.peek_merge_ctx(&entry.comm, devs),
                    _ => self.merged_ctx(entry, &group_vals, gc),
                }
            } else {
                entry.value().ctx()
            };
            after.insert(
                *id,
                After {
                    stype,
                    ctx,
                    merge: None,
                },
            );
        }
        if let Some(devs) = &places {
            for e in pulled {
                let merge = self.comm.peek_merge_ctx(&e.comm, devs);
                let stored = e.value();
                after
                    .entry(e.id)
                    .or_insert(After {
                        stype: stored.stype(),
                        ctx: stored.ctx(),
                        merge: None,
                    })
                    .merge = Some(merge);
            }
        }
        Ok((after, ready || places.is_some()))
    }

    /// Without an updater: reduces one key's (checked) values and assigns
    /// the result. Returns whether `outs` were written too.
    fn assign_merged(
        &self,
        entry: &Arc<Entry>,
        vals: &[&NDArray],
        outs: &[&NDArray],
        gc: Option<CompressionParams>,
    ) -> Result<bool> {
        let wrote = if vals.len() == 1 && gc.is_none() {
            // Assign straight from the pushed value: no merge copy.
            Some(self.assign(entry, vals[0], outs)?)
        } else {
            // Without an updater, a multi-value push is summed straight
            // into the stored value.
            self.comm
                .reduce_into(&entry.comm, vals, &entry.value(), outs, gc)?
        };
        if let Some(wrote) = wrote {
            return Ok(wrote);
        }
        let merged = self.comm.reduce(&entry.comm, vals, gc)?;
        self.apply(entry, None, &merged)?;
        Ok(false)
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
        self.table.check_kind(keys.kind())?;
        self.push_inner(keys, vals, &mut Vec::new())
    }

    fn pull(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
        ignore_sparse: bool,
    ) -> Result<()> {
        self.table.check_kind(keys.kind())?;
        ensure!(
            keys.len() == outs.len(),
            "{} keys for {} outputs",
            keys.len(),
            outs.len()
        );
        let plan = self.plan_pull(
            self.table.entries_for(keys)?,
            outs,
            ignore_sparse,
            &HashMap::new(),
            self.comm.is_ready(),
        )?;
        self.run_pull(&plan)
    }

    fn pull_row_sparse(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        row_ids: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        self.table.check_kind(keys.kind())?;
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
        let entries = self.table.entries_for(keys)?;
        // Check everything before writing any output.
        let mut plan = Vec::with_capacity(outs.len());
        for ((entry, out), rows) in entries.iter().zip(outs).zip(row_ids) {
            let stored = entry.value();
            ensure!(
                stored.stype() == StorageType::RowSparse,
                "Check failed: local.storage_type() == kRowSparseStorage ({} vs. 1) : PullRowSparse expects row_sparse src NDArray (key {})",
                stored.stype().code(),
                entry.name
            );
            ensure!(
                out.shape() == stored.shape(),
                "operands shape mismatch from.shape = {} to.shape={}",
                stored.shape(),
                out.shape()
            );
            let ids = row_ids_of(rows, stored.shape().dims()[0])
                .map_err(|e| crate::error::Error::new(format!("{e} (key {})", entry.name)))?;
            plan.push((entry, out, ids));
        }
        // Written key by key in ascending order (and a key's outputs in the
        // order MXNet groups them), as MXNet's PullRowSparseImpl writes
        // them: an output given for two keys ends with the larger key's rows.
        let ids: Vec<i32> = plan.iter().map(|(entry, _, _)| entry.id).collect();
        for (_, pos) in group(&ids) {
            for p in pos {
                let (entry, out, ids) = &plan[p];
                retain_rows(&entry.value(), ids, out)?;
            }
        }
        Ok(())
    }

    fn push_pull(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        self.table.check_kind(vkeys.kind())?;
        self.table.check_kind(okeys.kind())?;
        ensure!(
            okeys.len() == outs.len(),
            "{} keys for {} outputs",
            okeys.len(),
            outs.len()
        );
        // Check the pull half first so that a bad output pushes nothing,
        // against the stored values as the push leaves them.
        let pulled = self.table.entries_for(okeys)?;
        let (after, ready) = self.after_push(vkeys, vals, &pulled)?;
        let mut plan = self.plan_pull(pulled, outs, true, &after, ready)?;
        self.push_inner(vkeys, vals, &mut plan)?;
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
        self.updater.set(updater);
    }

    fn set_gradient_compression(&self, params: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let parsed = CompressionParams::parse(params)?;
        self.comm.set_compression(parsed);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs)]
mod tests {
    use super::*;
    use crate::ndarray::dtype::DType;
    use crate::ndarray::Shape;
    use crate::test_util::{f32s as arr, values as get};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn pull1(s: &LocalStore, k: i32, n: usize) -> Vec<f32> {
        let out = arr(&vec![0.0; n]);
        s.pull(Keys::Int(&[k]), &[out.clone()], 0, true).unwrap();
        get(&out)
    }

    #[test]
    fn the_stored_value_moves_to_the_merged_values_context() {
        // MXNet stores the merged value itself: the pushed array (one dense
        // value; on device any one value) or the merge buffer.
        let cpu1 = Context::new(1, 1).unwrap();
        let on = |ctx: Context, v: f32| {
            let a = NDArray::zeros(Shape(vec![2]), DType::F32, ctx).unwrap();
            a.copy_from_bytes(bytemuck::cast_slice(&[v, v])).unwrap();
            a
        };
        for device in [false, true] {
            let s = LocalStore::new(b"local".to_vec(), device);
            s.init(Keys::Int(&[1]), &[arr(&[0.0, 0.0])]).unwrap();
            let entry = s.table.entries_for(Keys::Int(&[1])).unwrap().remove(0);
            assert_eq!(entry.value().ctx(), Context::PINNED0);
            s.push(Keys::Int(&[1]), &[on(cpu1, 2.0)], 0).unwrap();
            assert_eq!(entry.value().ctx(), cpu1, "device {device}");
            let before = entry.value();
            s.push(Keys::Int(&[1]), &[on(cpu1, 3.0)], 0).unwrap();
            assert!(entry.value().same(&before), "written in place");
            s.push(
                Keys::Int(&[1, 1]),
                &[on(cpu1, 1.0), on(Context::CPU0, 4.0)],
                0,
            )
            .unwrap();
            let merge = if device {
                entry.comm.placed().unwrap()
            } else {
                Context::PINNED0
            };
            assert_eq!(entry.value().ctx(), merge, "device {device}");
            assert_eq!(pull1(&s, 1, 2), vec![5.0, 5.0]);
        }
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
    fn push_pull_in_one_pass_equals_push_then_pull() {
        // Values whose sum depends on the order, large enough to run in
        // parallel; outputs fused, aliasing an input, of another dtype, and
        // keys pushed without being pulled.
        let n = (1 << 17) + 3;
        let vals = |k: usize, salt: f32| -> Vec<NDArray> {
            (0..k)
                .map(|j| {
                    let v: Vec<f32> = (0..n)
                        .map(|i| [1e8f32, 1.0, -1e8, 0.5, -0.0][(i + j) % 5] * (1.0 + salt))
                        .collect();
                    arr(&v)
                })
                .collect()
        };
        for device in [false, true] {
            for k in [1, 2, 3, 6] {
                let (a, b) = (
                    LocalStore::new(b"local".to_vec(), device),
                    LocalStore::new(b"local".to_vec(), device),
                );
                for s in [&a, &b] {
                    s.init(
                        Keys::Int(&[1, 2]),
                        &[arr(&vec![0.0; n]), arr(&vec![0.0; n])],
                    )
                    .unwrap();
                }
                for round in 0..2 {
                    let v1 = vals(k, round as f32);
                    let v2 = vals(2, 0.25);
                    let mut keys = vec![1; k];
                    keys.extend([2, 2]);
                    let all: Vec<NDArray> = v1.iter().chain(&v2).cloned().collect();
                    // Reference: push, then pull.
                    a.push(Keys::Int(&keys), &all, 0).unwrap();
                    let want1 = pull1(&a, 1, n);
                    let want2 = pull1(&a, 2, n);
                    // PushPull into two outputs of key 1 (in round 1 one of
                    // them is the first input), one of key 2 in float64.
                    let o1 = arr(&vec![0.0; n]);
                    let alias = k > 1 && round == 1;
                    let o1b = arr(&vec![0.0; n]);
                    let o2 =
                        NDArray::zeros(Shape(vec![n as i64]), DType::F64, Context::CPU0).unwrap();
                    let mut all_b: Vec<NDArray> = vals(k, round as f32)
                        .into_iter()
                        .chain(vals(2, 0.25))
                        .collect();
                    if alias {
                        // An output that is an input: the fused sum refuses it.
                        o1b.copy_from(&all_b[0]).unwrap();
                        all_b[0] = o1b.clone();
                    }
                    b.push_pull(
                        Keys::Int(&keys),
                        &all_b,
                        Keys::Int(&[1, 2, 1]),
                        &[o1.clone(), o2.clone(), o1b.clone()],
                        0,
                    )
                    .unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&get(&o1)), bits(&want1), "device {device} k {k}");
                    assert_eq!(bits(&get(&o1b)), bits(&want1), "device {device} k {k}");
                    assert_eq!(bits(&pull1(&b, 1, n)), bits(&want1));
                    assert_eq!(bits(&pull1(&b, 2, n)), bits(&want2));
                    let o2: Vec<f32> = o2.to_f64_vec().iter().map(|&x| x as f32).collect();
                    assert_eq!(bits(&o2), bits(&want2));
                }
            }
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
                Ok(())
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
    fn an_updaters_error_fails_the_push_that_ran_it() {
        let s = LocalStore::new(b"local".to_vec(), false);
        s.init(
            Keys::Int(&[1, 2]),
            &[arr(&[1.0]), rsp_value(&[4, 1], &[1], &[5.0])],
        )
        .unwrap();
        s.set_updater(Some(Arc::new(
            |k: i32, _: Option<&[u8]>, _: &NDArray, local: &NDArray| -> Result<()> {
                if k == 2 {
                    // breaks the indices, then fails
                    let aux = local.private_parts()?.aux[0].clone();
                    aux.copy_from_bytes(bytemuck::cast_slice(&[9i64]))?;
                }
                Err(crate::error::Error::new(format!(
                    "optimizer failed on key {k}"
                )))
            },
        )));
        let e = s
            .push(Keys::Int(&[1, 1]), &[arr(&[1.0]), arr(&[2.0])], 0)
            .unwrap_err();
        assert_eq!(e.message(), "optimizer failed on key 1");
        assert_eq!(pull1(&s, 1, 1), vec![1.0]);
        let e = s
            .push(Keys::Int(&[2]), &[rsp_value(&[4, 1], &[0], &[1.0])], 0)
            .unwrap_err();
        assert_eq!(e.message(), "optimizer failed on key 2");
        let stored = s.table.entries_for(Keys::Int(&[2])).unwrap()[0].value();
        assert_eq!(stored.rsp_indices().unwrap(), vec![1]);
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
                Ok(())
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
                Ok(())
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

    /// Runs `f` on another thread and waits at most `secs` for it: a test of
    /// a former deadlock or of former O(rows) work fails instead of hanging.
    fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(secs))
            .expect("the operation did not return")
    }

    fn rsp_value(shape: &[i64], idx: &[i64], data: &[f32]) -> NDArray {
        let mut rows = shape.to_vec();
        rows[0] = idx.len() as i64;
        let d = NDArray::from_bytes(
            Shape(rows),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(data),
        )
        .unwrap();
        NDArray::row_sparse(Shape(shape.to_vec()), Context::CPU0, d, idx).unwrap()
    }

    fn rsp_empty(shape: &[i64]) -> NDArray {
        NDArray::sparse_zeros(
            StorageType::RowSparse,
            Shape(shape.to_vec()),
            DType::F32,
            Context::CPU0,
            &[DType::I64],
            &[Shape(vec![0])],
        )
        .unwrap()
    }

    fn dense_zeros(shape: &[i64]) -> NDArray {
        NDArray::zeros(Shape(shape.to_vec()), DType::F32, Context::CPU0).unwrap()
    }

    #[test]
    fn an_updater_may_pull_its_key_into_the_parts_of_local() {
        for device in [false, true] {
            let s = Arc::new(LocalStore::new(b"local".to_vec(), device));
            // All rows stored, so the data part has the key's shape.
            s.init(
                Keys::Int(&[4]),
                &[rsp_value(&[2, 2], &[0, 1], &[1., 2., 3., 4.])],
            )
            .unwrap();
            let weak = Arc::downgrade(&s);
            let seen = Arc::new(Mutex::new(Vec::new()));
            let seen2 = seen.clone();
            s.set_updater(Some(Arc::new(
                move |k: i32, _: Option<&[u8]>, recv: &NDArray, local: &NDArray| {
                    let s = weak.upgrade().unwrap();
                    let data = local.private_parts().unwrap().data;
                    // The pull reads the key (local itself) into local's data.
                    s.pull(Keys::Int(&[k]), &[data.clone()], 0, true).unwrap();
                    seen2.lock().push(get(&data));
                    // and into local itself (a no-op), by row ids too
                    s.pull(Keys::Int(&[k]), &[local.clone()], 0, true).unwrap();
                    let ids = arr(&[1.0]);
                    let out = rsp_empty(&[2, 2]);
                    s.pull_row_sparse(Keys::Int(&[k]), &[out.clone()], &[ids], 0)
                        .unwrap();
                    local.copy_from(recv).unwrap();
                    Ok(())
                },
            )));
            let s2 = s.clone();
            within(20, move || {
                for v in [5., 6.] {
                    s2.push(Keys::Int(&[4]), &[rsp_value(&[2, 2], &[0, 1], &[v; 4])], 0)
                        .unwrap();
                }
            });
            assert_eq!(*seen.lock(), vec![vec![1., 2., 3., 4.], vec![5.; 4]]);
            let out = dense_zeros(&[2, 2]);
            s.pull(Keys::Int(&[4]), &[out.clone()], 0, true).unwrap();
            assert_eq!(get(&out), vec![6.; 4]);
        }
    }

    #[test]
    fn keys_of_empty_rows_cost_what_their_bytes_cost() {
        // [2^40, 0]: no bytes at all; this took many minutes (every row
        // visited when a dense value was turned into row_sparse).
        for device in [false, true] {
            let s = Arc::new(LocalStore::new(b"local".to_vec(), device));
            let sh = [1i64 << 40, 0];
            let s2 = s.clone();
            let (pulled, rows) = within(60, move || {
                let s = s2;
                s.init(Keys::Int(&[1, 2]), &[dense_zeros(&sh), rsp_empty(&sh)])
                    .unwrap();
                // dense key: one value, two values, a row_sparse one among them
                s.push(Keys::Int(&[1]), &[dense_zeros(&sh)], 0).unwrap();
                s.push(Keys::Int(&[1, 1]), &[dense_zeros(&sh), dense_zeros(&sh)], 0)
                    .unwrap();
                s.push(Keys::Int(&[1, 1]), &[dense_zeros(&sh), rsp_empty(&sh)], 0)
                    .unwrap();
                let out = dense_zeros(&sh);
                s.pull(Keys::Int(&[1]), &[out.clone()], 0, true).unwrap();
                // row_sparse key: rows of width 0 are stored as indices
                let a = rsp_value(&sh, &[0, 7], &[]);
                let b = rsp_value(&sh, &[7, 1 << 39], &[]);
                s.push(Keys::Int(&[2, 2]), &[a, b], 0).unwrap();
                s.push(
                    Keys::Int(&[2, 2]),
                    &[rsp_value(&sh, &[3], &[]), dense_zeros(&sh)],
                    0,
                )
                .unwrap();
                let stored = s.table.entries_for(Keys::Int(&[2])).unwrap()[0].value();
                let rows = stored.rsp_indices().unwrap();
                let out2 = dense_zeros(&sh);
                s.pull(Keys::Int(&[2]), &[out2.clone()], 0, true).unwrap();
                let pulled = rsp_empty(&sh);
                let ids = NDArray::from_bytes(
                    Shape(vec![2]),
                    DType::I64,
                    Context::CPU0,
                    bytemuck::cast_slice(&[9i64, 3]),
                )
                .unwrap();
                s.pull_row_sparse(Keys::Int(&[2]), &[pulled.clone()], &[ids], 0)
                    .unwrap();
                (pulled.rsp_indices().unwrap(), rows)
            });
            assert_eq!(rows, vec![3], "device {device}");
            assert_eq!(pulled, vec![3, 9], "device {device}");
        }
    }

    #[test]
    fn pull_row_sparse_of_rows_too_large_for_memory_is_no_panic() {
        // [6, 2^62] with no rows stored: a row of 2^64 bytes (its size
        // wrapped to 0 and `chunks_mut(0)` panicked).
        for device in [false, true] {
            let s = LocalStore::new(b"local".to_vec(), device);
            let sh = [6i64, 1 << 62];
            s.init(Keys::Int(&[0]), &[rsp_empty(&sh)]).unwrap();
            let out = rsp_empty(&sh);
            let ids = arr(&[0.0, 5.0]);
            s.pull_row_sparse(Keys::Int(&[0]), &[out.clone()], &[ids], 0)
                .unwrap();
            assert!(out.rsp_indices().unwrap().is_empty());
            s.push(Keys::Int(&[0, 0]), &[rsp_empty(&sh), rsp_empty(&sh)], 0)
                .unwrap();
            s.push(Keys::Int(&[0]), &[rsp_empty(&sh)], 0).unwrap();
            s.pull(Keys::Int(&[0]), &[rsp_empty(&sh)], 0, false)
                .unwrap();
            // A dense output of that shape cannot even be made.
            assert!(NDArray::zeros(Shape(sh.to_vec()), DType::F32, Context::CPU0).is_err());
        }
    }

    #[test]
    fn an_updater_that_breaks_the_indices_fails_the_push_and_they_are_restored() {
        let s = LocalStore::new(b"local".to_vec(), false);
        s.init(
            Keys::Int(&[9]),
            &[rsp_value(&[6, 2], &[1, 3], &[1., 1., 3., 3.])],
        )
        .unwrap();
        let mode = Arc::new(AtomicUsize::new(0));
        let m2 = mode.clone();
        let i64s = |v: &[i64]| {
            NDArray::from_bytes(
                Shape(vec![v.len() as i64]),
                DType::I64,
                Context::CPU0,
                bytemuck::cast_slice(v),
            )
            .unwrap()
        };
        s.set_updater(Some(Arc::new(
            move |_: i32, _: Option<&[u8]>, recv: &NDArray, local: &NDArray| {
                let aux = local.private_parts().unwrap().aux[0].clone();
                let write = |v: [i64; 2]| aux.copy_from_bytes(bytemuck::cast_slice(&v)).unwrap();
                match m2.load(Ordering::SeqCst) {
                    0 => write([3, 1]), // unsorted
                    1 => write([1, 1]), // duplicated
                    2 => write([1, 6]), // out of range
                    3 => write([-1, 1]),
                    // three indices for two data rows (parts replaced)
                    4 => local.set_part(0, &i64s(&[0, 1, 2])).unwrap(),
                    // valid: assign
                    _ => local.copy_from(recv).unwrap(),
                }
                Ok(())
            },
        )));
        let stored = || {
            let v = s.table.entries_for(Keys::Int(&[9])).unwrap()[0].value();
            let d = dense_zeros(&[6, 2]);
            d.copy_from(&v).unwrap();
            (v.rsp_indices().unwrap(), get(&d))
        };
        let before = stored();
        for m in 0..5 {
            mode.store(m, Ordering::SeqCst);
            let e = s
                .push(Keys::Int(&[9]), &[rsp_value(&[6, 2], &[0], &[7., 7.])], 0)
                .unwrap_err();
            assert!(
                e.message()
                    .starts_with("the updater left the row_sparse value of key 9 invalid ("),
                "mode {m}: {}",
                e.message()
            );
            assert_eq!(stored(), before, "mode {m}");
        }
        mode.store(5, Ordering::SeqCst);
        s.push(Keys::Int(&[9]), &[rsp_value(&[6, 2], &[0], &[7., 7.])], 0)
            .unwrap();
        assert_eq!(stored().0, vec![0]);
    }

    thread_local! {
        /// Run by the next push on this thread once its values are checked.
        static AFTER_CHECKS: std::cell::Cell<Option<fn(&LocalStore)>> =
            const { std::cell::Cell::new(None) };
    }

    /// Called by `push_inner` between the checks and the reduce.
    pub(super) fn after_checks(store: &LocalStore) {
        if let Some(f) = AFTER_CHECKS.with(|h| h.take()) {
            f(store)
        }
    }

    #[test]
    fn compression_set_during_a_push_does_not_reach_its_values() {
        // Another thread switches 2-bit compression on after a push of int32
        // values passed its checks (which refuse int32 only when compressed):
        // the push goes on uncompressed, as checked, and the next is refused.
        fn switch_on(s: &LocalStore) {
            let p = [("type", "2bit"), ("threshold", "0.5")];
            let p: Vec<_> = p
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect();
            s.set_gradient_compression(&p).unwrap();
        }
        let i32s = |v: i32| {
            let b = [v; 4];
            NDArray::from_bytes(
                Shape(vec![4]),
                DType::I32,
                Context::CPU0,
                bytemuck::cast_slice(&b),
            )
            .unwrap()
        };
        let ints = |a: &NDArray| a.read().typed::<i32>().to_vec();
        for updater in [false, true] {
            for n in [1usize, 2] {
                let s = LocalStore::new(b"device".to_vec(), true);
                s.init(Keys::Int(&[0]), &[i32s(0)]).unwrap();
                let seen = Arc::new(Mutex::new(Vec::new()));
                if updater {
                    let seen = seen.clone();
                    s.set_updater(Some(Arc::new(
                        move |_: i32, _: Option<&[u8]>, recv: &NDArray, local: &NDArray| {
                            seen.lock().push(recv.dtype());
                            local.copy_from(recv)
                        },
                    )));
                }
                AFTER_CHECKS.with(|h| h.set(Some(switch_on)));
                s.push(Keys::Int(&vec![0; n]), &vec![i32s(3); n], 0)
                    .unwrap();
                assert!(AFTER_CHECKS.with(|h| h.get()).is_none(), "the hook ran");
                let out = i32s(-7);
                s.pull(Keys::Int(&[0]), &[out.clone()], 0, true).unwrap();
                let what = format!("updater {updater}, {n} values");
                assert_eq!(ints(&out), vec![3 * n as i32; 4], "{what}");
                let want_seen = if updater { vec![DType::I32] } else { vec![] };
                assert_eq!(*seen.lock(), want_seen, "{what}");
                let e = s.push(Keys::Int(&[0]), &[i32s(3)], 0).unwrap_err();
                assert!(
                    e.message()
                        .contains("Gradient compression is only supported for float32"),
                    "{what}: {}",
                    e.message()
                );
            }
        }
    }

    /// A 3x3 float32 csr array with the given parts.
    fn csr3(data: &[f32], indptr: &[i64], indices: &[i64]) -> NDArray {
        let c = NDArray::sparse_zeros(
            StorageType::Csr,
            Shape(vec![3, 3]),
            DType::F32,
            Context::CPU0,
            &[DType::I64, DType::I64],
            &[Shape(vec![0]), Shape(vec![0])],
        )
        .unwrap();
        let ints = |v: &[i64]| {
            NDArray::from_bytes(
                Shape(vec![v.len() as i64]),
                DType::I64,
                Context::CPU0,
                bytemuck::cast_slice(v),
            )
            .unwrap()
        };
        c.set_part(-1, &arr(data)).unwrap();
        c.set_part(0, &ints(indptr)).unwrap();
        c.set_part(1, &ints(indices)).unwrap();
        c
    }

    #[test]
    fn csr_values_init_pull_and_replace() {
        let dense3 = |v: &[f32]| {
            let d = NDArray::zeros(Shape(vec![3, 3]), DType::F32, Context::CPU0).unwrap();
            d.copy_from_bytes(bytemuck::cast_slice(v)).unwrap();
            d
        };
        for device in [false, true] {
            let s = LocalStore::new(b"local".to_vec(), device);
            let c = csr3(&[1.5, 2., -3.], &[0, 1, 1, 3], &[1, 0, 2]);
            s.init(Keys::Int(&[0]), &[c.clone()]).unwrap();
            // the store keeps a copy
            c.set_part(-1, &arr(&[9., 9., 9.])).unwrap();
            let want = [0., 1.5, 0., 0., 0., 0., 2., 0., -3.];
            let out = dense3(&[7.; 9]);
            s.pull(Keys::Int(&[0]), &[out.clone()], 0, true).unwrap();
            assert_eq!(get(&out), want);
            let cout = csr3(&[], &[0, 0, 0, 0], &[]);
            s.pull(Keys::Int(&[0]), &[cout.clone()], 0, false).unwrap();
            assert_eq!(get(&cout.parts().unwrap().data), [1.5, 2., -3.]);
            // csr pushes are refused, the value stays
            let e = s.push(Keys::Int(&[0]), &[c.clone()], 0).unwrap_err();
            assert!(e
                .message()
                .starts_with("Unexpected storage type detected during kvstore push: 2"));
            s.pull(Keys::Int(&[0]), &[out.clone()], 0, true).unwrap();
            assert_eq!(get(&out), want);
            // a row_sparse output of a csr value is refused before any
            // output is written; a device store whose merge buffers are not
            // placed copies into output `0 % 2` first and from that dense
            // one into the row_sparse one, as MXNet's does
            let first = dense3(&[7.; 9]);
            let rsp = NDArray::sparse_zeros(
                StorageType::RowSparse,
                Shape(vec![3, 3]),
                DType::F32,
                Context::CPU0,
                &[DType::I64],
                &[Shape(vec![0])],
            )
            .unwrap();
            let pulled = s.pull(Keys::Int(&[0, 0]), &[first.clone(), rsp.clone()], 0, false);
            if device {
                pulled.unwrap();
                assert_eq!(get(&first), want);
                assert_eq!(rsp.rsp_indices().unwrap(), vec![0, 2]);
            } else {
                assert!(pulled.is_err());
                assert_eq!(get(&first), [7.; 9]);
            }
            // a dense push replaces the value by a dense one
            s.push(Keys::Int(&[0]), &[dense3(&[1.; 9])], 0).unwrap();
            s.pull(Keys::Int(&[0]), &[cout.clone()], 0, false).unwrap();
            assert_eq!(
                cout.parts().unwrap().aux[0].read().typed::<i64>(),
                &[0, 3, 6, 9]
            );
            // a csr value that does not cast to dense is refused at init
            for (d, ptr, idx) in [
                (&[1f32, 2.][..], &[0i64, 1, 1, 3][..], &[0i64, 1][..]),
                (&[1., 2.], &[0, 2, 1, 2], &[0, 1]),
                (&[1., 2.], &[0, 1, 2, 2], &[0, 3]),
            ] {
                let bad = csr3(d, ptr, idx);
                assert!(s.init(Keys::Int(&[1]), &[bad]).is_err());
                assert!(s.pull(Keys::Int(&[1]), &[out.clone()], 0, true).is_err());
            }
        }
    }
}
