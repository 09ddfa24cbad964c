//! The `MXNDArray*` functions a KVStore binding needs, in `c_api.h` order.

use super::args::{cstr, cstrs, ndarray, ndarrays, new_handle, slice, write_out, NDARRAYS};
use super::boundary::{
    api_call, api_call_light, hold_orphans_for_fork, per_thread, Orphans, OrphansHold,
};
use super::NDArrayHandle;
use crate::error::{Error, Result};
use crate::ndarray::dtype::DType;
use crate::ndarray::{params, Context, NDArray, Shape, StorageType};
use std::cell::RefCell;
use std::ffi::{CString, OsStr};
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

thread_local! {
    // Buffers behind the pointers the shape and load functions return: valid
    // until the next such call on the same thread (as in MXNet).
    static SHAPE_U32: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    static SHAPE_I32: RefCell<Vec<c_int>> = const { RefCell::new(Vec::new()) };
    static SHAPE_I64: RefCell<Vec<i64>> = const { RefCell::new(Vec::new()) };
    static LOADED: RefCell<Loaded> = const {
        RefCell::new(Loaded { handles: Vec::new(), names: Vec::new(), name_ptrs: Vec::new() })
    };
}

// The same buffers for calls made after the thread-locals are destroyed (from
// a destructor at thread exit or at `exit()`): see `per_thread`. Their locks
// are held across `fork()` ([`hold_for_fork`]).
static SHAPE_U32_ORPHANS: Orphans<Vec<u32>> = Orphans::new(std::collections::BTreeMap::new());
static SHAPE_I32_ORPHANS: Orphans<Vec<c_int>> = Orphans::new(std::collections::BTreeMap::new());
static SHAPE_I64_ORPHANS: Orphans<Vec<i64>> = Orphans::new(std::collections::BTreeMap::new());
static LOADED_ORPHANS: Orphans<Loaded> = Orphans::new(std::collections::BTreeMap::new());

/// The locks of the tables above, held: see [`hold_for_fork`].
pub(super) struct ForkHold {
    _u32: OrphansHold<Vec<u32>>,
    _i32: OrphansHold<Vec<c_int>>,
    _i64: OrphansHold<Vec<i64>>,
    _loaded: OrphansHold<Loaded>,
}

/// Waits until no other thread uses the tables above and keeps every other
/// thread out until the hold is dropped (the C API's `pthread_atfork`
/// handlers: a forked child must not find one held by a thread of the
/// parent). No thread holds two of them at once.
pub(super) fn hold_for_fork() -> ForkHold {
    ForkHold {
        _u32: hold_orphans_for_fork(&SHAPE_U32_ORPHANS),
        _i32: hold_orphans_for_fork(&SHAPE_I32_ORPHANS),
        _i64: hold_orphans_for_fork(&SHAPE_I64_ORPHANS),
        _loaded: hold_orphans_for_fork(&LOADED_ORPHANS),
    }
}

/// The handles, names and name pointers `MXNDArrayLoad` returned last.
#[derive(Default)]
struct Loaded {
    handles: Vec<NDArrayHandle>,
    names: Vec<CString>,
    name_ptrs: Vec<*const c_char>,
}

// SAFETY: the handles are registry ids, not pointers to thread-bound data,
// and the name pointers point into `names`, which moves with them; a
// `Loaded` is only reached by the thread it belongs to (through its
// thread-local or its thread-id entry of `LOADED_ORPHANS`).
unsafe impl Send for Loaded {}

fn create(
    shape: Shape,
    dev_type: c_int,
    dev_id: c_int,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::new("out (output pointer) is NULL"));
    }
    let a = NDArray::zeros(
        shape,
        DType::from_code(dtype)?,
        Context::create(dev_type, dev_id)?,
    )?;
    // SAFETY: `out` is non-NULL and writable, per the contract.
    unsafe { write_out(out, new_handle(a), "out") }
}

/// A handle with no shape and no storage.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateNone(out: *mut NDArrayHandle) -> c_int {
    api_call_light("MXNDArrayCreateNone", || {
        if out.is_null() {
            return Err(Error::new("out (output pointer) is NULL"));
        }
        // SAFETY: `out` is non-NULL and writable, per the contract.
        unsafe { write_out(out, new_handle(NDArray::none()), "out") }
    })
}

/// A float32 array (zero-filled; `delay_alloc` is accepted and ignored).
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreate(
    shape: *const u32,
    ndim: u32,
    dev_type: c_int,
    dev_id: c_int,
    _delay_alloc: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayCreate", || {
        // SAFETY: `shape` holds `ndim` dims, per the contract.
        let dims = unsafe { slice(shape, ndim as usize, "shape")? };
        create(
            Shape(dims.iter().map(|&d| i64::from(d)).collect()),
            dev_type,
            dev_id,
            0,
            out,
        )
    })
}

