//! libmxkv only (not in MXNet's C API): MXNet 1.9.1's CPU random draws
//! compiled, for frontends that reproduce MXNet's `random.uniform`,
//! `random.normal` and `random.randint` (mxkv's Python
//! `mxkv.ndarray.random`); the engines and draws are [`crate::random`]'s.

use super::args::slice;
use super::boundary::api_call;
use crate::error::{Error, Result};
use crate::random::{canonicals, randint_words, seed_engines, standard_normals, MT_N};
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

/// The byte counts of `num_engines` engines' key words and positions, and of
/// `num` items of `item` bytes, refused beyond memory.
fn state_bytes(num_engines: u64, num: u64, item: u64) -> Result<(usize, usize, usize)> {
    let bytes = |count: u64, size: u64| {
        count
            .checked_mul(size)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| Error::new("num_engines or num is beyond memory"))
    };
    Ok((
        bytes(num_engines, MT_N as u64 * 4)?,
        bytes(num_engines, 8)?,
        bytes(num, item)?,
    ))
}

/// Refuses buffers (address, bytes) of which two overlap.
fn disjoint(spans: &[(usize, usize)], what: &str) -> Result<()> {
    for (i, &(a, la)) in spans.iter().enumerate() {
        for &(b, lb) in &spans[i + 1..] {
            if la > 0 && lb > 0 && a < b.wrapping_add(lb) && b < a.wrapping_add(la) {
                return Err(Error::new(format!("{what} overlap")));
            }
        }
    }
    Ok(())
}

/// The engines' states as slices, checked for alignment.
///
/// # Safety
/// `keys` and `positions` are NULL or valid for reads and writes of
/// `key_bytes` and `pos_bytes` bytes for `'a`, disjoint, and nothing else
/// refers to them meanwhile.
unsafe fn states<'a>(
    keys: *mut u32,
    key_bytes: usize,
    positions: *mut i64,
    pos_bytes: usize,
) -> Result<(&'a mut [u32], &'a mut [i64])> {
    aligned(keys, key_bytes, "keys")?;
    aligned(positions, pos_bytes, "positions")?;
    // SAFETY: forwarded contract; aligned (checked); NULL refused when items
    // are announced.
    let keys = unsafe { slice_mut(keys, key_bytes / 4, "keys")? };
    // SAFETY: as above.
    let positions = unsafe { slice_mut(positions, pos_bytes / 8, "positions")? };
    Ok((keys, positions))
}

/// libmxkv only (not in MXNet's C API): sets engine `j` of `num_engines`
/// `std::mt19937` engines to `std::mt19937(base + j)` (modulo 2^32) and its
/// position to 624 (twist before the next output), as MXNet 1.9.1 seeds its
/// CPU parallel random resource (copy `i` of it: `base = i * 16 + seed *
/// 127`). `keys` holds `num_engines * 624` key words, `positions`
/// `num_engines` positions; the two must not overlap. Returns 0, or -1
/// (`MXGetLastError`) for a NULL pointer where items are announced, sizes
/// beyond memory or overlapping buffers (then nothing is written).
#[no_mangle]
pub unsafe extern "C" fn MXKVMTSeed(
    base: u32,
    keys: *mut u32,
    positions: *mut i64,
    num_engines: u64,
) -> c_int {
    api_call("MXKVMTSeed", || {
        let (key_bytes, pos_bytes, _) = state_bytes(num_engines, 0, 0)?;
        disjoint(
            &[(keys as usize, key_bytes), (positions as usize, pos_bytes)],
            "keys and positions",
        )?;
        // SAFETY: `keys` and `positions` are NULL (refused when items are
        // announced) or valid for reads and writes of `num_engines * 624`
        // words and `num_engines` positions, per the contract, and disjoint
        // (checked above).
        let (keys, positions) = unsafe { states(keys, key_bytes, positions, pos_bytes)? };
        // every position is overwritten: start from valid ones
        positions.fill(MT_N as i64);
        seed_engines(keys, positions, base)
    })
}

