//! Store creation, above both the local stores ([`crate::store`]) and the
//! distributed one ([`crate::dist::store`]): MXNet's `KVStore::Create`.
#![forbid(unsafe_code)]

use crate::bail;
use crate::dist::config::Config;
use crate::dist::message::Role;
use crate::dist::postoffice::Postoffice;
use crate::dist::store::DistStore;
use crate::error::Result;
use crate::psenv;
use crate::store::local::LocalStore;
use crate::store::KvStore;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};

/// This process's worker node (ps-lite has one postoffice per process); it
/// serves one dist store, once.
enum WorkerNode {
    None,
    /// A thread of the process `pid` is starting the node (the lock is not
    /// held meanwhile: a start waits on the network for up to the deadline).
    /// In a forked child, `pid` is the parent's.
    Starting {
        pid: u32,
    },
    Started(Weak<Postoffice>),
}

// The process-wide locks below are std locks, held across `fork()` by the C
// API's `pthread_atfork` handlers ([`hold_for_fork`]): a child must not find
// them held by a thread of the parent. Neither is held while the other is
// taken, nor while anything else is locked or waited for.
static WORKER_NODE: Mutex<WorkerNode> = Mutex::new(WorkerNode::None);
/// Signalled when a start ends.
static WORKER_NODE_CHANGED: Condvar = Condvar::new();

/// This process's dist worker stores, for [`close_dist_stores`].
static WORKER_STORES: Mutex<Vec<Weak<DistStore>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // (nothing panics while these locks are held: a poisoned lock is as good)
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The locks of this module, held: see [`hold_for_fork`].
pub struct ForkHold {
    _node: MutexGuard<'static, WorkerNode>,
    _stores: MutexGuard<'static, Vec<Weak<DistStore>>>,
}

/// Waits until no other thread is inside this module's locks and keeps
/// every other thread out until the hold is dropped (around a `fork()`: the
/// child may drop it too).
pub fn hold_for_fork() -> ForkHold {
    ForkHold {
        _node: lock(&WORKER_NODE),
        _stores: lock(&WORKER_STORES),
    }
}

/// Closes every live dist worker store of this process, newest first
/// (`MXNotifyShutdown`, which frontends call at exit: the barrier before
/// exit and node shutdown happen even when a store object is never freed).
/// The first error is returned.
pub fn close_dist_stores() -> Result<()> {
    let stores: Vec<Arc<DistStore>> = std::mem::take(&mut *lock(&WORKER_STORES))
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut first = Ok(());
    for s in stores.iter().rev() {
        if let Err(e) = s.close() {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first
}

fn track(store: DistStore) -> Arc<dyn KvStore> {
    let s = Arc::new(store);
    let mut live = lock(&WORKER_STORES);
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&s));
    s
}

/// Creates a store from MXNet's type string: lower-cased, then matched by
/// substring (`dist`, then `nccl`, else local; `device` picks device comm).
/// A `dist` store reads the cluster from the `DMLC_*` variables (set in the
/// environment or with `MXInitPSEnv`).
pub fn create(type_str: &[u8]) -> Result<Arc<dyn KvStore>> {
    let name = type_str.to_ascii_lowercase();
    let has = |s: &[u8]| name.windows(s.len()).any(|w| w == s);
    let shown = String::from_utf8_lossy(&name).into_owned();
    if has(b"dist") {
        let missing = psenv::missing_cluster_vars();
        if !missing.is_empty() {
            bail!(
                "kvstore type \"{shown}\" needs a cluster, but {} not set (set them in the environment or with MXInitPSEnv)",
                missing
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if missing.len() == 1 { " is" } else { " are" }
            );
        }
        let config = Config::from_env()?;
        if config.role != Role::Worker {
            return Ok(Arc::new(DistStore::new(name, config)?));
        }
        let me = std::process::id();
        let mut node = lock(&WORKER_NODE);
        loop {
            match &*node {
                WorkerNode::None => break,
                // another thread starts the node: its store, or its failure, decides
                WorkerNode::Starting { pid } if *pid == me => {
                    node = WORKER_NODE_CHANGED
                        .wait(node)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                WorkerNode::Starting { pid } => bail!(
                    "kvstore type \"{shown}\": this process was forked (from process {pid}) while its parent was starting its worker node; a worker process has one dist store at a time"
                ),
                WorkerNode::Started(po) => match po.upgrade() {
                    // One dist store per worker process: the servers hold one key space
                    // for the whole job, so a second store could not be independent of
                    // the first (MXNet 1.9.1's second KVStoreDist waits forever on a
                    // barrier the servers and the scheduler never join).
                    Some(po) if !po.is_stopped() => bail!(
                        "kvstore type \"{shown}\": this process already has a dist store (worker rank {}); a worker process has one dist store at a time, since every store of a job shares the servers' keys: use that store (MXNet 1.9.1 waits forever creating a second one)",
                        po.my_rank()
                    ),
                    _ => bail!(
                        "kvstore type \"{shown}\": this process's worker node has already finished (ps-lite starts a node once per process)"
                    ),
                },
            }
        }
        *node = WorkerNode::Starting { pid: me };
        drop(node);
        // Back to None if the start fails (or panics); the node's once started.
        let mut starting = Starting(WorkerNode::None);
        let po = Postoffice::start(config)?;
        starting.0 = WorkerNode::Started(Arc::downgrade(&po));
        return Ok(track(DistStore::worker_on(name, po)?));
    }
    if has(b"nccl") {
        bail!("this build has no NCCL: compile with USE_NCCL=1 to use {shown}");
    }
    Ok(Arc::new(LocalStore::new(name.clone(), has(b"device"))))
}

/// Ends a start of the worker node (a [`WorkerNode::Starting`] of this
/// process) when dropped: records the state it holds and wakes the threads
/// waiting for the start.
struct Starting(WorkerNode);

impl Drop for Starting {
    fn drop(&mut self) {
        *lock(&WORKER_NODE) = std::mem::replace(&mut self.0, WorkerNode::None);
        WORKER_NODE_CHANGED.notify_all();
    }
}