/// An array of `dtype` (mshadow code 0–12), zero-filled.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateEx(
    shape: *const u32,
    ndim: u32,
    dev_type: c_int,
    dev_id: c_int,
    _delay_alloc: c_int,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayCreateEx", || {
        // SAFETY: `shape` holds `ndim` dims, per the contract.
        let dims = unsafe { slice(shape, ndim as usize, "shape")? };
        create(
            Shape(dims.iter().map(|&d| i64::from(d)).collect()),
            dev_type,
            dev_id,
            dtype,
            out,
        )
    })
}

/// [`MXNDArrayCreateEx`] with 64-bit dims.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayCreateEx64(
    shape: *const i64,
    ndim: c_int,
    dev_type: c_int,
    dev_id: c_int,
    _delay_alloc: c_int,
    dtype: c_int,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayCreateEx64", || {
        let n =
            usize::try_from(ndim).map_err(|_| Error::new(format!("ndim {ndim} is negative")))?;
        // SAFETY: `shape` holds `ndim` dims, per the contract.
        let dims = unsafe { slice(shape, n, "shape")? };
        create(Shape(dims.to_vec()), dev_type, dev_id, dtype, out)
    })
}

#[allow(clippy::too_many_arguments)]
fn create_sparse(
    storage_type: c_int,
    shape: Shape,
    dev_type: c_int,
    dev_id: c_int,
    dtype: c_int,
    aux_types: Vec<c_int>,
    aux_shapes: Vec<Shape>,
    out: *mut NDArrayHandle,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::new("out (output pointer) is NULL"));
    }
    let aux_types = aux_types
        .into_iter()
        .map(DType::from_code)
        .collect::<Result<Vec<_>>>()?;
    if storage_type == StorageType::Default.code() {
        // MXNet 1.9.1's sparse constructor with kDefaultStorage makes a
        // dense array of the shape, dtype and context; the aux arguments
        // are read and otherwise unused (they do not make it sparse).
        let a = NDArray::zeros(
            shape,
            DType::from_code(dtype)?,
            Context::create(dev_type, dev_id)?,
        )?;
        // SAFETY: `out` is non-NULL and writable, per the contract.
        return unsafe { write_out(out, new_handle(a), "out") };
    }
    let stype = StorageType::sparse_from_code(storage_type)?;
    let a = NDArray::sparse_zeros(
        stype,
        shape,
        DType::from_code(dtype)?,
        Context::create(dev_type, dev_id)?,
        &aux_types,
        &aux_shapes,
    )?;
    // SAFETY: `out` is non-NULL and writable, per the contract.
    unsafe { write_out(out, new_handle(a), "out") }
}

/// Splits the concatenated aux shapes by their ndims.
fn split_aux_shapes(ndims: &[usize], dims: &[i64]) -> Result<Vec<Shape>> {
    let mut at = 0;
    ndims
        .iter()
        .map(|&n| {
            let s = dims
                .get(at..at + n)
                .ok_or_else(|| Error::new("aux_shape holds fewer dims than aux_ndims announce"))?;
            at += n;
            Ok(Shape(s.to_vec()))
        })
        .collect()
}

/// A sparse array: `storage_type` 1 (row_sparse: one int64 aux array, the
/// row indices, of shape `{nnz}`) or 2 (csr: int64 indptr and indices).
/// The parts are zero-filled; fill them with `MXNDArraySyncCopyFromNDArray`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn MXNDArrayCreateSparseEx(
    storage_type: c_int,
    shape: *const u32,
    ndim: u32,
    dev_type: c_int,
    dev_id: c_int,
    _delay_alloc: c_int,
    dtype: c_int,
    num_aux: u32,
    aux_type: *mut c_int,
    aux_ndims: *mut u32,
    aux_shape: *const u32,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayCreateSparseEx", || {
        // SAFETY: `shape` holds `ndim` dims, `aux_type` and `aux_ndims` hold
        // `num_aux` items, `aux_shape` the sum of `aux_ndims`, per the contract.
        let (dims, types, ndims) = unsafe {
            (
                slice(shape, ndim as usize, "shape")?,
                slice(aux_type, num_aux as usize, "aux_type")?,
                slice(aux_ndims, num_aux as usize, "aux_ndims")?,
            )
        };
        let ndims: Vec<usize> = ndims.iter().map(|&n| n as usize).collect();
        let total = ndims.iter().sum::<usize>();
        // SAFETY: as above.
        let aux_dims = unsafe { slice(aux_shape, total, "aux_shape")? };
        let aux_dims: Vec<i64> = aux_dims.iter().map(|&d| i64::from(d)).collect();
        let shape = Shape(dims.iter().map(|&d| i64::from(d)).collect());
        create_sparse(
            storage_type,
            shape,
            dev_type,
            dev_id,
            dtype,
            types.to_vec(),
            split_aux_shapes(&ndims, &aux_dims)?,
            out,
        )
    })
}

