//! `MXKVStore*`, in the order of MXNet's `c_api.h`. Each export converts its
//! arguments, makes one store call and maps the result.

use super::args::{
    cstr, cstrs, int_keys, kvstore, ndarrays, new_handle, str_keys, write_out, KeyArgs, KvHandle,
    KVSTORES,
};
use super::boundary::{api_call, beside, with_caller_cancel_state};
use super::{
    mx_uint, KVStoreHandle, MXKVStoreServerController, MXKVStoreStrUpdater, MXKVStoreUpdater,
    NDArrayHandle,
};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;
use crate::store::Updater;
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Counts the stores made by `MXKVStoreCreate` and not freed, and switches
/// the keeping of big blocks (`bigalloc::keep`) on at the first and off
/// after the last, under one lock: a Free that finds no store left and a
/// Create on another thread cannot cross (keeping off with a store alive,
/// or on with none). A std lock, held across a `fork()` by the C API's
/// fork handlers (src/capi/boundary.rs), as the handle registries are.
struct StoreCount(Mutex<usize>);

impl StoreCount {
    fn lock(&self) -> MutexGuard<'_, usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn created(&self, keep: impl FnOnce(bool)) {
        let mut n = self.lock();
        *n += 1;
        if *n == 1 {
            keep(true);
        }
    }

    fn freed(&self, keep: impl FnOnce(bool)) {
        let mut n = self.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            keep(false);
        }
    }
}

static STORES: StoreCount = StoreCount(Mutex::new(0));

/// Holds the store count's lock until the guard is dropped (the C API's
/// `pthread_atfork` handlers: a child must not find it held by a thread of
/// the parent that was creating or freeing a store).
pub(crate) fn hold_store_count_for_fork() -> MutexGuard<'static, usize> {
    STORES.lock()
}

/// Creates a store. `type` is matched by substring, as MXNet does:
/// `dist…` (distributed), `nccl` (refused: no NCCL), anything else local,
/// with device communication when it contains `device`.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreCreate(type_: *const c_char, out: *mut KVStoreHandle) -> c_int {
    api_call("MXKVStoreCreate", || {
        // SAFETY: `type_` is NULL (checked) or a C string, per the contract.
        let name = unsafe { cstr(type_, "type")? };
        if out.is_null() {
            return Err(Error::new("out (output pointer) is NULL"));
        }
        let store = crate::factory::create(name)?;
        let type_c = CString::new(store.type_name()).expect("came from a C string");
        let h = KVSTORES.insert(Arc::new(KvHandle { store, type_c }));
        // while a store exists, freed big blocks are kept for its traffic
        STORES.created(super::bigalloc::keep);
        // SAFETY: `out` is non-NULL and writable, per the contract.
        unsafe { write_out(out, h as KVStoreHandle, "out") }
    })
}

/// Sets gradient compression from `num_params` key/value strings
/// (`type`, `threshold`).
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSetGradientCompression(
    handle: KVStoreHandle,
    num_params: u32,
    keys: *mut *const c_char,
    vals: *mut *const c_char,
) -> c_int {
    api_call("MXKVStoreSetGradientCompression", || {
        let kv = kvstore(handle)?;
        // SAFETY: both arrays hold `num_params` strings, per the contract.
        let (k, v) = unsafe {
            (
                cstrs(keys, num_params as usize, "keys")?,
                cstrs(vals, num_params as usize, "vals")?,
            )
        };
        let params: Vec<(Vec<u8>, Vec<u8>)> = k
            .into_iter()
            .zip(v)
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        kv.store.set_gradient_compression(&params)
    })
}