/// libmxkv only (not in MXNet's C API): MXNet 1.9.1's next `num` CPU random
/// numbers before their parameters are applied, bit for bit, drawn as
/// MXNet's sampling operators draw them from its parallel random resource (a
/// draw of `num` numbers is split over the first `min(ceil(num / 64),
/// num_engines)` engines, consecutive chunks of `ceil(num / that)` outputs
/// each, as MXNet's `LaunchRNG`). The caller keeps the engines' states:
/// `keys` holds `num_engines * 624` `std::mt19937` key words and `positions`
/// one position per engine in `0..=624` (624: the words are twisted before
/// the next output, as in a freshly seeded engine, see `MXKVMTSeed`); the
/// engines used are moved on in place. MXNet's resource has 1024 engines.
///
/// `kind`: 0, uniforms on [0, 1) (libstdc++'s `generate_canonical`, not
/// clamped: a draw can be 1.0, in float32 and, rarely, in float64); 1, standard normals (a fresh
/// libstdc++ `normal_distribution` per number, whose logarithm is the C
/// library's `logf` / `log`); 2, `randint`'s words before the modulo,
/// `(w1 << 31) + w2` of two outputs. `dtype` (MXNet's type flags): 0
/// (float32: MXNet's float32 outputs) or 1 (float64: float64 and float16
/// outputs draw in double) for kinds 0 and 1, 6 (int64) for kind 2; `out`:
/// room for `num` elements of `dtype`. The three buffers must not overlap.
/// Returns 0, or -1 (`MXGetLastError`) for another kind or dtype, a NULL
/// pointer where items are announced, `num > 0` with no engines, sizes
/// beyond memory, overlapping or misaligned buffers, a position outside
/// `0..=624`, or (normals) an engine whose state is all zero, which no
/// seeding gives and from which no normal can be drawn (then nothing is
/// written).
#[no_mangle]
pub unsafe extern "C" fn MXKVMTDraw(
    kind: c_int,
    dtype: c_int,
    keys: *mut u32,
    positions: *mut i64,
    num_engines: u64,
    num: u64,
    out: *mut c_void,
) -> c_int {
    api_call("MXKVMTDraw", || {
        let size: u64 = match (kind, dtype) {
            (0 | 1, 0) => 4,
            (0 | 1, 1) | (2, 6) => 8,
            (0 | 1, _) => {
                return Err(Error::new(format!(
                    "dtype {dtype}: uniform and normal draws are float32 (0) or float64 (1)"
                )))
            }
            (2, _) => {
                return Err(Error::new(format!(
                    "dtype {dtype}: randint words are int64 (6)"
                )))
            }
            _ => {
                return Err(Error::new(format!(
                    "kind {kind}: uniform (0), normal (1) or randint (2)"
                )))
            }
        };
        let (key_bytes, pos_bytes, out_bytes) = state_bytes(num_engines, num, size)?;
        disjoint(
            &[
                (keys as usize, key_bytes),
                (positions as usize, pos_bytes),
                (out as usize, out_bytes),
            ],
            "keys, positions and out",
        )?;
        // SAFETY: `keys` and `positions` are NULL (refused when items are
        // announced) or valid for reads and writes of `num_engines * 624`
        // words and `num_engines` positions, per the contract, and the three
        // buffers are disjoint (checked above).
        let (keys, positions) = unsafe { states(keys, key_bytes, positions, pos_bytes)? };
        match (kind, dtype) {
            (2, _) => {
                let out = out as *mut i64;
                aligned(out, out_bytes, "out")?;
                // SAFETY: `out` is NULL (refused when items are announced) or
                // valid for writes of `num` int64 values per the contract,
                // aligned (checked) and disjoint from the states (checked);
                // any bits are a valid i64.
                let out = unsafe { slice_mut(out, out_bytes / 8, "out")? };
                randint_words(keys, positions, out)
            }
            (_, 0) => {
                let out = out as *mut f32;
                aligned(out, out_bytes, "out")?;
                // SAFETY: as for int64, with `num` float32 values.
                let out = unsafe { slice_mut(out, out_bytes / 4, "out")? };
                if kind == 0 {
                    canonicals(keys, positions, out)
                } else {
                    standard_normals(keys, positions, out, libm_logf)
                }
            }
            _ => {
                let out = out as *mut f64;
                aligned(out, out_bytes, "out")?;
                // SAFETY: as for int64, with `num` float64 values.
                let out = unsafe { slice_mut(out, out_bytes / 8, "out")? };
                if kind == 0 {
                    canonicals(keys, positions, out)
                } else {
                    standard_normals(keys, positions, out, libm_log)
                }
            }
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