/// [`MXNDArrayCreateSparseEx`] with 64-bit dims.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn MXNDArrayCreateSparseEx64(
    storage_type: c_int,
    shape: *const i64,
    ndim: c_int,
    dev_type: c_int,
    dev_id: c_int,
    _delay_alloc: c_int,
    dtype: c_int,
    num_aux: u32,
    aux_type: *mut c_int,
    aux_ndims: *mut c_int,
    aux_shape: *const i64,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayCreateSparseEx64", || {
        let n =
            usize::try_from(ndim).map_err(|_| Error::new(format!("ndim {ndim} is negative")))?;
        // SAFETY: as for MXNDArrayCreateSparseEx.
        let (dims, types, ndims) = unsafe {
            (
                slice(shape, n, "shape")?,
                slice(aux_type, num_aux as usize, "aux_type")?,
                slice(aux_ndims, num_aux as usize, "aux_ndims")?,
            )
        };
        let ndims = ndims
            .iter()
            .map(|&n| usize::try_from(n).map_err(|_| Error::new("negative aux ndim")))
            .collect::<Result<Vec<_>>>()?;
        let total = ndims.iter().sum::<usize>();
        // SAFETY: as above.
        let aux_dims = unsafe { slice(aux_shape, total, "aux_shape")? };
        create_sparse(
            storage_type,
            Shape(dims.to_vec()),
            dev_type,
            dev_id,
            dtype,
            types.to_vec(),
            split_aux_shapes(&ndims, aux_dims)?,
            out,
        )
    })
}

/// Copies `size` elements from `data` into the array (`size` must equal the
/// array's element count).
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySyncCopyFromCPU(
    handle: NDArrayHandle,
    data: *const c_void,
    size: usize,
) -> c_int {
    api_call("MXNDArraySyncCopyFromCPU", || {
        let a = ndarray(handle, "handle")?;
        let n = a.bytes_for_copy("copy into", size)?;
        // SAFETY: `data` holds `size` elements of the array's dtype, per the contract.
        let bytes = unsafe { slice(data.cast::<u8>(), n, "data")? };
        a.copy_from_bytes(bytes)
    })
}

/// Copies the array into `data` (`size` elements).
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySyncCopyToCPU(
    handle: NDArrayHandle,
    data: *mut c_void,
    size: usize,
) -> c_int {
    api_call("MXNDArraySyncCopyToCPU", || {
        let a = ndarray(handle, "handle")?;
        let n = a.bytes_for_copy("copy from", size)?;
        if n == 0 {
            return Ok(());
        }
        if data.is_null() {
            return Err(Error::new("data is NULL"));
        }
        // SAFETY: `data` is non-NULL and writable for `size` elements, per the contract.
        let out = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), n) };
        a.copy_to_bytes(out)
    })
}

/// Copies `src` into `dst` (`i == -1`: the data; aux arrays are for sparse
/// arrays). Shapes must match, except that a dense `dst` of the shape of a
/// sparse `src`'s stored values gets those (MXNet copies `src.data()`); the
/// dtype is converted.
#[no_mangle]
pub extern "C" fn MXNDArraySyncCopyFromNDArray(
    handle_dst: NDArrayHandle,
    handle_src: NDArrayHandle,
    i: c_int,
) -> c_int {
    api_call("MXNDArraySyncCopyFromNDArray", || {
        let dst = ndarray(handle_dst, "handle_dst")?;
        let src = ndarray(handle_src, "handle_src")?;
        dst.sync_copy_from_part(i, &src)
    })
}

fn shape_of(handle: NDArrayHandle) -> Result<Vec<i64>> {
    Ok(ndarray(handle, "handle")?.shape().dims().to_vec())
}