/// Frees a store. NULL is accepted (as in MXNet); a stale handle is an error.
/// Values already pulled stay valid; calls in flight on other threads finish
/// (and a push among them may still call the store's updater: see
/// `MXKVStoreSetUpdater`).
/// A distributed worker meets the others at the barrier before exit (unless
/// turned off) and stops its node; an error there is returned (the handle is
/// freed all the same).
#[no_mangle]
pub extern "C" fn MXKVStoreFree(handle: KVStoreHandle) -> c_int {
    api_call("MXKVStoreFree", || {
        if handle.is_null() {
            return Ok(());
        }
        let kv = KVSTORES
            .remove(handle as usize)
            .map_err(|e| Error::new(format!("KVStoreHandle {e}")))?;
        // a distributed worker's barrier before exit and node shutdown
        let closed = kv.store.close();
        drop(kv);
        // no store left: the big blocks kept for reuse go back
        STORES.freed(super::bigalloc::keep);
        closed
    })
}

fn init(
    name: &'static str,
    handle: KVStoreHandle,
    keys: Result<KeyArgs<'_>>,
    vals: *mut NDArrayHandle,
    num: u32,
) -> c_int {
    api_call(name, || {
        let kv = kvstore(handle)?;
        let keys = keys?;
        // SAFETY: `vals` holds `num` handles, per the contract.
        let vals = unsafe { ndarrays(vals, num as usize, "vals")? };
        kv.store.init(keys.keys(), &vals)
    })
}

/// Initialises `num` int keys with copies of `vals`. All or nothing.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreInit(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: `keys` holds `num` ints, per the contract.
    init(
        "MXKVStoreInit",
        handle,
        unsafe { int_keys(keys, num, "keys") },
        vals,
        num,
    )
}

/// Initialises `num` string keys with copies of `vals`. All or nothing.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreInitEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
) -> c_int {
    // SAFETY: `keys` holds `num` strings, per the contract.
    init(
        "MXKVStoreInitEx",
        handle,
        unsafe { str_keys(keys, num, "keys") },
        vals,
        num,
    )
}

/// How many C updaters exist (installed, or still held by a push in flight).
static LIVE_C_UPDATERS: AtomicUsize = AtomicUsize::new(0);

/// Runs a push's work on a second stack (`beside`) when a C updater exists,
/// so that an updater that ends its thread can do so; else right here (no
/// 8 MiB stack mapped per pushing thread, and no switches: a few tens of
/// nanoseconds a push). An updater installed by another thread after this
/// check may still be called by this push off the second stack: if it ends
/// its thread, the process aborts with a message (csrc/callbacks.cc).
fn maybe_beside(job: impl FnOnce() -> c_int) -> c_int {
    if LIVE_C_UPDATERS.load(Ordering::Acquire) > 0 {
        beside(job)
    } else {
        job()
    }
}

fn push(
    name: &'static str,
    handle: KVStoreHandle,
    keys: Result<KeyArgs<'_>>,
    vals: *mut NDArrayHandle,
    num: u32,
    priority: c_int,
) -> c_int {
    api_call(name, || {
        let kv = kvstore(handle)?;
        let keys = keys?;
        // SAFETY: `vals` holds `num` handles, per the contract.
        let vals = unsafe { ndarrays(vals, num as usize, "vals")? };
        kv.store.push(keys.keys(), &vals, priority)
    })
}

/// Pushes `num` values; values of one key are summed, then applied by the
/// updater (default: assign). The values are copied, never kept.
#[no_mangle]
pub unsafe extern "C-unwind" fn MXKVStorePush(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    maybe_beside(|| {
        push(
            "MXKVStorePush",
            handle,
            // SAFETY: `keys` holds `num` ints, per the contract.
            unsafe { int_keys(keys, num, "keys") },
            vals,
            num,
            priority,
        )
    })
}

/// String-key form of [`MXKVStorePush`].
#[no_mangle]
pub unsafe extern "C-unwind" fn MXKVStorePushEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    maybe_beside(|| {
        push(
            "MXKVStorePushEx",
            handle,
            // SAFETY: `keys` holds `num` strings, per the contract.
            unsafe { str_keys(keys, num, "keys") },
            vals,
            num,
            priority,
        )
    })
}

fn pull(
    name: &'static str,
    handle: KVStoreHandle,
    keys: Result<KeyArgs<'_>>,
    vals: *mut NDArrayHandle,
    num: u32,
    priority: c_int,
    ignore_sparse: bool,
) -> c_int {
    api_call(name, || {
        let kv = kvstore(handle)?;
        let keys = keys?;
        // SAFETY: `vals` holds `num` handles, per the contract.
        let outs = unsafe { ndarrays(vals, num as usize, "vals")? };
        kv.store.pull(keys.keys(), &outs, priority, ignore_sparse)
    })
}

