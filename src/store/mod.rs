//! The key-value store behind the C API. [`KvStore`] is the one interface
//! the C layer calls; the `local`/`device` store ([`local`]) implements it
//! here, over the key table ([`table`]) and MXNet's communicator
//! ([`comm`]), and the distributed store (`crate::dist::store`) implements
//! it too, reducing with the same communicator. [`Updater`] is the one
//! update-function trait of stores and KV servers.
#![forbid(unsafe_code)]

pub mod comm;
pub mod compression;
pub mod group;
pub mod keys;
pub mod local;
pub mod table;

use crate::error::Result;
use crate::ndarray::NDArray;
use parking_lot::RwLock;
use std::sync::Arc;

pub use keys::{KeyKind, Keys};

/// An update function: `(key, string key, recv, local)`; it must write its
/// result into `local`. `str_key` is the caller's string for string-keyed
/// stores, and `key` the internal id (registration order) there; a server
/// passes `None`. An error fails the push (or, on a server, the requests)
/// that ran the update.
pub trait Updater: Send + Sync {
    fn update(
        &self,
        key: i32,
        str_key: Option<&[u8]>,
        recv: &NDArray,
        local: &NDArray,
    ) -> Result<()>;
}

impl<F> Updater for F
where
    F: Fn(i32, Option<&[u8]>, &NDArray, &NDArray) -> Result<()> + Send + Sync,
{
    fn update(
        &self,
        key: i32,
        str_key: Option<&[u8]>,
        recv: &NDArray,
        local: &NDArray,
    ) -> Result<()> {
        self(key, str_key, recv, local)
    }
}

/// Where a store (or a KV server) finds its updater. Cloneable, so that
/// whoever installs an updater (a server's controller, a store's
/// `set_updater`) can share it; readers take a clone of the updater and
/// call it without holding the slot, so an updater may replace itself.
#[derive(Clone, Default)]
pub struct UpdaterSlot(Arc<RwLock<Option<Arc<dyn Updater>>>>);

impl UpdaterSlot {
    pub fn set(&self, updater: Option<Arc<dyn Updater>>) {
        *self.0.write() = updater;
    }

    pub fn get(&self) -> Option<Arc<dyn Updater>> {
        self.0.read().clone()
    }
}

/// The operations of a KVStore, as the C API exposes them.
pub trait KvStore: Send + Sync {
    /// The lower-cased type string the store was created with.
    fn type_name(&self) -> &[u8];
    fn init(&self, keys: Keys<'_>, vals: &[NDArray]) -> Result<()>;
    fn push(&self, keys: Keys<'_>, vals: &[NDArray], priority: i32) -> Result<()>;
    fn pull(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        priority: i32,
        ignore_sparse: bool,
    ) -> Result<()>;
    fn pull_row_sparse(
        &self,
        keys: Keys<'_>,
        outs: &[NDArray],
        row_ids: &[NDArray],
        priority: i32,
    ) -> Result<()>;
    /// `push(vkeys, vals)` then `pull(okeys, outs)`.
    fn push_pull(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        priority: i32,
    ) -> Result<()>;
    /// `init(vkeys, vals)` then `pull(okeys, outs)`, all or nothing.
    fn broadcast(
        &self,
        vkeys: Keys<'_>,
        vals: &[NDArray],
        okeys: Keys<'_>,
        outs: &[NDArray],
        priority: i32,
    ) -> Result<()>;
    fn set_updater(&self, updater: Option<Arc<dyn Updater>>);
    fn set_gradient_compression(&self, params: &[(Vec<u8>, Vec<u8>)]) -> Result<()>;
    fn rank(&self) -> i32 {
        0
    }
    fn group_size(&self) -> i32 {
        1
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn set_barrier_before_exit(&self, _barrier: bool) -> Result<()> {
        Ok(())
    }
    fn send_command_to_servers(&self, _cmd_id: i32, _body: &[u8]) -> Result<()> {
        Ok(())
    }
    /// Runs a server loop, calling `controller(head, body)` for commands; a
    /// non-distributed store returns at once.
    fn run_server(&self, _controller: &mut dyn FnMut(i32, &[u8])) -> Result<()> {
        Ok(())
    }
    fn num_dead_nodes(&self, _node_id: i32, _timeout_sec: i32) -> Result<i32> {
        Ok(0)
    }
    /// Ends the store's part in a cluster (`MXKVStoreFree` calls it): a
    /// distributed worker's barrier before exit and node shutdown.
    /// Idempotent; local stores have nothing to do.
    fn close(&self) -> Result<()> {
        Ok(())
    }
}