/// The shape as `uint32_t` dims, in a buffer valid until the next shape call
/// on this thread.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShape(
    handle: NDArrayHandle,
    out_dim: *mut u32,
    out_pdata: *mut *const u32,
) -> c_int {
    api_call_light("MXNDArrayGetShape", || {
        let dims = shape_of(handle)?
            .into_iter()
            .map(|d| {
                u32::try_from(d).map_err(|_| {
                    Error::new(format!(
                        "dimension {d} does not fit in uint32; use MXNDArrayGetShapeEx64"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if out_dim.is_null() || out_pdata.is_null() {
            return Err(Error::new("out_dim or out_pdata (output pointer) is NULL"));
        }
        per_thread(&SHAPE_U32, &SHAPE_U32_ORPHANS, |b| {
            *b = dims;
            // SAFETY: both outputs are non-NULL and writable, per the contract.
            unsafe {
                write_out(out_dim, b.len() as u32, "out_dim")?;
                write_out(out_pdata, b.as_ptr(), "out_pdata")
            }
        })
    })
}

/// The shape as `int` dims.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShapeEx(
    handle: NDArrayHandle,
    out_dim: *mut c_int,
    out_pdata: *mut *const c_int,
) -> c_int {
    api_call_light("MXNDArrayGetShapeEx", || {
        let dims = shape_of(handle)?
            .into_iter()
            .map(|d| {
                c_int::try_from(d).map_err(|_| {
                    Error::new(format!(
                        "dimension {d} does not fit in int; use MXNDArrayGetShapeEx64"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if out_dim.is_null() || out_pdata.is_null() {
            return Err(Error::new("out_dim or out_pdata (output pointer) is NULL"));
        }
        per_thread(&SHAPE_I32, &SHAPE_I32_ORPHANS, |b| {
            *b = dims;
            // SAFETY: both outputs are non-NULL and writable, per the contract.
            unsafe {
                write_out(out_dim, b.len() as c_int, "out_dim")?;
                write_out(out_pdata, b.as_ptr(), "out_pdata")
            }
        })
    })
}

/// The shape as `int64_t` dims.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetShapeEx64(
    handle: NDArrayHandle,
    out_dim: *mut c_int,
    out_pdata: *mut *const i64,
) -> c_int {
    api_call_light("MXNDArrayGetShapeEx64", || {
        let dims = shape_of(handle)?;
        if out_dim.is_null() || out_pdata.is_null() {
            return Err(Error::new("out_dim or out_pdata (output pointer) is NULL"));
        }
        per_thread(&SHAPE_I64, &SHAPE_I64_ORPHANS, |b| {
            *b = dims;
            // SAFETY: both outputs are non-NULL and writable, per the contract.
            unsafe {
                write_out(out_dim, b.len() as c_int, "out_dim")?;
                write_out(out_pdata, b.as_ptr(), "out_pdata")
            }
        })
    })
}

/// The dtype code (0–12); -1 for an empty array (`MXNDArrayCreateNone`), as
/// in MXNet.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetDType(handle: NDArrayHandle, out_dtype: *mut c_int) -> c_int {
    api_call_light("MXNDArrayGetDType", || {
        let d = ndarray(handle, "handle")?.dtype_code();
        // SAFETY: NULL (checked) or writable, per the contract.
        unsafe { write_out(out_dtype, d, "out_dtype") }
    })
}

/// The context (device type and id); `(0, 0)` for an empty array
/// (`MXNDArrayCreateNone`), as in MXNet.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetContext(
    handle: NDArrayHandle,
    out_dev_type: *mut c_int,
    out_dev_id: *mut c_int,
) -> c_int {
    api_call_light("MXNDArrayGetContext", || {
        let (dev_type, dev_id) = ndarray(handle, "handle")?.context_codes();
        if out_dev_type.is_null() || out_dev_id.is_null() {
            return Err(Error::new(
                "out_dev_type or out_dev_id (output pointer) is NULL",
            ));
        }
        // SAFETY: both non-NULL and writable, per the contract.
        unsafe {
            write_out(out_dev_type, dev_type, "out_dev_type")?;
            write_out(out_dev_id, dev_id, "out_dev_id")
        }
    })
}

/// The storage type: -1 undefined, 0 dense, 1 row_sparse, 2 csr.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetStorageType(
    handle: NDArrayHandle,
    out_storage_type: *mut c_int,
) -> c_int {
    api_call_light("MXNDArrayGetStorageType", || {
        let s = ndarray(handle, "handle")?.stype().code();
        // SAFETY: NULL (checked) or writable, per the contract.
        unsafe { write_out(out_storage_type, s, "out_storage_type") }
    })
}

/// The address of a dense array's data, valid while any handle to the array
/// lives. Writes through it bypass the library's locks: do not write while
/// another thread uses the array. An array with no elements gives NULL, as
/// in MXNet.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetData(
    handle: NDArrayHandle,
    out_pdata: *mut *mut c_void,
) -> c_int {
    api_call("MXNDArrayGetData", || {
        let a = ndarray(handle, "handle")?;
        a.ensure_dense("get the data of")?;
        let p = if a.size() == 0 {
            std::ptr::null_mut()
        } else {
            a.write().as_mut_ptr().cast::<c_void>()
        };
        // SAFETY: NULL (checked) or writable, per the contract.
        unsafe { write_out(out_pdata, p, "out_pdata") }
    })
}

/// Waits for pending writes: every operation completes before its call
/// returns, so this only checks the handle.
#[no_mangle]
pub extern "C" fn MXNDArrayWaitToRead(handle: NDArrayHandle) -> c_int {
    api_call_light("MXNDArrayWaitToRead", || {
        ndarray(handle, "handle").map(drop)
    })
}

/// Waits for pending reads and writes (see [`MXNDArrayWaitToRead`]).
#[no_mangle]
pub extern "C" fn MXNDArrayWaitToWrite(handle: NDArrayHandle) -> c_int {
    api_call_light("MXNDArrayWaitToWrite", || {
        ndarray(handle, "handle").map(drop)
    })
}

/// Waits for all pending operations.
#[no_mangle]
pub extern "C" fn MXNDArrayWaitAll() -> c_int {
    0
}

fn aux_type(handle: NDArrayHandle, i: usize, out_type: *mut c_int) -> Result<()> {
    let t = ndarray(handle, "handle")?.aux_type(i)?;
    // SAFETY: NULL (checked) or writable, per the contract.
    unsafe { write_out(out_type, t.code(), "out_type") }
}

fn aux_ndarray(handle: NDArrayHandle, i: usize, out: *mut NDArrayHandle) -> Result<()> {
    let aux = ndarray(handle, "handle")?.aux_ndarray(i)?;
    if out.is_null() {
        return Err(Error::new("out (output pointer) is NULL"));
    }
    // SAFETY: non-NULL and writable, per the contract.
    unsafe { write_out(out, new_handle(aux), "out") }
}

/// The dtype of aux array `i` (sparse arrays: 6, int64).
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetAuxType(
    handle: NDArrayHandle,
    i: u32,
    out_type: *mut c_int,
) -> c_int {
    api_call_light("MXNDArrayGetAuxType", || {
        aux_type(handle, i as usize, out_type)
    })
}

/// [`MXNDArrayGetAuxType`] with a 64-bit index.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetAuxType64(
    handle: NDArrayHandle,
    i: i64,
    out_type: *mut c_int,
) -> c_int {
    api_call_light("MXNDArrayGetAuxType64", || {
        aux_type(
            handle,
            usize::try_from(i).map_err(|_| Error::new(format!("aux index {i} is negative")))?,
            out_type,
        )
    })
}

/// A new handle on aux array `i` of a sparse array (it shares the storage
/// until an operation replaces the array's parts).
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetAuxNDArray(
    handle: NDArrayHandle,
    i: u32,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayGetAuxNDArray", || {
        aux_ndarray(handle, i as usize, out)
    })
}

/// [`MXNDArrayGetAuxNDArray`] with a 64-bit index.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetAuxNDArray64(
    handle: NDArrayHandle,
    i: i64,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayGetAuxNDArray64", || {
        aux_ndarray(
            handle,
            usize::try_from(i).map_err(|_| Error::new(format!("aux index {i} is negative")))?,
            out,
        )
    })
}

