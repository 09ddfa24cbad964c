//! The distributed store: MXNet 1.9.1's `KVStoreDist`
//! (`src/kvstore/kvstore_dist.h`) as a [`KvStore`], over the KV worker
//! ([`kv_node::worker_on`]) on a worker node, the KV server
//! ([`kv_node::serve`]) on a server node, and the scheduler
//! ([`scheduler::run`]) on the scheduler node.
//!
//! A worker reduces the values of several devices with the local store's
//! [`Comm`] (MXNet's `comm_->Reduce`) and sends one value per key. String
//! keys become ints 0, 1, 2… in the order of their first init, as
//! `KVStoreLocal::InitImpl` numbers them (`next_str_key_`):
//! the workers init the same keys in the same order, so they agree.
#![forbid(unsafe_code)]

use super::config::Config;
use super::keys::Command;
use super::kv_node;
use super::message::Role;
use super::postoffice::{Postoffice, WORKER_GROUP};
use super::scheduler;
use super::worker::KvWorker;
use crate::error::{Error, Result};
use crate::ndarray::dtype::DType;
use crate::ndarray::sparse::row_ids;
use crate::ndarray::{Context, NDArray, Shape, StorageType};
use crate::store::comm::{Comm, CommKey};
use crate::store::compression::CompressionParams;
use crate::store::group::group;
use crate::store::keys::{show_str, KindLock, StrRegistry};
use crate::store::table::{check_cast_copy, check_value, duplicate};
use crate::store::{Keys, KvStore, Updater, UpdaterSlot};
use crate::{bail, ensure};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a worker knows of an inited key.
#[derive(Clone)]
struct KeyInfo {
    shape: Shape,
    dtype: DType,
    stype: StorageType,
    /// The key's merge buffers in `comm`.
    comm: Arc<CommKey>,
}

/// A distinct key of a push: its id, its merge buffers and the positions
/// of its values in MXNet's grouping order.
type PushGroup = (i32, Arc<CommKey>, Vec<usize>);

/// How one key of a pull or pushpull fills its outputs (see
/// `WorkerSide::plan_outputs`).
struct Fill {
    id: i32,
    /// What the key's value is received into: one of its outputs, or a new
    /// array.
    dest: NDArray,
    /// The positions of the key's outputs, in MXNet's grouping order
    /// (`dest` may be one of them).
    outs: Vec<usize>,
}

/// Copies each key's value to its outputs, key by key in `plan`'s
/// (ascending) order, as MXNet's `comm_->Broadcast` from the receive
/// buffer: a device comm before its merge buffers exist writes output
/// `key % n` first and copies that one to the others (so they get its
/// dtype's rounding), a CPU comm copies the value to each.
fn write_outputs(comm: &Comm, plan: &[Fill], outs: &[NDArray]) -> Result<()> {
    for f in plan {
        let to: Vec<&NDArray> = f.outs.iter().map(|&p| &outs[p]).collect();
        comm.broadcast(f.id, &f.dest, &to)?;
    }
    Ok(())
}

/// The customer id of the worker store on its node (MXNet's `KVStoreDist`
/// uses 0).
const CUSTOMER: i32 = 0;

/// The worker side of a dist store.
struct WorkerSide {
    po: Arc<Postoffice>,
    w: Arc<KvWorker>,
    /// MXNet's `comm_`: reduces the values of several devices.
    comm: Comm,
    kind: KindLock,
    names: RwLock<StrRegistry>,
    table: RwLock<HashMap<i32, KeyInfo>>,
    barrier_before_exit: AtomicBool,
    closed: Mutex<Option<Result<()>>>,
    /// Held by an init from its checks until its keys are registered.
    init_lock: Mutex<()>,
    /// Keys whose sparse outputs a pull or pushpull skipped (MXNet warns
    /// once per key).
    warned_sparse_pull: Mutex<HashSet<i32>>,
}

/// The server or scheduler side: nothing runs before `run_server`.
struct NodeSide {
    config: Config,
    /// The running server's updater slot.
    slot: Mutex<Option<UpdaterSlot>>,
    /// An updater set before the server runs.
    pending: Mutex<Option<Arc<dyn Updater>>>,
    po: Mutex<Option<Arc<Postoffice>>>,
}

enum Side {
    Worker(Box<WorkerSide>),
    Node(Box<NodeSide>),
    /// What a forked child's drop leaves in place of the parent's side,
    /// which it leaks (see [`DistStore`]).
    Leaked,
}

/// A `dist*` store on one node of a cluster.
///
/// It belongs to the process that created it. A forked child (`fork()`,
/// Python's `os.fork` or multiprocessing's fork start method) has a copy of
/// it whose node, sockets and threads are the parent's (the threads do not
/// even exist in the child, and the sockets' ZeroMQ mailboxes are eventfds
/// shared with the parent: closing them there made the parent abort in
/// libzmq, `mailbox.cpp:99`). In any other process every operation fails
/// naming the owner ([`DistStore::check_owner`]); `close` does nothing and
/// succeeds, and dropping the store leaks everything it holds (worker,
/// postoffice, van, ZeroMQ context) without touching ZeroMQ.
pub struct DistStore {
    type_name: Vec<u8>,
    side: Side,
    /// The creating process.
    pid: u32,
}

/// This process's id (tests pretend to be a forked child).
fn current_pid() -> u32 {
    #[cfg(test)]
    if let Some(pid) = tests::FAKE_PID.with(|p| p.get()) {
        return pid;
    }
    std::process::id()
}

fn has(name: &[u8], s: &[u8]) -> bool {
    name.windows(s.len()).any(|w| w == s)
}

fn check_float(what: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        other => Err(Error::usage(format!(
            "{what}: the distributed store holds float16/32/64 values only, not {} (MXNet's server dies on them: This operation only support floating point types)",
            other.name()
        ))),
    }
}

