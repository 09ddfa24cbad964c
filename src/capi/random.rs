//! libmxkv only (not in MXNet's C API): MXNet 1.9.1's CPU standard normal
//! draws compiled, for frontends that reproduce MXNet's `random.normal`
//! (mxkv's Python `mxkv.ndarray.random`); the draws are
//! [`crate::random::standard_normals`].

use super::args::slice;
use super::boundary::api_call;
use crate::error::{Error, Result};
use crate::random::{standard_normals, MT_N};
use std::os::raw::{c_int, c_void};

/// The C library's `logf`, MXNet's `std::log(float)`.
fn libm_logf(x: f32) -> f32 {
    // (declared here, inside the function, so that cbindgen leaves it out of
    // the header)
    extern "C" {
        fn logf(x: f32) -> f32;
    }
    // SAFETY: libm's logf takes and returns a float by value and touches no
    // memory of ours (it may set the thread's errno).
    unsafe { logf(x) }
}

/// The C library's `log`, MXNet's `std::log(double)`.
fn libm_log(x: f64) -> f64 {
    extern "C" {
        fn log(x: f64) -> f64;
    }
    // SAFETY: as `libm_logf`.
    unsafe { log(x) }
}

/// `len` items at `ptr` for writing; `len == 0` accepts NULL.
///
/// # Safety
/// `ptr` is NULL or valid for reads and writes of `len` items for `'a`,
/// and nothing else refers to them meanwhile.
unsafe fn slice_mut<'a, T>(ptr: *mut T, len: usize, name: &str) -> Result<&'a mut [T]> {
    // SAFETY: forwarded contract (the NULL and length checks).
    let items = unsafe { slice(ptr as *const T, len, name)? };
    // SAFETY: valid for writes of `len` items and unaliased, per the contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(items.as_ptr() as *mut T, len) })
}

/// libmxkv only (not in MXNet's C API): MXNet 1.9.1's next `num` CPU
/// standard normals, bit for bit, drawn as MXNet's sampling operators draw
/// them from its parallel random resource (a draw of `num` numbers is split
/// over the first `min(ceil(num / 64), num_engines)` engines, consecutive
/// chunks of `ceil(num / that)` outputs each, as MXNet's `LaunchRNG`; each
/// number from a fresh libstdc++ `normal_distribution`, whose logarithm is
/// the C library's `logf` / `log`). The caller keeps the engines' states:
/// `keys` holds `num_engines * 624` `std::mt19937` key words and
/// `positions` one position per engine in `0..=624` (624: the words are
/// twisted before the next output, as in a freshly seeded engine); the
/// engines used are moved on in place. MXNet's resource has 1024 engines.
///
/// `dtype`: 0 (float32: MXNet's float32 outputs) or 1 (float64: float64 and
/// float16 outputs draw in double); `out`: room for `num` elements of
/// `dtype`. The three buffers must not overlap. Returns 0, or -1
/// (`MXGetLastError`) for another dtype, a NULL pointer where items are
/// announced, sizes beyond memory, overlapping buffers or a position outside
/// `0..=624` (then nothing is written).
#[no_mangle]
pub unsafe extern "C" fn MXKVMTStandardNormal(
    dtype: c_int,
    keys: *mut u32,
    positions: *mut i64,
    num_engines: u64,
    num: u64,
    out: *mut c_void,
) -> c_int {
    api_call("MXKVMTStandardNormal", || {
        let size: u64 = match dtype {
            0 => 4,
            1 => 8,
            _ => {
                return Err(Error::new(format!(
                    "dtype {dtype}: the draws are float32 (0) or float64 (1)"
                )))
            }
        };
        let too_big = || Error::new("num_engines or num is beyond memory");
        let bytes = |count: u64, item: u64| {
            count
                .checked_mul(item)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n <= isize::MAX as usize)
                .ok_or_else(too_big)
        };
        let key_bytes = bytes(num_engines, MT_N as u64 * 4)?;
        let pos_bytes = bytes(num_engines, 8)?;
        let out_bytes = bytes(num, size)?;
        let spans = [
            (keys as usize, key_bytes),
            (positions as usize, pos_bytes),
            (out as usize, out_bytes),
        ];
        for (i, &(a, la)) in spans.iter().enumerate() {
            for &(b, lb) in &spans[i + 1..] {
                if la > 0 && lb > 0 && a < b.wrapping_add(lb) && b < a.wrapping_add(la) {
                    return Err(Error::new("keys, positions and out overlap"));
                }
            }
        }
        aligned(keys, key_bytes, "keys")?;
        aligned(positions, pos_bytes, "positions")?;
        // SAFETY: `keys` and `positions` are NULL (refused when items are
        // announced) or valid for reads and writes of `num_engines * 624`
        // words and `num_engines` positions, per the contract, aligned
        // (checked), and the three buffers are disjoint (checked above).
        let keys = unsafe { slice_mut(keys, key_bytes / 4, "keys")? };
        // SAFETY: as above.
        let positions = unsafe { slice_mut(positions, pos_bytes / 8, "positions")? };
        if dtype == 0 {
            let out = out as *mut f32;
            aligned(out, out_bytes, "out")?;
            // SAFETY: `out` is NULL (refused when items are announced) or
            // valid for writes of `num` float32 values per the contract,
            // aligned (checked) and disjoint from the states (checked); any
            // bits are a valid f32.
            let out = unsafe { slice_mut(out, out_bytes / 4, "out")? };
            standard_normals(keys, positions, out, libm_logf)
        } else {
            let out = out as *mut f64;
            aligned(out, out_bytes, "out")?;
            // SAFETY: as for float32, with `num` float64 values.
            let out = unsafe { slice_mut(out, out_bytes / 8, "out")? };
            standard_normals(keys, positions, out, libm_log)
        }
    })
}

/// Refuses a buffer of `bytes > 0` at an address misaligned for `T`.
fn aligned<T>(ptr: *mut T, bytes: usize, name: &str) -> Result<()> {
    if bytes > 0 && (ptr as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Error::new(format!(
            "{name} is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    Ok(())
}