/// Pulls into `num` preallocated outputs (any dtype; converted). With
/// `ignore_sparse`, sparse outputs are skipped.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullWithSparse(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    priority: c_int,
    ignore_sparse: bool,
) -> c_int {
    // SAFETY: `keys` holds `num` ints, per the contract.
    pull(
        "MXKVStorePullWithSparse",
        handle,
        unsafe { int_keys(keys, num, "keys") },
        vals,
        num,
        priority,
        ignore_sparse,
    )
}

/// String-key form of [`MXKVStorePullWithSparse`].
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullWithSparseEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    priority: c_int,
    ignore_sparse: bool,
) -> c_int {
    // SAFETY: `keys` holds `num` strings, per the contract.
    pull(
        "MXKVStorePullWithSparseEx",
        handle,
        unsafe { str_keys(keys, num, "keys") },
        vals,
        num,
        priority,
        ignore_sparse,
    )
}

/// [`MXKVStorePullWithSparse`] with `ignore_sparse = true`.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePull(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: `keys` holds `num` ints, per the contract.
    pull(
        "MXKVStorePull",
        handle,
        unsafe { int_keys(keys, num, "keys") },
        vals,
        num,
        priority,
        true,
    )
}

/// [`MXKVStorePullWithSparseEx`] with `ignore_sparse = true`.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: `keys` holds `num` strings, per the contract.
    pull(
        "MXKVStorePullEx",
        handle,
        unsafe { str_keys(keys, num, "keys") },
        vals,
        num,
        priority,
        true,
    )
}

fn pull_row_sparse(
    name: &'static str,
    handle: KVStoreHandle,
    keys: Result<KeyArgs<'_>>,
    vals: *mut NDArrayHandle,
    row_ids: *const NDArrayHandle,
    num: u32,
    priority: c_int,
) -> c_int {
    api_call(name, || {
        let kv = kvstore(handle)?;
        let keys = keys?;
        // SAFETY: both arrays hold `num` handles, per the contract.
        let (outs, rows) = unsafe {
            (
                ndarrays(vals, num as usize, "vals")?,
                ndarrays(row_ids, num as usize, "row_ids")?,
            )
        };
        kv.store
            .pull_row_sparse(keys.keys(), &outs, &rows, priority)
    })
}

/// Pulls the rows `row_ids[i]` of row_sparse keys into row_sparse outputs.
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullRowSparse(
    handle: KVStoreHandle,
    num: u32,
    keys: *const c_int,
    vals: *mut NDArrayHandle,
    row_ids: *const NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: `keys` holds `num` ints, per the contract.
    pull_row_sparse(
        "MXKVStorePullRowSparse",
        handle,
        unsafe { int_keys(keys, num, "keys") },
        vals,
        row_ids,
        num,
        priority,
    )
}

/// String-key form of [`MXKVStorePullRowSparse`].
#[no_mangle]
pub unsafe extern "C" fn MXKVStorePullRowSparseEx(
    handle: KVStoreHandle,
    num: u32,
    keys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    row_ids: *const NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: `keys` holds `num` strings, per the contract.
    pull_row_sparse(
        "MXKVStorePullRowSparseEx",
        handle,
        unsafe { str_keys(keys, num, "keys") },
        vals,
        row_ids,
        num,
        priority,
    )
}

/// Which two-phase operation [`two_phase`] runs.
#[derive(Clone, Copy)]
enum TwoPhase {
    Broadcast,
    PushPull,
}

