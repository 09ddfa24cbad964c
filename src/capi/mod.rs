//! The C API: MXNet 1.9.1's `MXKVStore*` and NDArray entry points with their
//! exact signatures. This is the only module with `extern "C"`, raw pointers
//! and `unsafe`.
//!
//! # Safety contract of every export
//! Each pointer argument must be NULL or valid for the number of items the
//! call announces (`num` keys, `num` handles, …), as in MXNet's `c_api.h`;
//! strings must be NUL-terminated. NULL where an item is required, handles
//! this library did not make, and freed handles are reported as errors
//! (return -1, message in `MXGetLastError`), never dereferenced.
//!
//! Every entry point runs inside [`boundary::api_call`]: panics are caught,
//! errors become `-1` plus a thread-local message; outputs are written only
//! on success.
#![allow(unsafe_code)] // the one module where `unsafe` is allowed (lib.rs denies it)
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod args;
pub mod bigalloc;
mod boundary;
mod env;
mod kvstore;
mod ndarray;
mod random;
pub mod zmq_frame;

use std::os::raw::{c_char, c_int, c_void};

/// An NDArray handle (`void*`), as in MXNet.
pub type NDArrayHandle = *mut c_void;
/// A KVStore handle (`void*`), as in MXNet.
pub type KVStoreHandle = *mut c_void;
/// MXNet's `mx_uint`.
pub type mx_uint = u32;

/// `typedef void (MXKVStoreUpdater)(int key, NDArrayHandle recv, NDArrayHandle local, void *handle);`
/// (NULL allowed here; the setters refuse it.)
pub type MXKVStoreUpdater = Option<
    unsafe extern "C" fn(
        key: c_int,
        recv: NDArrayHandle,
        local: NDArrayHandle,
        handle: *mut c_void,
    ),
>;
/// `typedef void (MXKVStoreStrUpdater)(const char* key, NDArrayHandle recv, NDArrayHandle local, void *handle);`
pub type MXKVStoreStrUpdater = Option<
    unsafe extern "C" fn(
        key: *const c_char,
        recv: NDArrayHandle,
        local: NDArrayHandle,
        handle: *mut c_void,
    ),
>;
/// `typedef void (MXKVStoreServerController)(int head, const char *body, void *controller_handle);`
pub type MXKVStoreServerController =
    Option<unsafe extern "C" fn(head: c_int, body: *const c_char, controller_handle: *mut c_void)>;

pub use boundary::MXGetLastError;