/// Checks a sparse array's indices (`full_check`: sorted, unique, in range).
#[no_mangle]
pub extern "C" fn MXNDArraySyncCheckFormat(handle: NDArrayHandle, full_check: bool) -> c_int {
    api_call("MXNDArraySyncCheckFormat", || {
        let a = ndarray(handle, "handle")?;
        a.check_format(full_check)
    })
}

/// A new handle sharing the array's data.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayGetDataNDArray(
    handle: NDArrayHandle,
    out: *mut NDArrayHandle,
) -> c_int {
    api_call("MXNDArrayGetDataNDArray", || {
        let data = ndarray(handle, "handle")?.data_ndarray()?;
        if out.is_null() {
            return Err(Error::new("out (output pointer) is NULL"));
        }
        // SAFETY: non-NULL and writable, per the contract.
        unsafe { write_out(out, new_handle(data), "out") }
    })
}

/// Saves arrays (and names, unless `keys` is NULL) in MXNet's `.params` format.
/// Everything is checked before the file is opened; the arrays are streamed
/// to it, and a regular file left half-written by a failed write is removed.
#[no_mangle]
pub unsafe extern "C" fn MXNDArraySave(
    fname: *const c_char,
    num_args: u32,
    args: *mut NDArrayHandle,
    keys: *mut *const c_char,
) -> c_int {
    api_call("MXNDArraySave", || {
        // SAFETY: `fname` is a C string, `args` holds `num_args` handles and
        // `keys` is NULL or holds `num_args` strings, per the contract.
        let (path, arrays, names) = unsafe {
            let path = cstr(fname, "fname")?;
            let arrays = ndarrays(args, num_args as usize, "args")?;
            let names = if keys.is_null() {
                Vec::new()
            } else {
                cstrs(keys, num_args as usize, "keys")?
            };
            (path, arrays, names)
        };
        let names: Vec<Vec<u8>> = names.into_iter().map(<[u8]>::to_vec).collect();
        params::save_file(Path::new(OsStr::from_bytes(path)), &arrays, &names)
    })
}