/// `msg` with each internal key number `N` it names ("key N" or "Key is N"
/// as words of their own) replaced by the key as the caller wrote it, when
/// `name` knows it.
fn with_key_names(msg: &str, name: impl Fn(i32) -> Option<String>) -> String {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    'scan: while !rest.is_empty() {
        let starts_word = !out.chars().next_back().is_some_and(word);
        for prefix in ["key ", "Key is "] {
            if !starts_word {
                break;
            }
            let Some(after) = rest.strip_prefix(prefix) else {
                continue;
            };
            let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let boundary = after[digits..].chars().next().map_or(true, |c| !word(c));
            if digits == 0 || !boundary {
                continue;
            }
            if let Some(n) = after[..digits].parse().ok().and_then(&name) {
                out.push_str(prefix);
                out.push_str(&n);
                rest = &after[digits..];
                continue 'scan;
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

impl DistStore {
    /// A store of type `type_name` (lower-cased) for the node `config`
    /// describes. A worker starts its node here (as MXNet's constructor
    /// does) and, as rank 0, puts the servers in sync mode unless the type
    /// contains `_async`; servers and the scheduler start in
    /// [`KvStore::run_server`].
    pub fn new(type_name: Vec<u8>, config: Config) -> Result<DistStore> {
        match config.role {
            Role::Worker => {
                let po = Postoffice::start(config)?;
                Self::worker_on(type_name, po)
            }
            _ => Ok(DistStore {
                type_name,
                pid: std::process::id(),
                side: Side::Node(Box::new(NodeSide {
                    config,
                    slot: Mutex::new(None),
                    pending: Mutex::new(None),
                    po: Mutex::new(None),
                })),
            }),
        }
    }

    /// The worker store of a started worker node (a worker process has
    /// one, see `crate::factory`). It finalizes the node when it closes.
    pub fn worker_on(type_name: Vec<u8>, po: Arc<Postoffice>) -> Result<DistStore> {
        let w = kv_node::worker_on(&po, CUSTOMER);
        let device = has(&type_name, b"device");
        let sync = !has(&type_name, b"_async");
        let side = WorkerSide {
            comm: Comm::new(device),
            po,
            w,
            kind: KindLock::default(),
            names: RwLock::new(StrRegistry::default()),
            table: RwLock::new(HashMap::new()),
            barrier_before_exit: AtomicBool::new(true),
            closed: Mutex::new(None),
            init_lock: Mutex::new(()),
            warned_sparse_pull: Mutex::new(HashSet::new()),
        };
        if sync && side.po.my_rank() == 0 {
            if let Err(e) = side.w.command(Command::SyncMode.head(), b"") {
                side.po.stop();
                return Err(e);
            }
        }
        Ok(DistStore {
            type_name,
            side: Side::Worker(Box::new(side)),
            pid: std::process::id(),
        })
    }

    /// Whether this process created the store (a forked child did not).
    pub fn is_owner(&self) -> bool {
        current_pid() == self.pid
    }

    /// Fails in any process but the one that created the store (see
    /// [`DistStore`]).
    pub fn check_owner(&self) -> Result<()> {
        let me = current_pid();
        if me == self.pid {
            return Ok(());
        }
        Err(Error::usage(format!(
            "this dist kvstore belongs to process {}; a forked child (process {me}) cannot use it: its node, sockets and threads are the parent's (create the store in the process that uses it)",
            self.pid
        )))
    }

    fn worker(&self, what: &str) -> Result<&WorkerSide> {
        self.check_owner()?;
        match &self.side {
            Side::Worker(w) => Ok(w),
            Side::Node(n) => Err(Error::usage(format!(
                "{what} is a worker's operation; this node is a {}",
                n.config.role
            ))),
            Side::Leaked => bail!("internal: {what} on a dropped dist store"),
        }
    }
}

impl WorkerSide {
    /// `e` naming string keys as the caller wrote them where it names their
    /// internal numbers (the worker, the key layout and the servers know only
    /// those), as the local store's errors do. `keys`: the call's keys (an
    /// int-keyed call's errors are left as they are); `fresh`: the numbers
    /// an init gives `keys`, not registered yet.
    fn named(&self, keys: Option<Keys<'_>>, fresh: &[i32], e: Error) -> Error {
        let names = self.names.read();
        let call = match keys {
            Some(Keys::Int(_)) => return e,
            Some(Keys::Str(k)) => k,
            None if names.next_id() == 0 => return e,
            None => &[],
        };
        let name = |id: i32| {
            fresh
                .iter()
                .position(|&f| f == id)
                .and_then(|i| call.get(i).copied())
                .or_else(|| names.name(id))
                .map(show_str)
        };
        Error::with_kind(e.kind(), with_key_names(e.message(), name))
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.lock().is_some() {
            bail!("the distributed store has been closed");
        }
        Ok(())
    }

    /// The int ids of `keys` (all inited).
    fn ids(&self, keys: Keys<'_>) -> Result<Vec<i32>> {
        self.kind.check(keys.kind())?;
        let table = self.table.read();
        let ids: Vec<i32> = match keys {
            Keys::Int(k) => k.to_vec(),
            Keys::Str(k) => {
                let names = self.names.read();
                k.iter()
                    .map(|s| {
                        names.get(s).ok_or_else(|| {
                            Error::not_inited(format!("key {} has not been inited", show_str(s)))
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        for (i, id) in ids.iter().enumerate() {
            if !table.contains_key(id) {
                return Err(Error::not_inited(format!(
                    "key {} has not been inited",
                    keys.show(i)
                )));
            }
        }
        Ok(ids)
    }

    fn info(&self, id: i32) -> KeyInfo {
        self.table.read()[&id].clone()
    }

    /// MXNet's `InitImpl`: rank 0 sends each key's first value, then every
    /// worker waits at the workers' barrier. All or nothing, on every rank
    /// alike: everything that can be checked locally (key type, counts,
    /// dtypes, storage, duplicates, empty values, each key's server
    /// placement and layout) is checked on every rank before anything is
    /// sent or the barrier entered, so a refused init fails on every rank
    /// and the ranks' barriers stay paired. The keys are registered only
    /// once the init succeeded; when rank 0's sending fails after those
    /// checks (a server refused it, or is lost), rank 0 still takes part in
    /// the barrier, registers nothing and returns the error.
    fn init(&self, keys: Keys<'_>, vals: &[NDArray]) -> Result<()> {
        self.check_open()?;
        self.kind.check(keys.kind())?;
        ensure!(
            keys.len() == vals.len(),
            "{} keys for {} values",
            keys.len(),
            vals.len()
        );
        for (i, v) in vals.iter().enumerate() {
            check_float(&format!("key {}", keys.show(i)), v.dtype())?;
            ensure!(
                matches!(v.stype(), StorageType::Default | StorageType::RowSparse),
                "key {}: only dense and row_sparse values can be stored in a distributed store",
                keys.show(i)
            );
        }
        // one init at a time: the checks below hold until the keys are
        // registered (string keys draw their numbers here)
        let _one = self.init_lock.lock();
        // ids: string keys get the next numbers, in call order
        let ids: Vec<i32> = match keys {
            Keys::Int(k) => k.to_vec(),
            Keys::Str(k) => {
                let names = self.names.read();
                let mut fresh: HashMap<&[u8], i32> = HashMap::new();
                let mut ids = Vec::with_capacity(k.len());
                for (next, s) in (names.next_id()..).zip(k.iter()) {
                    if names.get(s).is_some() || fresh.contains_key(s) {
                        bail!("duplicate init of key {}", show_str(s));
                    }
                    fresh.insert(s, next);
                    ids.push(next);
                }
                ids
            }
        };
        {
            let table = self.table.read();
            for (i, id) in ids.iter().enumerate() {
                ensure!(
                    !table.contains_key(id),
                    "duplicate init of key {}",
                    keys.show(i)
                );
            }
        }
        // storable values, each key once (as the local store's init checks)
        for v in vals {
            check_value(v, "init")?;
        }
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        for id in &ids {
            if !seen.insert(*id) {
                return Err(duplicate(&id.to_string()));
            }
        }
        let items: Vec<(i32, &NDArray)> = ids.iter().copied().zip(vals).collect();
        // what only rank 0 encodes, checked on every rank
        for item in &items {
            self.w
                .check_init(std::slice::from_ref(item), self.w.compression())
                .map_err(|e| self.named(Some(keys), &ids, e))?;
        }
        let sent = if self.po.my_rank() == 0 {
            self.w
                .init(&items)
                .map_err(|e| self.named(Some(keys), &ids, e))
        } else {
            Ok(())
        };
        let barrier = self.po.barrier(CUSTOMER, WORKER_GROUP);
        sent?;
        barrier?;
        let comm_keys: Vec<Arc<CommKey>> = vals.iter().map(CommKey::new).collect();
        self.comm.init(&comm_keys);
        if let Keys::Str(k) = keys {
            let mut names = self.names.write();
            for s in k {
                names.register(s);
            }
        }
        let mut table = self.table.write();
        for ((id, v), comm) in ids.iter().zip(vals).zip(comm_keys) {
            table.insert(
                *id,
                KeyInfo {
                    shape: v.shape().clone(),
                    dtype: v.dtype(),
                    stype: v.stype(),
                    comm,
                },
            );
        }
        Ok(())
    }

    /// The checked values of a push or pushpull: per distinct key
    /// (ascending), its merge buffers and the positions of its values in
    /// MXNet's grouping order.
    fn push_groups(&self, ids: &[i32], vals: &[NDArray]) -> Result<Vec<PushGroup>> {
        ensure!(
            ids.len() == vals.len(),
            "{} keys for {} values",
            ids.len(),
            vals.len()
        );
        for (id, v) in ids.iter().zip(vals) {
            check_float(&format!("key {id}"), v.dtype())?;
        }
        for v in vals {
            check_value(v, "push")?;
        }
        let comm_keys: Vec<Arc<CommKey>> = {
            let table = self.table.read();
            ids.iter().map(|id| table[id].comm.clone()).collect()
        };
        let mut work = Vec::new();
        for (id, pos) in group(ids) {
            let key = &comm_keys[pos[0]];
            let group_vals: Vec<&NDArray> = pos.iter().map(|&p| &vals[p]).collect();
            self.comm.check(&id.to_string(), key, &group_vals)?;
            work.push((id, key.clone(), pos));
        }
        Ok(work)
    }

    /// `comm_->Reduce`: one value per distinct key.
    fn reduce(&self, ids: &[i32], vals: &[NDArray]) -> Result<Vec<(i32, NDArray)>> {
        self.push_groups(ids, vals)?
            .into_iter()
            .map(|(id, key, pos)| {
                let group_vals: Vec<&NDArray> = pos.iter().map(|&p| &vals[p]).collect();
                Ok((id, self.comm.reduce_to_send(&key, &group_vals)?))
            })
            .collect()
    }

    fn push(&self, keys: Keys<'_>, vals: &[NDArray]) -> Result<()> {
        self.check_open()?;
        let ids = self.ids(keys)?;
        let reduced = self.reduce(&ids, vals)?;
        let items: Vec<(i32, &NDArray)> = reduced.iter().map(|(k, v)| (*k, v)).collect();
        self.w.push(&items)
    }

    /// How the outputs `outs` of the distinct keys `groups` (ascending, a
    /// key's outputs in MXNet's grouping order) get their values, as MXNet's
    /// `PullImpl` and `PushPullImpl` write them: key by key in ascending
    /// order, each key's value copied to its outputs in its grouping order,
    /// so an output given for several keys ends with the largest key's value.
    ///
    /// Each key is received into an array of its own, its `dest`: one of its
    /// outputs when one fits (dense, the key's dtype) and no smaller key of
    /// the call writes it (so the later keys' copies come after it is read),
    /// without a copy; else a new array. The key's outputs are written from
    /// it once the call's replies are in (`write_outputs`).
    fn plan_outputs(&self, groups: &[(i32, Vec<usize>)], outs: &[NDArray]) -> Result<Vec<Fill>> {
        // the smallest key each output is given for
        let mut first: HashMap<usize, i32> = HashMap::with_capacity(outs.len());
        for (id, pos) in groups {
            for &p in pos {
                first.entry(outs[p].addr()).or_insert(*id);
            }
        }
        let mut plan = Vec::with_capacity(groups.len());
        for (id, pos) in groups {
            let info = self.info(*id);
            for &p in pos {
                ensure!(
                    outs[p].shape() == &info.shape,
                    "operands shape mismatch from.shape = {} to.shape={}",
                    info.shape,
                    outs[p].shape()
                );
            }
            let direct = pos.iter().copied().find(|&p| {
                let o = &outs[p];
                o.stype() == StorageType::Default
                    && o.dtype() == info.dtype
                    && first[&o.addr()] == *id
            });
            let dest = match direct {
                Some(p) => outs[p].clone(),
                None => NDArray::zeros(info.shape, info.dtype, outs[pos[0]].ctx())?,
            };
            plan.push(Fill {
                id: *id,
                dest,
                outs: pos.clone(),
            });
        }
        Ok(plan)
    }

    /// MXNet's `GroupKVPairsPull`: with `ignore_sparse` (a dist store's
    /// pull, pushpull and broadcast always ignore them) the sparse outputs
    /// are left out, as if they were not given, with MXNet's warning once
    /// per key; a key left without outputs is not pulled. The positions of
    /// the outputs kept, per key in ascending order.
    fn pull_groups(
        &self,
        ids: &[i32],
        outs: &[NDArray],
        ignore_sparse: bool,
    ) -> Vec<(i32, Vec<usize>)> {
        let mut groups = Vec::new();
        for (id, pos) in group(ids) {
            let (kept, skipped): (Vec<usize>, Vec<usize>) = pos
                .into_iter()
                .partition(|&p| !ignore_sparse || outs[p].stype() == StorageType::Default);
            if !skipped.is_empty() && self.warned_sparse_pull.lock().insert(id) {
                eprintln!("Warning: non-default weights detected during kvstore pull. This call has been ignored. Please make sure to use kv.row_sparse_pull() or module.prepare() with row_ids.");
            }
            if !kept.is_empty() {
                groups.push((id, kept));
            }
        }
        groups
    }

    /// Pulls the (dense) keys `ids` into `outs` (see `plan_outputs`).
    ///
    /// A row_sparse key pulled into a dense output is refused (MXNet 1.9.1
    /// sends a dense pull of it: its server aborts on the request). A
    /// dense key's sparse outputs are skipped (see `pull_groups`), or, with
    /// `ignore_sparse` false (MXNet's dist store refuses the call; README
    /// deviation 22), cast from the dense value as the local store's pull
    /// casts them: a value on cpu_pinned(0), as MXNet's receive buffer,
    /// whose dtype must be float32 or the output's on cpu_pinned(0)
    /// (`check_cast_copy`).
    fn pull_ids(&self, ids: &[i32], outs: &[NDArray], ignore_sparse: bool) -> Result<()> {
        let mut groups = Vec::new();
        for (id, pos) in self.pull_groups(ids, outs, ignore_sparse) {
            let info = self.info(id);
            if info.stype == StorageType::RowSparse {
                bail!(
                    "key {id} is row_sparse: a distributed store pulls it only with row_sparse_pull{}",
                    if ignore_sparse {
                        " (a pull into a dense output is refused: MXNet 1.9.1 sends a dense pull of the row_sparse key and its server aborts)"
                    } else {
                        ""
                    }
                );
            }
            check_float(&format!("pull of key {id}"), info.dtype)?;
            for &p in &pos {
                let out = &outs[p];
                if out.is_sparse() && out.shape() == &info.shape && out.size() > 0 {
                    check_cast_copy(info.stype, info.dtype, Context::PINNED0, out)
                        .map_err(|e| Error::new(format!("{} (key {id})", e.message())))?;
                }
            }
            groups.push((id, pos));
        }
        let plan = self.plan_outputs(&groups, outs)?;
        let items: Vec<(i32, &NDArray)> = plan.iter().map(|f| (f.id, &f.dest)).collect();
        self.w.pull(&items)?;
        write_outputs(&self.comm, &plan, outs)
    }

    fn pull(&self, keys: Keys<'_>, outs: &[NDArray], ignore_sparse: bool) -> Result<()> {
        self.check_open()?;
        ensure!(
            keys.len() == outs.len(),
            "{} keys for {} outputs",
            keys.len(),
            outs.len()
        );
        let ids = self.ids(keys)?;
        self.pull_ids(&ids, outs, ignore_sparse)
    }

    /// What `broadcast` (MXNet's `BroadcastImpl`: init, then a pull that
    /// ignores sparse outputs) checks before its init: no dense output of a
    /// row_sparse key, given in this call or inited before (the pull would
    /// refuse it, see `pull_ids`, after the keys were inited).
    fn check_broadcast_outputs(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
    ) -> Result<()> {
        if vkeys.len() != vals.len() || okeys.len() != outs.len() {
            return Ok(()); // init and pull name the counts
        }
        for (j, out) in outs.iter().enumerate() {
            if out.stype() != StorageType::Default {
                continue;
            }
            let given = (0..vkeys.len()).find(|&i| match (vkeys, okeys) {
                (Keys::Int(v), Keys::Int(o)) => v[i] == o[j],
                (Keys::Str(v), Keys::Str(o)) => v[i] == o[j],
                _ => false,
            });
            let stype = match given {
                Some(i) => Some(vals[i].stype()),
                None => {
                    let id = match okeys {
                        Keys::Int(o) => Some(o[j]),
                        Keys::Str(o) => self.names.read().get(o[j]),
                    };
                    id.and_then(|id| self.table.read().get(&id).map(|k| k.stype))
                }
            };
            ensure!(
                stype != Some(StorageType::RowSparse),
                "key {} is row_sparse: a distributed store pulls it only with row_sparse_pull (broadcast into a dense output is refused before the init: MXNet 1.9.1 sends a dense pull of the row_sparse key and its server aborts)",
                okeys.show(j)
            );
        }
        Ok(())
    }

    /// MXNet's `KVStoreDist::PushPullImpl`: key by key in ascending order,
    /// the key's values are reduced, pushed and its result pulled, then
    /// written to its outputs (see `plan_outputs`). Every key pushed must
    /// have outputs and every output key must be pushed, and a key's first
    /// output (in MXNet's grouping order) must have the key's dtype, as
    /// MXNet checks; its other outputs may be of any dtype (converted).
    /// Sparse outputs are left out (`pull_groups`): a key whose outputs are
    /// all sparse has none, so the key lists differ, as in MXNet.
    ///
    /// The keys go out together, in as few rounds as MXNet's order allows:
    /// a key whose pushed values include an output of a smaller key of the
    /// call waits until that key's outputs are written (MXNet reduces it
    /// after they are), so it starts a new round.
    fn push_pull(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
    ) -> Result<()> {
        self.check_open()?;
        ensure!(
            okeys.len() == outs.len(),
            "{} keys for {} outputs",
            okeys.len(),
            outs.len()
        );
        let vids = self.ids(vkeys)?;
        let oids = self.ids(okeys)?;
        let sparse = vals.iter().any(|v| v.stype() != StorageType::Default)
            || vids
                .iter()
                .any(|id| self.info(*id).stype != StorageType::Default);
        // MXNet's dist PushPull refuses both (kvstore_dist.h), but only when
        // it reaches the key, after earlier keys went out; refused here
        // before anything is sent.
        ensure!(
            self.w.compression().is_none(),
            "Compression not supported with PushPull: push, then pull"
        );
        ensure!(
            !sparse,
            "Expected push_stype of value to be kDefaultStorage: \
             a dist store's pushpull takes dense values of dense keys (push, then row_sparse_pull)"
        );
        let pushed = self.push_groups(&vids, vals)?;
        // sparse outputs are left out, as MXNet's GroupKVPairsPull does
        let ogroups = self.pull_groups(&oids, outs, true);
        ensure!(
            pushed.len() == ogroups.len() && pushed.iter().zip(&ogroups).all(|(p, o)| p.0 == o.0),
            "List of push and pull keys are different: a dist store's pushpull needs outputs \
             for each key it pushes and pushes each key it pulls (push, then pull)"
        );
        for (id, pos) in &ogroups {
            let (want, got) = (self.info(*id).dtype, outs[pos[0]].dtype());
            ensure!(
                want == got,
                "Output buffer dtype is different (key {id}: pushed {}, first output {})",
                want.name(),
                got.name()
            );
        }
        let plan = self.plan_outputs(&ogroups, outs)?;
        let mut written: std::collections::HashSet<usize> = Default::default();
        let mut round: Vec<(usize, NDArray)> = Vec::new();
        for (i, (_, key, vpos)) in pushed.iter().enumerate() {
            if !round.is_empty() && vpos.iter().any(|&p| written.contains(&vals[p].addr())) {
                self.push_pull_round(&plan, &round, outs)?;
                round.clear();
                written.clear();
            }
            let group_vals: Vec<&NDArray> = vpos.iter().map(|&p| &vals[p]).collect();
            round.push((i, self.comm.reduce_to_send(key, &group_vals)?));
            written.extend(ogroups[i].1.iter().map(|&p| outs[p].addr()));
        }
        self.push_pull_round(&plan, &round, outs)
    }

    /// Pushes and pulls the keys `round` (index in `plan`, reduced value)
    /// and writes their outputs.
    fn push_pull_round(
        &self,
        plan: &[Fill],
        round: &[(usize, NDArray)],
        outs: &[NDArray],
    ) -> Result<()> {
        let items: Vec<(i32, &NDArray, &NDArray)> = round
            .iter()
            .map(|(i, v)| (plan[*i].id, v, &plan[*i].dest))
            .collect();
        self.w.push_pull(&items)?;
        for (i, _) in round {
            write_outputs(&self.comm, std::slice::from_ref(&plan[*i]), outs)?;
        }
        Ok(())
    }

    fn pull_row_sparse(&self, keys: Keys<'_>, outs: &[NDArray], rows: &[NDArray]) -> Result<()> {
        self.check_open()?;
        ensure!(
            keys.len() == outs.len() && outs.len() == rows.len(),
            "{} keys, {} outputs and {} row id arrays: the counts must be equal",
            keys.len(),
            outs.len(),
            rows.len()
        );
        let ids = self.ids(keys)?;
        let mut plan = Vec::with_capacity(ids.len());
        for (i, ((id, out), r)) in ids.iter().zip(outs).zip(rows).enumerate() {
            let info = self.info(*id);
            ensure!(
                out.stype() == StorageType::RowSparse,
                "Expected row_sparse storage type for row_sparse_pull values (key {})",
                keys.show(i)
            );
            ensure!(
                info.stype == StorageType::RowSparse,
                "PullRowSparse expects a row_sparse key (key {})",
                keys.show(i)
            );
            ensure!(
                out.shape() == &info.shape,
                "operands shape mismatch from.shape = {} to.shape={} (row_sparse_pull of key {})",
                info.shape,
                out.shape(),
                keys.show(i)
            );
            let r = row_ids(r, info.shape.dims()[0])
                .map_err(|e| Error::new(format!("{e} (key {})", keys.show(i))))?;
            plan.push((*id, out, r));
        }
        // Written key by key in ascending order (a key's outputs in the order
        // MXNet groups them), as MXNet's PullRowSparseImpl writes them: an
        // output given for two keys ends with the larger key's rows.
        for (_, pos) in group(&ids) {
            for p in pos {
                let (id, out, r) = &plan[p];
                let dtype = self.info(*id).dtype;
                if out.dtype() == dtype {
                    self.w.pull_row_sparse(*id, out, r)?;
                } else {
                    // MXNet receives the rows in the key's dtype and copies
                    // them into the output (CopyFromTo row_sparse ->
                    // row_sparse converts, on any context)
                    let got = NDArray::sparse_zeros(
                        StorageType::RowSparse,
                        out.shape().clone(),
                        dtype,
                        out.ctx(),
                        &[DType::I64],
                        &[Shape(vec![0])],
                    )?;
                    self.w.pull_row_sparse(*id, &got, r)?;
                    out.copy_from(&got)?;
                }
            }
        }
        Ok(())
    }

    fn set_gradient_compression(&self, params: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        self.check_open()?;
        let p = CompressionParams::parse(params)?;
        if self.po.my_rank() == 0 {
            self.w.set_gradient_compression(p)
        } else {
            self.w.set_compression(Some(p));
            Ok(())
        }
    }

    /// MXNet's `~KVStoreDist` on a worker: every push answered, then, with
    /// barrier-before-exit, the workers' barrier, rank 0 stops the servers,
    /// and the node finalizes (with the final barrier).
    fn close(&self) -> Result<()> {
        let mut closed = self.closed.lock();
        if let Some(r) = &*closed {
            return r.clone();
        }
        let bbe = self.barrier_before_exit.load(Ordering::Acquire);
        let mut r = self.w.wait_all();
        if bbe && r.is_ok() {
            r = self.po.barrier(CUSTOMER, WORKER_GROUP);
            if r.is_ok() && self.po.my_rank() == 0 {
                r = self.w.command(Command::StopServer.head(), b"");
            }
        }
        self.po.unregister_customer(0, CUSTOMER);
        let f = if r.is_ok() {
            self.po.finalize(bbe)
        } else {
            self.po.stop();
            Ok(())
        };
        if r.is_ok() {
            r = f;
        }
        *closed = Some(r.clone());
        r
    }
}

impl NodeSide {
    fn run(&self, controller: &mut dyn FnMut(i32, &[u8])) -> Result<()> {
        match self.config.role {
            Role::Scheduler => scheduler::run(self.config.clone()),
            Role::Server => {
                ensure!(self.po.lock().is_none(), "this server node has already run");
                let po = Postoffice::start(self.config.clone())?;
                *self.po.lock() = Some(po.clone());
                let mut server = kv_node::server_for(&po);
                let slot = server.updater_slot();
                if let Some(u) = self.pending.lock().take() {
                    slot.set(Some(u));
                }
                *self.slot.lock() = Some(slot);
                let mut ctl = |head: i32, body: &[u8]| -> Result<()> {
                    controller(head, body);
                    Ok(())
                };
                let r = kv_node::serve(&po, &mut server, &mut ctl);
                *self.slot.lock() = None;
                match r {
                    Ok(()) => po.finalize(true),
                    Err(e) => {
                        po.stop();
                        Err(e)
                    }
                }
            }
            Role::Worker => bail!("RunServer is for server and scheduler nodes, not workers"),
        }
    }

    fn set_updater(&self, updater: Option<Arc<dyn Updater>>) {
        match &*self.slot.lock() {
            Some(slot) => slot.set(updater),
            None => *self.pending.lock() = updater,
        }
    }
}

impl Drop for DistStore {
    fn drop(&mut self) {
        if !self.is_owner() {
            // a forked child: the node is the parent's; nothing of it may be
            // closed, stopped or freed here
            std::mem::forget(std::mem::replace(&mut self.side, Side::Leaked));
            return;
        }
        if let Side::Worker(w) = &self.side {
            let _ = w.close();
        }
    }
}

impl KvStore for DistStore {
    fn type_name(&self) -> &[u8] {
        &self.type_name
    }

    fn init(&self, keys: Keys<'_>, vals: &[NDArray]) -> Result<()> {
        self.worker("init")?.init(keys, vals)
    }

    fn push(&self, keys: Keys<'_>, vals: &[NDArray], _priority: i32) -> Result<()> {
        let w = self.worker("push")?;
        w.push(keys, vals).map_err(|e| w.named(Some(keys), &[], e))
    }

    fn pull(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
        ignore_sparse: bool,
    ) -> Result<()> {
        let w = self.worker("pull")?;
        w.pull(keys, outs, ignore_sparse)
            .map_err(|e| w.named(Some(keys), &[], e))
    }

    fn pull_row_sparse(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        row_ids: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        let w = self.worker("row_sparse_pull")?;
        w.pull_row_sparse(keys, outs, row_ids)
            .map_err(|e| w.named(Some(keys), &[], e))
    }

    fn push_pull(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        let w = self.worker("pushpull")?;
        w.push_pull(vkeys, vals, okeys, outs)
            .map_err(|e| w.named(Some(vkeys), &[], e))
    }

    fn broadcast(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        _priority: i32,
    ) -> Result<()> {
        let w = self.worker("broadcast")?;
        w.check_broadcast_outputs(vkeys, vals, okeys, outs)?;
        w.init(vkeys, vals)?;
        w.pull(okeys, outs, true)
            .map_err(|e| w.named(Some(okeys), &[], e))
    }

    /// On a worker the updater is kept but not used (the servers update,
    /// as in MXNet); on a server it becomes the server's updater.
    fn set_updater(&self, updater: Option<Arc<dyn Updater>>) {
        if let (Side::Node(n), true) = (&self.side, self.is_owner()) {
            n.set_updater(updater);
        }
    }

    fn set_gradient_compression(&self, params: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        self.worker("set_gradient_compression")?
            .set_gradient_compression(params)
    }

    fn rank(&self) -> i32 {
        match &self.side {
            Side::Worker(w) => w.po.my_rank() as i32,
            Side::Node(n) => n.po.lock().as_ref().map_or(0, |p| p.my_rank() as i32),
            Side::Leaked => 0,
        }
    }

    fn group_size(&self) -> i32 {
        match &self.side {
            Side::Worker(w) => w.po.num_workers() as i32,
            Side::Node(n) => n.config.num_worker as i32,
            Side::Leaked => 0,
        }
    }

    fn barrier(&self) -> Result<()> {
        let w = self.worker("barrier")?;
        w.check_open()?;
        w.po.barrier(CUSTOMER, WORKER_GROUP)
    }

    fn set_barrier_before_exit(&self, barrier: bool) -> Result<()> {
        let w = self.worker("set_barrier_before_exit")?;
        w.barrier_before_exit.store(barrier, Ordering::Release);
        Ok(())
    }

    fn send_command_to_servers(&self, cmd_id: i32, body: &[u8]) -> Result<()> {
        let w = self.worker("send_command_to_servers")?;
        w.check_open()?;
        w.w.command(cmd_id, body)
    }

    fn run_server(&self, controller: &mut dyn FnMut(i32, &[u8])) -> Result<()> {
        self.check_owner()?;
        match &self.side {
            Side::Node(n) => n.run(controller),
            Side::Worker(_) => {
                bail!("RunServer is for server and scheduler nodes, not workers")
            }
            Side::Leaked => bail!("internal: RunServer on a dropped dist store"),
        }
    }

    fn num_dead_nodes(&self, node_id: i32, timeout_sec: i32) -> Result<i32> {
        self.check_owner()?;
        let po = match &self.side {
            Side::Worker(w) => w.po.clone(),
            Side::Node(n) => match n.po.lock().clone() {
                Some(p) => p,
                None => return Ok(0),
            },
            Side::Leaked => return Ok(0),
        };
        Ok(po.num_dead_nodes(node_id, timeout_sec) as i32)
    }

    /// In a forked child: does nothing and succeeds (the node is the
    /// parent's; dropping the store leaks it, see [`DistStore`]).
    fn close(&self) -> Result<()> {
        if !self.is_owner() {
            return Ok(());
        }
        match &self.side {
            // a push's error reported here names string keys as written
            Side::Worker(w) => w.close().map_err(|e| w.named(None, &[], e)),
            Side::Node(_) | Side::Leaked => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndarray::Context;
    use crate::test_util::{cluster_cfg as cfg, f32s};

    /// 2 workers x 2 servers in one process over ZeroMQ on 127.0.0.1, all
    /// through `KvStore`: string keys, several devices' values reduced on
    /// the worker, a key split over both servers, pushpull, an int32 push
    /// refused at the call, an updater set on the servers, close.
    #[test]
    fn a_cluster_of_dist_stores() {
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let servers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || -> Result<Vec<i32>> {
                    let s = DistStore::new(b"dist_sync".to_vec(), cfg(Role::Server, port))?;
                    let heads = Mutex::new(Vec::new());
                    // kController: `stored -= 0.5 * merged` from now on
                    let s2 = &s;
                    s.run_server(&mut |head, _body| {
                        heads.lock().push(head);
                        s2.set_updater(Some(Arc::new(
                            |_: i32, _: Option<&[u8]>, g: &NDArray, w: &NDArray| {
                                let g = g.read().typed::<f32>().to_vec();
                                for (w, g) in w.write().typed_mut::<f32>().iter_mut().zip(g) {
                                    *w -= 0.5 * g;
                                }
                                Ok(())
                            },
                        )));
                    })?;
                    Ok(heads.into_inner())
                })
            })
            .collect();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || -> Result<Vec<f64>> {
                    let s = DistStore::new(b"dist_sync".to_vec(), cfg(Role::Worker, port))?;
                    assert_eq!(s.group_size(), 2);
                    let m = (s.rank() + 1) as f32;
                    let (a, b): (&[u8], &[u8]) = (b"a", b"b");
                    s.init(Keys::Str(&[a, b]), &[f32s(&[0.0; 4]), f32s(&[0.0; 15])])?;
                    // two devices' values for "a", one for "b"
                    s.push(
                        Keys::Str(&[a, b, a]),
                        &[f32s(&[m; 4]), f32s(&[m * 10.0; 15]), f32s(&[1.0; 4])],
                        0,
                    )?;
                    let (oa, ob) = (f32s(&[0.0; 4]), f32s(&[0.0; 15]));
                    s.pull(Keys::Str(&[a, b]), &[oa.clone(), ob.clone()], 0, true)?;
                    let int = NDArray::zeros(Shape(vec![4]), DType::I32, Context::CPU0)?;
                    let e = s.push(Keys::Str(&[a]), &[int], 0).unwrap_err();
                    assert!(e.message().contains("float16/32/64"), "{}", e.message());
                    let pp = f32s(&[0.0; 4]);
                    s.push_pull(
                        Keys::Str(&[a]),
                        &[f32s(&[m; 4])],
                        Keys::Str(&[a]),
                        std::slice::from_ref(&pp),
                        0,
                    )?;
                    s.send_command_to_servers(Command::Controller.head(), b"sgd")?;
                    let upd = f32s(&[0.0; 4]);
                    s.push_pull(
                        Keys::Str(&[a]),
                        &[f32s(&[1.0; 4])],
                        Keys::Str(&[a]),
                        std::slice::from_ref(&upd),
                        0,
                    )?;
                    s.close()?;
                    let mut v = oa.to_f64_vec();
                    v.extend(ob.to_f64_vec());
                    v.extend(pp.to_f64_vec());
                    v.extend(upd.to_f64_vec());
                    Ok(v)
                })
            })
            .collect();
        let mut want = vec![5.0; 4]; // (1 + 1) + (2 + 1)
        want.extend([30.0; 15]);
        want.extend([3.0; 4]);
        want.extend([2.0; 4]); // 3 - 0.5 * 2
        for w in workers {
            assert_eq!(w.join().unwrap().unwrap(), want);
        }
        for s in servers {
            // each worker sent kController once
            assert_eq!(s.join().unwrap().unwrap(), vec![0, 0]);
        }
        sched.join().unwrap();
    }

    /// Pull and PushPull write as MXNet's KVStoreDist does, key by key in
    /// ascending order: a key's pushed values are read after the smaller
    /// keys' outputs are written, an output of several keys ends with the
    /// largest key's value, and each output gets its own key's value.
    /// Before, every key went out at once, each into the first of its
    /// outputs that fit (key 2 summed 10 + 12, x ended with key 1's value
    /// and y was copied from x after key 3's reply; the pull left key 2's
    /// value in x). A first output of another dtype and key sets that
    /// differ are refused, as MXNet refuses them, before anything is sent.
    #[test]
    fn pull_and_pushpull_write_key_by_key_as_mxnet() {
        let cfg = |role, port| Config::local(role, port, 1, 1, std::time::Duration::from_secs(30));
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let server = std::thread::spawn(move || -> Result<()> {
            DistStore::new(b"dist_sync".to_vec(), cfg(Role::Server, port))?
                .run_server(&mut |_, _| {})
        });
        let s = DistStore::new(b"dist_sync".to_vec(), cfg(Role::Worker, port)).unwrap();
        let z = || f32s(&[0.0; 3]);
        let f64s = || NDArray::zeros(Shape(vec![3]), DType::F64, Context::CPU0).unwrap();
        s.init(Keys::Int(&[1, 2, 3]), &[z(), z(), z()]).unwrap();
        // key 1's output b0 is pushed for key 2 (one worker: a result is
        // the sum pushed)
        let (b0, c) = (f32s(&[10.0; 3]), z());
        s.push_pull(
            Keys::Int(&[1, 2, 2]),
            &[f32s(&[1.0; 3]), b0.clone(), f32s(&[12.0; 3])],
            Keys::Int(&[1, 2, 2]),
            &[b0.clone(), c.clone(), c.clone()],
            0,
        )
        .unwrap();
        assert_eq!(b0.to_f64_vec(), vec![1.0; 3]);
        assert_eq!(c.to_f64_vec(), vec![13.0; 3]);
        // x: an output of keys 3 and 1; y (float64): key 1's alone
        let (x, y) = (z(), f64s());
        s.push_pull(
            Keys::Int(&[3, 1]),
            &[f32s(&[30.0; 3]), f32s(&[2.0; 3])],
            Keys::Int(&[3, 1, 1]),
            &[x.clone(), x.clone(), y.clone()],
            0,
        )
        .unwrap();
        assert_eq!(x.to_f64_vec(), vec![30.0; 3]);
        assert_eq!(y.to_f64_vec(), vec![2.0; 3]);
        let e = s
            .push_pull(
                Keys::Int(&[1, 2]),
                &[f32s(&[5.0; 3]), f32s(&[5.0; 3])],
                Keys::Int(&[1, 2, 2]),
                &[z(), f64s(), z()],
                0,
            )
            .unwrap_err();
        assert!(
            e.message().contains("Output buffer dtype is different"),
            "{}",
            e.message()
        );
        let e = s
            .push_pull(
                Keys::Int(&[1]),
                &[f32s(&[5.0; 3])],
                Keys::Int(&[1, 2]),
                &[z(), z()],
                0,
            )
            .unwrap_err();
        assert!(
            e.message()
                .contains("List of push and pull keys are different"),
            "{}",
            e.message()
        );
        // nothing of the refused calls was pushed; the largest key's value
        // is left in x
        let (x, y) = (z(), f64s());
        s.pull(
            Keys::Int(&[3, 1, 2, 1]),
            &[x.clone(), x.clone(), x.clone(), y.clone()],
            0,
            true,
        )
        .unwrap();
        assert_eq!(x.to_f64_vec(), vec![30.0; 3]);
        assert_eq!(y.to_f64_vec(), vec![2.0; 3]);
        let o = z();
        s.pull(Keys::Int(&[2]), std::slice::from_ref(&o), 0, true)
            .unwrap();
        assert_eq!(o.to_f64_vec(), vec![13.0; 3]);
        s.close().unwrap();
        server.join().unwrap().unwrap();
        sched.join().unwrap();
    }

    /// MXNet's dist PushPull refuses compressed and row_sparse values; ours
    /// refuses them before anything is pushed, so the stored values stay.
    #[test]
    fn pushpull_refuses_compression_and_row_sparse_and_pushes_nothing() {
        let cfg = |role, port| Config::local(role, port, 1, 1, std::time::Duration::from_secs(30));
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let at = |role| cfg(role, port);
        let server = {
            let c = at(Role::Server);
            std::thread::spawn(move || -> Result<()> {
                let s = DistStore::new(b"dist_sync".to_vec(), c)?;
                s.run_server(&mut |_, _| {})
            })
        };
        let s = DistStore::new(b"dist_sync".to_vec(), at(Role::Worker)).unwrap();
        let rsp = |rows: &[i64], v: f32| {
            let data = NDArray::from_bytes(
                Shape(vec![rows.len() as i64, 2]),
                DType::F32,
                Context::CPU0,
                bytemuck::cast_slice(&vec![v; rows.len() * 2]),
            )
            .unwrap();
            NDArray::row_sparse(Shape(vec![6, 2]), Context::CPU0, data, rows).unwrap()
        };
        let all: Vec<i64> = (0..6).collect();
        s.init(Keys::Int(&[3, 4]), &[f32s(&[1.0; 4]), rsp(&all, 1.0)])
            .unwrap();
        let e = s
            .push_pull(
                Keys::Int(&[4]),
                &[rsp(&[1, 4], 3.0)],
                Keys::Int(&[4]),
                &[rsp(&[], 0.0)],
                0,
            )
            .unwrap_err();
        assert!(e.message().contains("kDefaultStorage"), "{}", e.message());
        let out = rsp(&[], 0.0);
        let ids = NDArray::from_bytes(
            Shape(vec![6]),
            DType::I64,
            Context::CPU0,
            bytemuck::cast_slice(&all),
        )
        .unwrap();
        s.pull_row_sparse(
            Keys::Int(&[4]),
            std::slice::from_ref(&out),
            std::slice::from_ref(&ids),
            0,
        )
        .unwrap();
        let dense = NDArray::zeros(Shape(vec![6, 2]), DType::F32, Context::CPU0).unwrap();
        dense.copy_from(&out).unwrap();
        assert_eq!(dense.to_f64_vec(), vec![1.0; 12]);
        let params: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"type".to_vec(), b"2bit".to_vec()),
            (b"threshold".to_vec(), b"0.5".to_vec()),
        ];
        s.set_gradient_compression(&params).unwrap();
        let o = f32s(&[0.0; 4]);
        let e = s
            .push_pull(
                Keys::Int(&[3]),
                &[f32s(&[0.7; 4])],
                Keys::Int(&[3]),
                std::slice::from_ref(&o),
                0,
            )
            .unwrap_err();
        assert!(
            e.message().contains("Compression not supported"),
            "{}",
            e.message()
        );
        s.pull(Keys::Int(&[3]), std::slice::from_ref(&o), 0, true)
            .unwrap();
        assert_eq!(o.to_f64_vec(), vec![1.0; 4]);
        s.close().unwrap();
        server.join().unwrap().unwrap();
        sched.join().unwrap();
    }

    thread_local! {
        /// The process id this thread's calls see (a forked child's).
        pub(super) static FAKE_PID: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    }

    /// A forked child's copy of a dist store (this thread pretends to be
    /// one): every operation fails naming the owner, close succeeds and
    /// drop leaks, and neither touches the node, which the parent keeps
    /// using. Before, the child's operations went to the parent's sockets
    /// and its close or drop did the barrier and stopped the node (the
    /// parent aborted in libzmq, review probe p19_fork.py).
    #[test]
    fn a_forked_child_cannot_use_the_store_and_leaves_its_node_alone() {
        let cfg = |role, port| Config::local(role, port, 1, 1, std::time::Duration::from_secs(10));
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let server = std::thread::spawn(move || -> Result<()> {
            DistStore::new(b"dist_sync".to_vec(), cfg(Role::Server, port))?
                .run_server(&mut |_, _| {})
        });
        let po = Postoffice::start(cfg(Role::Worker, port)).unwrap();
        let s = DistStore::worker_on(b"dist_sync".to_vec(), po.clone()).unwrap();
        s.init(Keys::Int(&[3]), &[f32s(&[1.0; 4])]).unwrap();
        let parent = std::process::id();
        let in_child = |child: bool| FAKE_PID.with(|p| p.set(child.then_some(parent + 1)));
        let out = f32s(&[0.0; 4]);

        in_child(true);
        let one = f32s(&[1.0; 4]);
        let k = Keys::Int(&[3]);
        let ids = NDArray::zeros(Shape(vec![1]), DType::I64, Context::CPU0).unwrap();
        let params = vec![(b"type".to_vec(), b"2bit".to_vec())];
        let refused: Vec<(&str, Result<()>)> = vec![
            ("init", s.init(Keys::Int(&[4]), std::slice::from_ref(&one))),
            ("push", s.push(k, std::slice::from_ref(&one), 0)),
            ("pull", s.pull(k, std::slice::from_ref(&out), 0, true)),
            (
                "pushpull",
                s.push_pull(
                    k,
                    std::slice::from_ref(&one),
                    k,
                    std::slice::from_ref(&out),
                    0,
                ),
            ),
            (
                "broadcast",
                s.broadcast(
                    Keys::Int(&[4]),
                    std::slice::from_ref(&one),
                    k,
                    std::slice::from_ref(&out),
                    0,
                ),
            ),
            (
                "row_sparse_pull",
                s.pull_row_sparse(k, std::slice::from_ref(&out), std::slice::from_ref(&ids), 0),
            ),
            ("barrier", s.barrier()),
            ("set_barrier_before_exit", s.set_barrier_before_exit(false)),
            ("command", s.send_command_to_servers(0, b"x")),
            ("compression", s.set_gradient_compression(&params)),
            ("run_server", s.run_server(&mut |_, _| {})),
            ("num_dead_nodes", s.num_dead_nodes(8, 60).map(|_| ())),
        ];
        for (what, r) in refused {
            let e = r.expect_err(what);
            assert_eq!(e.kind(), crate::error::ErrorKind::Usage, "{what}: {e}");
            assert!(
                e.message().contains(&format!(
                    "this dist kvstore belongs to process {parent}; a forked child (process {})",
                    parent + 1
                )),
                "{what}: {e}"
            );
        }
        s.close().unwrap();
        assert!(!po.is_stopped(), "the child's close stopped the node");
        in_child(false);

        // the parent goes on: a sync round (one worker: the sum is stored)
        s.push(Keys::Int(&[3]), &[f32s(&[2.0; 4])], 0).unwrap();
        s.pull(Keys::Int(&[3]), std::slice::from_ref(&out), 0, true)
            .unwrap();
        assert_eq!(out.to_f64_vec(), vec![2.0; 4]);

        // the child drops its copy: leaked, the node untouched
        in_child(true);
        drop(s);
        in_child(false);
        assert!(!po.is_stopped(), "the child's drop stopped the node");
        let raw = kv_node::worker_on(&po, 1);
        let o = f32s(&[0.0; 4]);
        raw.pull(&[(3, &o)]).unwrap();
        assert_eq!(o.to_f64_vec(), vec![2.0; 4]);
        raw.command(Command::StopServer.head(), b"").unwrap();
        po.finalize(true).unwrap();
        server.join().unwrap().unwrap();
        sched.join().unwrap();
    }

    #[test]
    fn key_numbers_are_replaced_only_where_they_name_a_key() {
        let name = |id: i32| (id == 1).then(|| "w".to_string());
        assert_eq!(
            with_key_names("key 1: Key is 1 (key 1; key 1) key 1", name),
            "key w: Key is w (key w; key w) key w"
        );
        // other numbers, hex ps keys, and words are left alone
        let other = "key 10, key 0, ps key 0x1, key 1x, key 1é, monkey 1, turkey 1";
        assert_eq!(with_key_names(other, name), other);
    }

    /// Errors of calls on string keys name the keys as the caller wrote
    /// them, as the local store's do, never their internal numbers: texts
    /// made by the store, the worker, the key layout and the servers (which
    /// know only the numbers), and a push's error reported by a later call
    /// or by close. They named "key 1" (or "key 1 ... (key w is number 1)").
    #[test]
    fn errors_of_string_keys_name_the_keys() {
        for kind in ["dist_sync", "dist_async"] {
            let cfg =
                |role, port| Config::local(role, port, 1, 1, std::time::Duration::from_secs(10));
            let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
            let port = sched.port();
            let server = std::thread::spawn(move || -> Result<()> {
                DistStore::new(kind.as_bytes().to_vec(), cfg(Role::Server, port))?
                    .run_server(&mut |_, _| {})
            });
            let s = DistStore::new(kind.as_bytes().to_vec(), cfg(Role::Worker, port)).unwrap();
            let (a, w, e): (&[u8], &[u8], &[u8]) = (b"a", b"w", b"e");
            let two_by_two = || {
                NDArray::from_bytes(
                    Shape(vec![2, 2]),
                    DType::F32,
                    Context::CPU0,
                    bytemuck::cast_slice(&[1.0f32; 4]),
                )
                .unwrap()
            };
            let rsp = NDArray::row_sparse(Shape(vec![2, 2]), Context::CPU0, two_by_two(), &[0, 1])
                .unwrap();
            // a: number 0, w: number 1
            s.init(Keys::Str(&[a, w]), &[rsp, f32s(&[0.0; 4])]).unwrap();
            let mut errors = Vec::new();
            let empty = NDArray::zeros(Shape(vec![0]), DType::F32, Context::CPU0).unwrap();
            errors.push(s.init(Keys::Str(&[e]), &[empty]).unwrap_err());
            let int = NDArray::zeros(Shape(vec![4]), DType::I32, Context::CPU0).unwrap();
            errors.push(s.push(Keys::Str(&[w]), &[int], 0).unwrap_err());
            errors.push(s.push(Keys::Str(&[w]), &[f32s(&[1.0; 3])], 0).unwrap_err());
            errors.push(
                s.pull(Keys::Str(&[a]), &[two_by_two()], 0, false)
                    .unwrap_err(),
            );
            if kind == "dist_async" {
                // refused by the server (no updater), reported by the next
                // call on the key, then by close
                s.push(Keys::Str(&[w]), &[f32s(&[1.0; 4])], 0).unwrap();
                errors.push(
                    s.pull(Keys::Str(&[w]), &[f32s(&[0.0; 4])], 0, true)
                        .unwrap_err(),
                );
                s.push(Keys::Str(&[w]), &[f32s(&[1.0; 4])], 0).unwrap();
                errors.push(s.close().unwrap_err());
                // (the server and the scheduler then end on the lost worker)
            } else {
                s.close().unwrap();
            }
            for (i, err) in errors.iter().enumerate() {
                let m = err.message();
                let named = if i == 0 {
                    "key e"
                } else if i == 3 {
                    "key a"
                } else {
                    "key w"
                };
                assert!(m.contains(named), "{kind} error {i}: {m}");
                for n in ["key 0", "key 1", "key 2", "number"] {
                    assert!(!m.contains(n), "{kind} error {i} names {n:?}: {m}");
                }
            }
            let _ = server.join();
            let _ = sched.join();
        }
    }

    #[test]
    fn server_only_operations_are_refused_on_a_worker_and_vice_versa() {
        let s = DistStore::new(b"dist_sync".to_vec(), cfg(Role::Server, 1)).unwrap();
        let e = s.push(Keys::Int(&[1]), &[f32s(&[1.0])], 0).unwrap_err();
        assert!(
            e.message().contains("worker's operation"),
            "{}",
            e.message()
        );
        assert_eq!(s.group_size(), 2);
        s.close().unwrap();
    }

    /// A 2-worker cluster on 127.0.0.1 of `servers` servers (deadline 10 s):
    /// runs `f(rank, store, node)` on each worker, then closes the store;
    /// returns the results by rank.
    fn two_workers<T: Send + 'static>(
        servers: usize,
        f: impl Fn(usize, &DistStore, &Arc<Postoffice>) -> Result<T> + Send + Sync + 'static,
    ) -> Vec<Result<T>> {
        let cfg = move |role, port| {
            Config::local(role, port, 2, servers, std::time::Duration::from_secs(10))
        };
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let servers: Vec<_> = (0..servers)
            .map(|_| {
                std::thread::spawn(move || -> Result<()> {
                    DistStore::new(b"dist_sync".to_vec(), cfg(Role::Server, port))?
                        .run_server(&mut |_, _| {})
                })
            })
            .collect();
        let f = Arc::new(f);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let f = f.clone();
                std::thread::spawn(move || -> (usize, Result<T>) {
                    let po = match Postoffice::start(cfg(Role::Worker, port)) {
                        Ok(po) => po,
                        Err(e) => return (usize::MAX, Err(e)),
                    };
                    let rank = po.my_rank();
                    let r = DistStore::worker_on(b"dist_sync".to_vec(), po.clone()).and_then(|s| {
                        let r = f(rank, &s, &po)?;
                        s.close()?;
                        Ok(r)
                    });
                    po.stop();
                    (rank, r)
                })
            })
            .collect();
        let mut out: Vec<(usize, Result<T>)> =
            workers.into_iter().map(|w| w.join().unwrap()).collect();
        out.sort_by_key(|(r, _)| *r);
        for s in servers {
            let _ = s.join().unwrap();
        }
        let _ = sched.join();
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// What only rank 0 encodes and sends is checked on every rank: a key
    /// MXNet's 32-bit key -> server mapping cannot place (3 servers) and a
    /// value without elements fail on both ranks (rank 1 used to succeed and
    /// wait at a barrier rank 0 never entered), register nothing (a retry
    /// used to say "duplicate init"), and the ranks stay paired.
    #[test]
    fn an_init_refused_locally_fails_on_every_rank_and_registers_nothing() {
        let res = two_workers(3, |rank, s, _| {
            let e = s
                .init(Keys::Int(&[215330]), &[f32s(&[1.0; 3])])
                .unwrap_err();
            assert!(e.message().contains("cannot be placed"), "rank {rank}: {e}");
            let e = s
                .init(Keys::Int(&[215330]), &[f32s(&[1.0; 3])])
                .unwrap_err();
            assert!(e.message().contains("cannot be placed"), "rank {rank}: {e}");
            let empty = NDArray::zeros(Shape(vec![0]), DType::F32, Context::CPU0)?;
            let e = s
                .init(Keys::Int(&[1, 2]), &[f32s(&[1.0; 3]), empty])
                .unwrap_err();
            assert!(
                e.message()
                    .contains("key 2: a value of shape [0] holds no elements"),
                "rank {rank}: {e}"
            );
            let e = s.push(Keys::Int(&[1]), &[f32s(&[1.0; 3])], 0).unwrap_err();
            assert_eq!(e.kind(), crate::error::ErrorKind::NotInited, "{e}");
            // the refused keys can be inited now
            s.init(Keys::Int(&[1]), &[f32s(&[0.0; 3])])?;
            s.push(Keys::Int(&[1]), &[f32s(&[rank as f32 + 1.0; 3])], 0)?;
            let out = f32s(&[0.0; 3]);
            s.pull(Keys::Int(&[1]), std::slice::from_ref(&out), 0, true)?;
            Ok(out.to_f64_vec())
        });
        for r in res {
            assert_eq!(r.unwrap(), vec![3.0; 3]);
        }
    }

    /// When the server refuses rank 0's init (key 9 is a row_sparse key on
    /// the server: another customer of rank 0's node inited it), rank 0
    /// still takes part in the init barrier, so the next init and a sync
    /// round pair up (they used to pair with the wrong barrier and time
    /// out), and rank 0 registers nothing.
    #[test]
    fn a_server_refused_init_keeps_the_ranks_paired() {
        let res = two_workers(1, |rank, s, po| {
            if rank == 0 {
                let raw = kv_node::worker_on(po, 1);
                let data = NDArray::from_bytes(
                    Shape(vec![2, 2]),
                    DType::F32,
                    Context::CPU0,
                    bytemuck::cast_slice(&[1.0f32; 4]),
                )?;
                let rsp = NDArray::row_sparse(Shape(vec![2, 2]), Context::CPU0, data, &[0, 1])?;
                raw.init(&[(9, &rsp)])?;
            }
            let refused = s.init(Keys::Int(&[9]), &[f32s(&[1.0; 4])]).err();
            if rank == 0 {
                let e = s.push(Keys::Int(&[9]), &[f32s(&[1.0; 4])], 0).unwrap_err();
                assert_eq!(e.kind(), crate::error::ErrorKind::NotInited, "{e}");
            }
            s.init(Keys::Int(&[10]), &[f32s(&[0.0; 3])])?;
            s.push(Keys::Int(&[10]), &[f32s(&[rank as f32 + 1.0; 3])], 0)?;
            let out = f32s(&[0.0; 3]);
            s.pull(Keys::Int(&[10]), std::slice::from_ref(&out), 0, true)?;
            Ok((refused.map(|e| e.message().to_string()), out.to_f64_vec()))
        });
        let (e0, v0) = res[0].as_ref().unwrap();
        assert!(
            e0.as_deref()
                .unwrap_or("")
                .contains("row_sparse key on this server"),
            "{e0:?}"
        );
        assert_eq!(v0, &vec![3.0; 3]);
        let (e1, v1) = res[1].as_ref().unwrap();
        assert_eq!(e1, &None);
        assert_eq!(v1, &vec![3.0; 3]);
    }
}
