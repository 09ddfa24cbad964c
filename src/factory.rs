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
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// This process's worker node (ps-lite has one postoffice per process); it
/// serves one dist store, once.
static WORKER_NODE: Mutex<Option<Weak<Postoffice>>> = Mutex::new(None);

/// This process's dist worker stores, for [`close_dist_stores`].
static WORKER_STORES: Mutex<Vec<Weak<DistStore>>> = Mutex::new(Vec::new());

/// Closes every live dist worker store of this process, newest first
/// (`MXNotifyShutdown`, which frontends call at exit: the barrier before
/// exit and node shutdown happen even when a store object is never freed).
/// The first error is returned.
pub fn close_dist_stores() -> Result<()> {
    let stores: Vec<Arc<DistStore>> = std::mem::take(&mut *WORKER_STORES.lock())
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
    let mut live = WORKER_STORES.lock();
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
        let mut node = WORKER_NODE.lock();
        if let Some(po) = node.as_ref() {
            match po.upgrade() {
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
            }
        }
        let po = Postoffice::start(config)?;
        *node = Some(Arc::downgrade(&po));
        return Ok(track(DistStore::worker_on(name, po)?));
    }
    if has(b"nccl") {
        bail!("this build has no NCCL: compile with USE_NCCL=1 to use {shown}");
    }
    Ok(Arc::new(LocalStore::new(name.clone(), has(b"device"))))
}
