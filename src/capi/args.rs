//! Converting C arguments: the only place that reads through caller
//! pointers. Each function checks for NULL and names the argument.

use super::{KVStoreHandle, NDArrayHandle};
use crate::error::{Error, Result};
use crate::ndarray::NDArray;
use crate::registry::Registry;
use crate::store::{Keys, KvStore};
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::sync::Arc;

/// A store as the C layer holds it: the store and its type string for
/// `MXKVStoreGetType` (valid until `MXKVStoreFree`).
pub(crate) struct KvHandle {
    pub store: Arc<dyn KvStore>,
    pub type_c: CString,
}

pub(crate) static KVSTORES: Registry<Arc<KvHandle>> = Registry::new(0x4b);
pub(crate) static NDARRAYS: Registry<NDArray> = Registry::new(0x4e);

pub(crate) fn kvstore(h: KVStoreHandle) -> Result<Arc<KvHandle>> {
    KVSTORES
        .get(h as usize)
        .map_err(|e| Error::new(format!("KVStoreHandle {e}")))
}

pub(crate) fn ndarray(h: NDArrayHandle, name: &str) -> Result<NDArray> {
    NDARRAYS
        .get(h as usize)
        .map_err(|e| Error::new(format!("{name} (NDArrayHandle) {e}")))
}

/// Registers `a` and returns its new handle.
pub(crate) fn new_handle(a: NDArray) -> NDArrayHandle {
    NDARRAYS.insert(a) as NDArrayHandle
}

/// Reads `len` items at `ptr`; `len == 0` accepts NULL.
///
/// # Safety
/// `ptr` is NULL or valid for reads of `len` items for `'a`.
pub(crate) unsafe fn slice<'a, T>(ptr: *const T, len: usize, name: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::new(format!(
            "{name} is NULL but {len} items were announced"
        )));
    }
    // SAFETY: non-NULL and, by the caller's contract, valid for `len` items.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A NUL-terminated string's bytes.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn cstr<'a>(ptr: *const c_char, name: &str) -> Result<&'a [u8]> {
    if ptr.is_null() {
        return Err(Error::new(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    Ok(unsafe { CStr::from_ptr(ptr) }.to_bytes())
}

/// `len` strings.
///
/// # Safety
/// `ptr` is NULL or valid for `len` pointers, each NULL or a NUL-terminated string.
pub(crate) unsafe fn cstrs<'a>(
    ptr: *const *const c_char,
    len: usize,
    name: &str,
) -> Result<Vec<&'a [u8]>> {
    // SAFETY: forwarded contract.
    let ptrs = unsafe { slice(ptr, len, name)? };
    ptrs.iter()
        .enumerate()
        .map(|(i, &p)| {
            if p.is_null() {
                return Err(Error::new(format!("{name}[{i}] is NULL")));
            }
            // SAFETY: non-NULL and NUL-terminated, by the caller's contract.
            Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
        })
        .collect()
}

/// `len` NDArray handles, resolved.
///
/// # Safety
/// `ptr` is NULL or valid for `len` handles.
pub(crate) unsafe fn ndarrays(
    ptr: *const NDArrayHandle,
    len: usize,
    name: &str,
) -> Result<Vec<NDArray>> {
    // SAFETY: forwarded contract.
    let hs = unsafe { slice(ptr, len, name)? };
    hs.iter()
        .enumerate()
        .map(|(i, &h)| {
            NDARRAYS
                .get(h as usize)
                .map_err(|e| Error::new(format!("{name}[{i}] (NDArrayHandle) {e}")))
        })
        .collect()
}

/// Writes an output; NULL is an error.
///
/// # Safety
/// `ptr` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(ptr: *mut T, value: T, name: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::new(format!("{name} (output pointer) is NULL")));
    }
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Keys of one call, owned long enough to be borrowed as [`Keys`].
pub(crate) enum KeyArgs<'a> {
    Int(&'a [i32]),
    Str(Vec<&'a [u8]>),
}

impl KeyArgs<'_> {
    pub fn keys(&self) -> Keys<'_> {
        match self {
            KeyArgs::Int(k) => Keys::Int(k),
            KeyArgs::Str(k) => Keys::Str(k),
        }
    }
}

/// # Safety
/// As [`slice`].
pub(crate) unsafe fn int_keys<'a>(ptr: *const c_int, len: u32, name: &str) -> Result<KeyArgs<'a>> {
    // SAFETY: forwarded contract.
    Ok(KeyArgs::Int(unsafe { slice(ptr, len as usize, name)? }))
}

/// # Safety
/// As [`cstrs`].
pub(crate) unsafe fn str_keys<'a>(
    ptr: *const *const c_char,
    len: u32,
    name: &str,
) -> Result<KeyArgs<'a>> {
    // SAFETY: forwarded contract.
    Ok(KeyArgs::Str(unsafe { cstrs(ptr, len as usize, name)? }))
}