/// Loads a `.params` file (formats V2, and V1 and V0 as MXNet 1.9.1 loads
/// them). The arrays are new handles the caller frees; the handle and name
/// arrays stay valid until the next load on this thread. A name holding a
/// NUL byte is cut there, as in MXNet.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayLoad(
    fname: *const c_char,
    out_size: *mut u32,
    out_arr: *mut *mut NDArrayHandle,
    out_name_size: *mut u32,
    out_names: *mut *mut *const c_char,
) -> c_int {
    api_call("MXNDArrayLoad", || {
        // SAFETY: `fname` is NULL (checked) or a C string, per the contract.
        let path = unsafe { cstr(fname, "fname")? };
        let outs = (out_size, out_arr, out_name_size, out_names);
        check_load_outs(outs)?;
        let loaded = params::load_file(Path::new(OsStr::from_bytes(path)))?;
        // SAFETY: the outputs are non-NULL (checked) and writable, per the contract.
        unsafe { return_loaded(loaded, outs) }
    })
}

/// Loads `.params` bytes from memory, as MXNet 1.9.1's function of this name
/// (`nd.load_frombuffer`): the arrays are read from `size` bytes at
/// `ndarray_buffer` (copied once, into the arrays), with what
/// [`MXNDArrayLoad`] returns.
#[no_mangle]
pub unsafe extern "C" fn MXNDArrayLoadFromBuffer(
    ndarray_buffer: *const c_void,
    size: usize,
    out_size: *mut u32,
    out_arr: *mut *mut NDArrayHandle,
    out_name_size: *mut u32,
    out_names: *mut *mut *const c_char,
) -> c_int {
    api_call("MXNDArrayLoadFromBuffer", || {
        if ndarray_buffer.is_null() {
            return Err(Error::new("ndarray_buffer (the bytes to load) is NULL"));
        }
        if size > isize::MAX as usize {
            return Err(Error::new(format!(
                "size {size} is more than a buffer can hold"
            )));
        }
        let outs = (out_size, out_arr, out_name_size, out_names);
        check_load_outs(outs)?;
        // SAFETY: `ndarray_buffer` is non-NULL (checked) and holds `size`
        // readable bytes that nobody writes during the call, per the contract.
        let bytes = unsafe { std::slice::from_raw_parts(ndarray_buffer.cast::<u8>(), size) };
        let loaded = params::load(bytes)?;
        // SAFETY: the outputs are non-NULL (checked) and writable, per the contract.
        unsafe { return_loaded(loaded, outs) }
    })
}

/// The four outputs of a load: count, handles, name count, names.
type LoadOuts = (
    *mut u32,
    *mut *mut NDArrayHandle,
    *mut u32,
    *mut *mut *const c_char,
);

fn check_load_outs((size, arr, name_size, names): LoadOuts) -> Result<()> {
    if size.is_null() || arr.is_null() || name_size.is_null() || names.is_null() {
        return Err(Error::new("an output pointer is NULL"));
    }
    Ok(())
}

/// Hands loaded arrays and names out as new handles and C strings, which
/// stay valid until the next load on this thread.
///
/// # Safety
/// The outputs are non-NULL ([`check_load_outs`]) and writable.
unsafe fn return_loaded(
    (arrays, names): params::Loaded,
    (out_size, out_arr, out_name_size, out_names): LoadOuts,
) -> Result<()> {
    // A name holding a NUL byte ends there, as MXNet's C strings of it do.
    let names = names
        .into_iter()
        .map(|mut n| {
            n.truncate(n.iter().position(|&b| b == 0).unwrap_or(n.len()));
            CString::new(n).map_err(|_| Error::new("a name holds a NUL byte"))
        })
        .collect::<Result<Vec<_>>>()?;
    let n = u32::try_from(arrays.len()).map_err(|_| Error::new("too many arrays"))?;
    per_thread(&LOADED, &LOADED_ORPHANS, |l| {
        l.handles = arrays.into_iter().map(new_handle).collect();
        l.name_ptrs = names.iter().map(|c| c.as_ptr()).collect();
        l.names = names;
        // SAFETY: all four outputs are non-NULL and writable, per the
        // function's contract.
        unsafe {
            write_out(out_size, n, "out_size")?;
            write_out(out_arr, l.handles.as_mut_ptr(), "out_arr")?;
            write_out(out_name_size, l.name_ptrs.len() as u32, "out_name_size")?;
            write_out(out_names, l.name_ptrs.as_mut_ptr(), "out_names")
        }
    })
}