#[allow(clippy::too_many_arguments)]
fn two_phase(
    name: &'static str,
    op: TwoPhase,
    handle: KVStoreHandle,
    vkeys: Result<KeyArgs<'_>>,
    vnum: u32,
    okeys: Result<KeyArgs<'_>>,
    onum: u32,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    api_call(name, || {
        let kv = kvstore(handle)?;
        let (vkeys, okeys) = (vkeys?, okeys?);
        // SAFETY: `vals` holds `vnum` handles and `outs` holds `onum`, per the contract.
        let (vals, outs) = unsafe {
            (
                ndarrays(vals, vnum as usize, "vals")?,
                ndarrays(outs, onum as usize, "outs")?,
            )
        };
        match op {
            TwoPhase::Broadcast => {
                kv.store
                    .broadcast(vkeys.keys(), &vals, okeys.keys(), &outs, priority)
            }
            TwoPhase::PushPull => {
                kv.store
                    .push_pull(vkeys.keys(), &vals, okeys.keys(), &outs, priority)
            }
        }
    })
}

/// Init `vkeys` with `vals`, then pull `okeys` into `outs`. All or nothing.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreBroadcast(
    handle: KVStoreHandle,
    vnum: mx_uint,
    vkeys: *const c_int,
    onum: mx_uint,
    okeys: *const c_int,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: `vkeys` holds `vnum` ints and `okeys` holds `onum`, per the contract.
    let (vk, ok) = unsafe {
        (
            int_keys(vkeys, vnum, "vkeys"),
            int_keys(okeys, onum, "okeys"),
        )
    };
    two_phase(
        "MXKVStoreBroadcast",
        TwoPhase::Broadcast,
        handle,
        vk,
        vnum,
        ok,
        onum,
        vals,
        outs,
        priority,
    )
}

/// String-key form of [`MXKVStoreBroadcast`].
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreBroadcastEx(
    handle: KVStoreHandle,
    vnum: mx_uint,
    vkeys: *mut *const c_char,
    onum: mx_uint,
    okeys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    // SAFETY: `vkeys` holds `vnum` strings and `okeys` holds `onum`, per the contract.
    let (vk, ok) = unsafe {
        (
            str_keys(vkeys, vnum, "vkeys"),
            str_keys(okeys, onum, "okeys"),
        )
    };
    two_phase(
        "MXKVStoreBroadcastEx",
        TwoPhase::Broadcast,
        handle,
        vk,
        vnum,
        ok,
        onum,
        vals,
        outs,
        priority,
    )
}

/// Push `vals` to `vkeys`, then pull `okeys` into `outs` (which may be the
/// pushed arrays). The outputs are checked before anything is pushed.
#[no_mangle]
pub unsafe extern "C-unwind" fn MXKVStorePushPull(
    handle: KVStoreHandle,
    vnum: mx_uint,
    vkeys: *const c_int,
    onum: mx_uint,
    okeys: *const c_int,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    maybe_beside(|| {
        // SAFETY: `vkeys` holds `vnum` ints and `okeys` holds `onum`, per the contract.
        let (vk, ok) = unsafe {
            (
                int_keys(vkeys, vnum, "vkeys"),
                int_keys(okeys, onum, "okeys"),
            )
        };
        two_phase(
            "MXKVStorePushPull",
            TwoPhase::PushPull,
            handle,
            vk,
            vnum,
            ok,
            onum,
            vals,
            outs,
            priority,
        )
    })
}

/// String-key form of [`MXKVStorePushPull`].
#[no_mangle]
pub unsafe extern "C-unwind" fn MXKVStorePushPullEx(
    handle: KVStoreHandle,
    vnum: mx_uint,
    vkeys: *mut *const c_char,
    onum: mx_uint,
    okeys: *mut *const c_char,
    vals: *mut NDArrayHandle,
    outs: *mut NDArrayHandle,
    priority: c_int,
) -> c_int {
    maybe_beside(|| {
        // SAFETY: `vkeys` holds `vnum` strings and `okeys` holds `onum`, per the contract.
        let (vk, ok) = unsafe {
            (
                str_keys(vkeys, vnum, "vkeys"),
                str_keys(okeys, onum, "okeys"),
            )
        };
        two_phase(
            "MXKVStorePushPullEx",
            TwoPhase::PushPull,
            handle,
            vk,
            vnum,
            ok,
            onum,
            vals,
            outs,
            priority,
        )
    })
}

