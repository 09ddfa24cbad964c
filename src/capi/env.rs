//! Process-level entry points: version, shutdown, the ps-lite environment
//! and node roles, and libmxkv's own diagnostics.

use super::args::{cstrs, write_out, KVSTORES, NDARRAYS};
use super::boundary::{api_call, api_call_light};
use crate::psenv;
use std::os::raw::{c_char, c_int};

/// The MXNet API level implemented: 10901 (1.9.1).
pub const MXNET_VERSION: c_int = 10901;

/// Writes the MXNet version this library implements (10901).
#[no_mangle]
pub unsafe extern "C" fn MXGetVersion(out: *mut c_int) -> c_int {
    // SAFETY: `out` is NULL (checked) or writable, per the contract.
    api_call_light("MXGetVersion", || unsafe {
        write_out(out, MXNET_VERSION, "out")
    })
}

/// Called by frontends at exit: closes this process's distributed worker
/// stores (barrier before exit, node shutdown); nothing else to do.
#[no_mangle]
pub extern "C" fn MXNotifyShutdown() -> c_int {
    api_call("MXNotifyShutdown", crate::factory::close_dist_stores)
}

/// Records ps-lite environment variables (read before the process
/// environment by the dist store and the node-role queries). Names and
/// values are bytes, as in MXNet (which keeps them as `std::string`): bytes
/// that are not UTF-8 are kept as U+FFFD, so that such a value still counts
/// as set and matches no role, number or address (MXNet's `DMLC_ROLE` of
/// `"work\xfe"` is neither a worker nor a server either).
#[no_mangle]
pub unsafe extern "C" fn MXInitPSEnv(
    num_vars: u32,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
) -> c_int {
    api_call("MXInitPSEnv", || {
        // SAFETY: both arrays hold `num_vars` strings, per the contract.
        let (k, v) = unsafe {
            (
                cstrs(keys, num_vars as usize, "keys")?,
                cstrs(vals, num_vars as usize, "vals")?,
            )
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        psenv::set_vars(k.iter().zip(&v).map(|(k, v)| (text(k), text(v))));
        Ok(())
    })
}

fn role_is(name: &'static str, ret: *mut c_int, role: &str) -> c_int {
    api_call(name, || {
        let is = c_int::from(psenv::role() == role);
        // SAFETY: `ret` is NULL (checked) or writable, per the contract.
        unsafe { write_out(ret, is, "ret") }
    })
}

/// 1 if `DMLC_ROLE` is `worker` or unset.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsWorkerNode(ret: *mut c_int) -> c_int {
    role_is("MXKVStoreIsWorkerNode", ret, "worker")
}

/// 1 if `DMLC_ROLE` is `server`.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsServerNode(ret: *mut c_int) -> c_int {
    role_is("MXKVStoreIsServerNode", ret, "server")
}

/// 1 if `DMLC_ROLE` is `scheduler`.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreIsSchedulerNode(ret: *mut c_int) -> c_int {
    role_is("MXKVStoreIsSchedulerNode", ret, "scheduler")
}

/// libmxkv only: the numbers of live KVStore and NDArray handles, for leak
/// checks in tests. Either pointer may be NULL.
#[no_mangle]
pub unsafe extern "C" fn mxkv_live_handles(kvstores: *mut c_int, ndarrays: *mut c_int) -> c_int {
    api_call("mxkv_live_handles", || {
        let count = |n: usize| c_int::try_from(n).unwrap_or(c_int::MAX);
        if !kvstores.is_null() {
            // SAFETY: non-NULL and writable, per the contract.
            unsafe { write_out(kvstores, count(KVSTORES.live()), "kvstores")? };
        }
        if !ndarrays.is_null() {
            // SAFETY: non-NULL and writable, per the contract.
            unsafe { write_out(ndarrays, count(NDARRAYS.live()), "ndarrays")? };
        }
        Ok(())
    })
}