/// Frees a handle. Other handles on the same array stay valid. NULL is
/// accepted; a stale or foreign handle is an error.
#[no_mangle]
pub extern "C" fn MXNDArrayFree(handle: NDArrayHandle) -> c_int {
    api_call_light("MXNDArrayFree", || {
        if handle.is_null() {
            return Ok(());
        }
        NDARRAYS
            .remove(handle as usize)
            .map(drop)
            .map_err(|e| Error::new(format!("handle (NDArrayHandle) {e}")))
    })
}

/// libmxkv only (not in MXNet's C API): MXNet 1.9.1's CPU `sum` of each
/// column of a row-major matrix, for frontends that reproduce MXNet's `sum`
/// operator (mxkv's Python `NDArray.sum`). Each column is one sequential
/// Kahan chain, top to bottom, in the element type, as MXNet's
/// `seq_reduce_assign` runs mshadow's `red::sum` from `s = r = 0`:
/// `y = x - r; t = s + y; r = isinf(t) ? 0 : (t - s) - y; s = t`, each
/// operation rounded to the element type (float16: in float, then rounded
/// to nearest even), NaN bits passed on as MXNet's x86 build passes them
/// (with two NaN operands `a + b` and `a - b` give `a`'s, quieted; `inf -
/// inf` the default NaN). A whole-array sum is one column (`num_cols` 1).
/// Bit for bit what MXNet 1.9.1 gives; MXNet has no such function.
///
/// `dtype`: 0 (float32), 1 (float64) or 2 (float16); `rows`: `num_rows *
/// num_cols` elements (native byte order, any alignment); `out`: room for
/// `num_cols` elements of `dtype`, not overlapping `rows`, where the sums are
/// written. Returns 0, or -1 (`MXGetLastError`) for another dtype, a NULL
/// pointer where elements are announced, sizes beyond memory or overlapping
/// buffers (then nothing is written).
#[no_mangle]
pub unsafe extern "C" fn MXKVKahanSumColumns(
    dtype: c_int,
    rows: *const c_void,
    num_rows: u64,
    num_cols: u64,
    out: *mut c_void,
) -> c_int {
    api_call_light("MXKVKahanSumColumns", || {
        let dtype = DType::from_code(dtype)?;
        let size = dtype.size() as u64;
        let too_big = || Error::new("num_rows x num_cols elements do not fit in memory");
        let in_bytes = num_rows
            .checked_mul(num_cols)
            .and_then(|n| n.checked_mul(size))
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(too_big)?;
        let out_bytes = num_cols
            .checked_mul(size)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(too_big)?;
        // SAFETY: `rows` is NULL (refused when elements are announced) or
        // valid for `in_bytes` bytes, per the contract.
        let input = unsafe { slice(rows as *const u8, in_bytes, "rows")? };
        if out_bytes > 0 && out.is_null() {
            return Err(Error::new("out (output pointer) is NULL"));
        }
        let (a, b) = (input.as_ptr() as usize, out as usize);
        if in_bytes > 0 && out_bytes > 0 && a < b + out_bytes && b < a + in_bytes {
            return Err(Error::new("out overlaps rows"));
        }
        if out_bytes == 0 {
            return crate::ndarray::kahan::kahan_sum_columns(dtype, input, 0, &mut []);
        }
        // SAFETY: non-NULL, writable for `out_bytes` bytes per the contract,
        // and disjoint from `input` (checked above).
        let sums = unsafe { std::slice::from_raw_parts_mut(out as *mut u8, out_bytes) };
        crate::ndarray::kahan::kahan_sum_columns(dtype, input, num_cols as usize, sums)
    })
}