type IntFn = unsafe extern "C" fn(c_int, NDArrayHandle, NDArrayHandle, *mut c_void);
type StrFn = unsafe extern "C" fn(*const c_char, NDArrayHandle, NDArrayHandle, *mut c_void);
type ControllerFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_void);

// The trampolines of csrc/callbacks.cc: each calls its callback inside
// try/catch (on the thread's own stack when the C API call runs on a second
// stack, `boundary::beside`) and returns 0 (returned), 1 (threw a
// std::exception, whose what() is copied NUL-terminated into `err`), 2
// (threw something else) or 3 (ended its thread: pthread_exit or a
// cancellation, which resumes once the C API call has returned here). They
// never unwind: off a `beside` call, a callback that ends its thread aborts
// the process with a message (the unwind would have to cross Rust frames).
// (Declared inside functions, where cbindgen does not look: they are not
// part of the C API.)

/// `f(key, recv, local, user)` through its trampoline.
///
/// `unsafe`: `f` must be safe to call with these arguments and `err` must
/// hold `err_len` writable bytes.
unsafe fn call_int_updater(
    f: IntFn,
    key: c_int,
    recv: NDArrayHandle,
    local: NDArrayHandle,
    user: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    extern "C" {
        fn mxkv_guarded_int_updater(
            f: IntFn,
            key: c_int,
            recv: NDArrayHandle,
            local: NDArrayHandle,
            user: *mut c_void,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
    // SAFETY: the trampoline only calls `f` with these arguments and writes
    // within `err`, both sound per this function's contract.
    unsafe { mxkv_guarded_int_updater(f, key, recv, local, user, err, err_len) }
}

/// `f(key, recv, local, user)` through its trampoline.
///
/// `unsafe`: as `call_int_updater`; `key` is a C string.
unsafe fn call_str_updater(
    f: StrFn,
    key: *const c_char,
    recv: NDArrayHandle,
    local: NDArrayHandle,
    user: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    extern "C" {
        fn mxkv_guarded_str_updater(
            f: StrFn,
            key: *const c_char,
            recv: NDArrayHandle,
            local: NDArrayHandle,
            user: *mut c_void,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
    // SAFETY: as in `call_int_updater`.
    unsafe { mxkv_guarded_str_updater(f, key, recv, local, user, err, err_len) }
}

/// `f(head, body, user)` through its trampoline.
///
/// `unsafe`: as `call_int_updater`; `body` is a C string.
unsafe fn call_controller(
    f: ControllerFn,
    head: c_int,
    body: *const c_char,
    user: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int {
    extern "C" {
        fn mxkv_guarded_controller(
            f: ControllerFn,
            head: c_int,
            body: *const c_char,
            user: *mut c_void,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
    // SAFETY: as in `call_int_updater`.
    unsafe { mxkv_guarded_controller(f, head, body, user, err, err_len) }
}

/// The room for a thrown exception's `what()` (longer texts are cut).
const WHAT_LEN: usize = 1024;

/// Runs `call` (a trampoline call given the error buffer) and turns a
/// thrown exception into the text `"{what} threw ..."`.
fn guarded(
    what: impl FnOnce() -> String,
    call: impl FnOnce(*mut c_char, usize) -> c_int,
) -> Result<()> {
    let mut err = [0 as c_char; WHAT_LEN];
    let code = with_caller_cancel_state(|| call(err.as_mut_ptr(), err.len()));
    match code {
        0 => Ok(()),
        1 => {
            // SAFETY: the trampoline NUL-terminated `err` within its length.
            let text = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
            Err(Error::new(format!(
                "{} threw a C++ exception: {}",
                what(),
                text.to_string_lossy()
            )))
        }
        3 => Err(Error::new(format!(
            "{} ended its thread (pthread_exit or cancellation); the thread ends when this call returns",
            what()
        ))),
        _ => Err(Error::new(format!(
            "{} threw a C++ exception (not a std::exception)",
            what()
        ))),
    }
}

/// An updater made of C callbacks. Each call hands the callee two new
/// handles (`recv`, `local`) that the callee owns and frees. The callbacks
/// return nothing; a C++ exception they throw (caught in csrc/callbacks.cc),
/// their thread's end (see the trampolines above) or a panic on the way
/// (none is expected) becomes the error of the push that ran the update.
struct CUpdater {
    int_fn: IntFn,
    str_fn: MXKVStoreStrUpdater,
    /// The caller's `updater_handle`, passed back unchanged.
    user: usize,
}

impl CUpdater {
    fn new(int_fn: IntFn, str_fn: MXKVStoreStrUpdater, user: usize) -> CUpdater {
        LIVE_C_UPDATERS.fetch_add(1, Ordering::AcqRel);
        CUpdater {
            int_fn,
            str_fn,
            user,
        }
    }
}

impl Drop for CUpdater {
    fn drop(&mut self) {
        LIVE_C_UPDATERS.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Updater for CUpdater {
    fn update(
        &self,
        key: i32,
        str_key: Option<&[u8]>,
        recv: &NDArray,
        local: &NDArray,
    ) -> Result<()> {
        let user = self.user as *mut c_void;
        let name = match (str_key, self.str_fn) {
            (Some(s), Some(f)) => Some((
                CString::new(s).map_err(|_| {
                    Error::new("a string key holds a NUL byte and cannot reach the string updater")
                })?,
                f,
            )),
            _ => None,
        };
        let show_key = || match str_key {
            Some(s) => crate::store::keys::show_str(s),
            None => key.to_string(),
        };
        let call = || {
            let r = new_handle(recv.clone());
            let l = new_handle(local.clone());
            guarded(
                || format!("the updater of key {}", show_key()),
                |err, len| match &name {
                    // SAFETY: `f` is the caller's callback with MXNet's
                    // signature, called through the trampoline; the string
                    // lives for the call, the handles are new and `err` holds
                    // `len` bytes.
                    Some((c, f)) => unsafe {
                        call_str_updater(*f, c.as_ptr(), r, l, user, err, len)
                    },
                    // SAFETY: as above, for the int callback.
                    None => unsafe { call_int_updater(self.int_fn, key, r, l, user, err, len) },
                },
            )
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(Error::new(format!(
                "the updater of key {} failed (panic: {what})",
                show_key()
            )))
        })
    }
}

fn set_updater(
    handle: KVStoreHandle,
    updater: MXKVStoreUpdater,
    str_updater: MXKVStoreStrUpdater,
    updater_handle: *mut c_void,
) -> Result<()> {
    let kv = kvstore(handle)?;
    let int_fn = updater.ok_or_else(|| {
        Error::new("updater is NULL (a NULL callback would crash MXNet at the next push)")
    })?;
    kv.store.set_updater(Some(Arc::new(CUpdater::new(
        int_fn,
        str_updater,
        updater_handle as usize,
    ))));
    Ok(())
}

/// Sets the int-key updater; it replaces any earlier updater. On a
/// string-keyed store it is called with internal ids (registration order).
///
/// `unsafe`: the store keeps `updater` and `updater_handle` and calls them on
/// later pushes, until another updater replaces them or the store is freed.
/// Replacing or freeing does not wait for pushes in flight on other threads:
/// such a push (a `MXKVStorePush*` or `MXKVStorePushPull*` call that started
/// before `MXKVStoreSetUpdater*` or `MXKVStoreFree` returned) may still call
/// the old updater with the old `updater_handle`, so both must stay valid
/// until every such call has returned. (MXNet's store is not safe to use from
/// several threads at all.)
///
/// An updater may end its thread (`pthread_exit`, or a cancellation acted on
/// inside it; CPython does so to a daemon thread at interpreter exit): the
/// push then gives back what it holds and the thread ends as asked, with its
/// exit value and cleanup handlers, as in MXNet. (While a C updater exists,
/// pushes run on a second stack of the calling thread and the updater on the
/// thread's own, so that the thread's unwind meets no Rust frame.)
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSetUpdater(
    handle: KVStoreHandle,
    updater: MXKVStoreUpdater,
    updater_handle: *mut c_void,
) -> c_int {
    api_call("MXKVStoreSetUpdater", || {
        set_updater(handle, updater, None, updater_handle)
    })
}

/// Sets both updaters. `str_updater` may be NULL: string keys then reach
/// `updater` as internal ids.
///
/// `unsafe`: as `MXKVStoreSetUpdater`, the callbacks and `updater_handle`
/// must stay valid while the store may call them: also after they are
/// replaced or the store is freed, until every push in flight on another
/// thread at that moment has returned.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSetUpdaterEx(
    handle: KVStoreHandle,
    updater: MXKVStoreUpdater,
    str_updater: MXKVStoreStrUpdater,
    updater_handle: *mut c_void,
) -> c_int {
    api_call("MXKVStoreSetUpdaterEx", || {
        set_updater(handle, updater, str_updater, updater_handle)
    })
}

/// The store's type string (lower-cased), valid until `MXKVStoreFree`.
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetType(
    handle: KVStoreHandle,
    type_: *mut *const c_char,
) -> c_int {
    api_call("MXKVStoreGetType", || {
        let kv = kvstore(handle)?;
        // The pointer stays valid while the handle is live: the registry
        // keeps the `KvHandle` (and its string) until `MXKVStoreFree`.
        let p = kv.type_c.as_ptr();
        // SAFETY: `type_` is NULL (checked) or writable, per the contract.
        unsafe { write_out(type_, p, "type") }
    })
}

/// This node's rank (0 for local stores).
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetRank(handle: KVStoreHandle, ret: *mut c_int) -> c_int {
    api_call("MXKVStoreGetRank", || {
        let r = kvstore(handle)?.store.rank();
        // SAFETY: `ret` is NULL (checked) or writable, per the contract.
        unsafe { write_out(ret, r, "ret") }
    })
}

/// The number of workers (1 for local stores).
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetGroupSize(handle: KVStoreHandle, ret: *mut c_int) -> c_int {
    api_call("MXKVStoreGetGroupSize", || {
        let n = kvstore(handle)?.store.group_size();
        // SAFETY: `ret` is NULL (checked) or writable, per the contract.
        unsafe { write_out(ret, n, "ret") }
    })
}

/// Waits until all workers reach the barrier (no-op for local stores).
#[no_mangle]
pub extern "C" fn MXKVStoreBarrier(handle: KVStoreHandle) -> c_int {
    api_call("MXKVStoreBarrier", || kvstore(handle)?.store.barrier())
}

/// Whether workers meet at a barrier before exit (dist stores).
#[no_mangle]
pub extern "C" fn MXKVStoreSetBarrierBeforeExit(
    handle: KVStoreHandle,
    barrier_before_exit: c_int,
) -> c_int {
    api_call("MXKVStoreSetBarrierBeforeExit", || {
        kvstore(handle)?
            .store
            .set_barrier_before_exit(barrier_before_exit != 0)
    })
}

/// Runs the server loop (dist servers); local stores return at once.
///
/// `unsafe`: `controller` (if not NULL) is called with `controller_handle`
/// for every command until the loop returns; both must stay valid until then.
/// A C++ exception the controller throws is caught: the loop goes on (later
/// commands still reach the controller) and returns `-1` with the first
/// exception's text when it ends.
#[no_mangle]
pub unsafe extern "C-unwind" fn MXKVStoreRunServer(
    handle: KVStoreHandle,
    controller: MXKVStoreServerController,
    controller_handle: *mut c_void,
) -> c_int {
    beside(|| {
        api_call("MXKVStoreRunServer", || {
            let kv = kvstore(handle)?;
            let user = controller_handle as usize;
            let mut thrown: Option<Error> = None;
            let mut call = |head: i32, body: &[u8]| {
                if let Some(f) = controller {
                    let body = controller_body(body);
                    let r = guarded(
                        || format!("the server controller (command {head})"),
                        // SAFETY: the caller's controller with MXNet's signature,
                        // called through the trampoline; the body string lives
                        // for the call and `err` holds `len` bytes.
                        |err, len| unsafe {
                            call_controller(f, head, body.as_ptr(), user as *mut c_void, err, len)
                        },
                    );
                    if let Err(e) = r {
                        thrown.get_or_insert(e);
                    }
                }
            };
            let r = kv.store.run_server(&mut call);
            r?;
            thrown.map_or(Ok(()), Err)
        })
    })
}

/// A command's body as the controller gets it: MXNet's `RunServer` passes
/// `body.c_str()` of the received string, which ends at its first NUL byte.
fn controller_body(body: &[u8]) -> CString {
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    CString::new(&body[..end]).expect("no NUL before the end")
}

/// Sends a command to the servers (no-op for local stores).
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreSendCommmandToServers(
    handle: KVStoreHandle,
    cmd_id: c_int,
    cmd_body: *const c_char,
) -> c_int {
    api_call("MXKVStoreSendCommmandToServers", || {
        let kv = kvstore(handle)?;
        // SAFETY: NULL (checked) or a C string, per the contract.
        let body = unsafe { cstr(cmd_body, "cmd_body")? };
        kv.store.send_command_to_servers(cmd_id, body)
    })
}

/// The number of dead nodes in `node_id`'s group (0 for local stores).
#[no_mangle]
pub unsafe extern "C" fn MXKVStoreGetNumDeadNode(
    handle: KVStoreHandle,
    node_id: c_int,
    number: *mut c_int,
    timeout_sec: c_int,
) -> c_int {
    api_call("MXKVStoreGetNumDeadNode", || {
        let n = kvstore(handle)?
            .store
            .num_dead_nodes(node_id, timeout_sec)?;
        // SAFETY: `number` is NULL (checked) or writable, per the contract.
        unsafe { write_out(number, n, "number") }
    })
}

#[cfg(test)]
mod tests {
    use super::StoreCount;

    /// A body holding a NUL byte reached the controller as "" (MXNet's
    /// controller gets the bytes before the NUL).
    #[test]
    fn a_controller_body_ends_at_its_first_nul() {
        assert_eq!(super::controller_body(b"lr=0.1").as_bytes(), b"lr=0.1");
        assert_eq!(super::controller_body(b"ab\0cd\0").as_bytes(), b"ab");
        assert_eq!(super::controller_body(b"\0x").as_bytes(), b"");
        assert_eq!(super::controller_body(b"").as_bytes(), b"");
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// The last store is freed while another thread creates one: the Free
    /// switches keeping off and, while it does, the Create comes in. Keeping
    /// must end on, with one store. (Before, the Free read the count and then
    /// switched without a lock: the Create switched keeping on in between
    /// and the Free's switch turned it off with the new store alive.)
    #[test]
    fn keeping_stays_on_when_a_create_crosses_the_last_free() {
        let count = Arc::new(StoreCount(std::sync::Mutex::new(0)));
        let on = Arc::new(AtomicBool::new(false));
        let set = |on: &Arc<AtomicBool>| {
            let on = on.clone();
            move |k: bool| on.store(k, Ordering::SeqCst)
        };
        count.created(set(&on));
        assert!(on.load(Ordering::SeqCst));
        let mut creator = None;
        count.freed(|k| {
            assert!(!k);
            // another thread creates a store now
            let (c, o) = (count.clone(), on.clone());
            let (tx, rx) = mpsc::channel();
            creator = Some(std::thread::spawn(move || {
                c.created(move |k| o.store(k, Ordering::SeqCst));
                let _ = tx.send(());
            }));
            // with the switch made under the count's lock the Create waits
            // (this wait then times out); without, it is done in time
            let _ = rx.recv_timeout(Duration::from_millis(300));
            on.store(k, Ordering::SeqCst);
        });
        creator.expect("spawned").join().unwrap();
        assert_eq!(*count.lock(), 1);
        assert!(
            on.load(Ordering::SeqCst),
            "keeping is off with a store alive"
        );
        count.freed(set(&on));
        assert!(
            !on.load(Ordering::SeqCst),
            "keeping stayed on with no store"
        );
        assert_eq!(*count.lock(), 0);
    }
}