/// libmxkv only (not in MXNet's C API): `cblas_sdot(n, x, 1, y, 1)` /
/// `cblas_ddot` summed in the order of the OpenBLAS inside MXNet 1.9.1's pip
/// wheel on this CPU, for frontends that reproduce MXNet's norm of a
/// row_sparse or csr array (the dot of its stored values with themselves,
/// then sqrt: `L2NormComputeSparseImpl`), whatever BLAS the frontend has.
/// Which of the wheel's kernel tables runs, and which CPUs are covered:
/// src/ndarray/blas_dot.rs (`OPENBLAS_CORETYPE` is honoured as OpenBLAS
/// honours it).
///
/// `dtype`: 0 (float32) or 1 (float64); `x`, `y`: `n` elements each (native
/// byte order, any alignment; they may be the same buffer); `threads`: the
/// OpenMP thread count MXNet's OpenBLAS would see (`omp_get_max_threads()`
/// in the engine's worker), which decides how a float64 dot of more than
/// 10,000 elements is split (1: not at all; float32 dots and n <= 10,000
/// never are); `out`: room for one element of `dtype`, where the dot is
/// written. Returns 0, or -1 (`MXGetLastError`) for another dtype, a NULL
/// pointer where elements are announced, `threads` < 1 or sizes beyond
/// memory (then nothing is written).
#[no_mangle]
pub unsafe extern "C" fn MXKVBlasDot(
    dtype: c_int,
    x: *const c_void,
    y: *const c_void,
    n: u64,
    threads: c_int,
    out: *mut c_void,
) -> c_int {
    api_call_light("MXKVBlasDot", || {
        use crate::ndarray::blas_dot;
        let dtype = DType::from_code(dtype)?;
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(Error::new(format!(
                "the BLAS dot is for float32 and float64 elements, not {}",
                dtype.name()
            )));
        }
        let threads = usize::try_from(threads)
            .ok()
            .filter(|&t| t >= 1)
            .ok_or_else(|| Error::new(format!("threads is {threads}, not 1 or more")))?;
        let size = dtype.size();
        let bytes = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(size))
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::new("n elements do not fit in memory"))?;
        if out.is_null() {
            return Err(Error::new("out (output pointer) is NULL"));
        }
        // SAFETY: `x` and `y` are NULL (refused when elements are announced)
        // or valid for `bytes` bytes each, per the contract; only read.
        let (xb, yb) = unsafe {
            (
                slice(x as *const u8, bytes, "x")?,
                slice(y as *const u8, bytes, "y")?,
            )
        };
        let kernel = blas_dot::mxnet_kernel();
        if dtype == DType::F32 {
            let (xv, yv) = (elements::<f32>(xb), elements::<f32>(yb));
            let dot = blas_dot::sdot(&xv, &yv, kernel);
            // SAFETY: non-NULL (checked) and writable for one float32 per
            // the contract, any alignment.
            unsafe { (out as *mut f32).write_unaligned(dot) };
        } else {
            let (xv, yv) = (elements::<f64>(xb), elements::<f64>(yb));
            let dot = blas_dot::ddot(&xv, &yv, kernel, threads);
            // SAFETY: as above, for one float64.
            unsafe { (out as *mut f64).write_unaligned(dot) };
        }
        Ok(())
    })
}

/// libmxkv only: the name (as MXNet's OpenBLAS `openblas_get_corename()`
/// gives it) of the kernel table MXKVBlasDot reproduces in this process,
/// e.g. "Zen" or "Haswell"; a static string. Returns 0, or -1 for a NULL
/// `out`.
#[no_mangle]
pub unsafe extern "C" fn MXKVBlasCoreName(out: *mut *const c_char) -> c_int {
    api_call_light("MXKVBlasCoreName", || {
        let name = crate::ndarray::blas_dot::mxnet_core().c_name();
        // SAFETY: `out` is checked for NULL by write_out and writable per
        // the contract; the string is static.
        unsafe { write_out(out, name.as_ptr(), "out") }
    })
}

/// Elements of a native-endian byte buffer: borrowed when aligned, copied
/// otherwise.
fn elements<T: bytemuck::Pod>(bytes: &[u8]) -> std::borrow::Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(v) => std::borrow::Cow::Borrowed(v),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

/// libmxkv only (not in MXNet's C API): the storage types of `num` arrays
/// at once, as `MXNDArrayGetStorageType` gives each (-1 undefined, 0
/// dense, 1 row_sparse, 2 csr), for frontends that wrap many handles (the
/// Python `nd.load` of thousands of arrays: one call instead of one per
/// array). `handles`: `num` handles; `out_storage_types`: room for `num`
/// ints. Returns 0, or -1 (`MXGetLastError`) for a NULL pointer where items
/// are announced or a stale or foreign handle (then nothing is written).
#[no_mangle]
pub unsafe extern "C" fn MXKVNDArrayGetStorageTypes(
    num: u32,
    handles: *const NDArrayHandle,
    out_storage_types: *mut c_int,
) -> c_int {
    api_call_light("MXKVNDArrayGetStorageTypes", || {
        // SAFETY: NULL (refused when handles are announced) or valid for
        // `num` handles, per the contract.
        let arrays = unsafe { ndarrays(handles, num as usize, "handles")? };
        let codes: Vec<c_int> = arrays.iter().map(|a| a.stype().code()).collect();
        if codes.is_empty() {
            return Ok(());
        }
        if out_storage_types.is_null() {
            return Err(Error::new("out_storage_types is NULL"));
        }
        // SAFETY: non-NULL and writable for `num` ints, per the contract; the
        // handles were only read before.
        unsafe {
            std::ptr::copy_nonoverlapping(codes.as_ptr(), out_storage_types, codes.len());
        }
        Ok(())
    })
}
