//! MXNet 1.9.1's CPU `sum` of one output element, compiled: a sequential
//! Kahan chain over the element's inputs in the element type, as
//! `seq_reduce_assign` runs mshadow's `red::sum` (3rdparty/mshadow/mshadow/
//! base.h), from `s = r = 0`:
//!
//! ```text
//! y = x - r;  t = s + y;  r = isinf(t) ? 0 : (t - s) - y;  s = t
//! ```
//!
//! every operation rounded to the element type (float16 as mshadow's
//! `half_t`: float arithmetic, then round to nearest even). This is the chain
//! the Python frontend's `mxkv/ndarray/_reduce.py` computes (and checks
//! against MXNet bit for bit), including which NaN an operation passes on,
//! as MXNet's x86 build does: with two NaN operands, `a + b` and `a - b`
//! give `a`'s (SSE's rule, with the operands in the order the source writes
//! them), a signalling NaN comes out quiet, and `inf - inf` gives the x86
//! default NaN (negative, quiet). A chain that meets no NaN never depends on those
//! rules, so it runs with plain arithmetic first; one whose sum is NaN runs
//! again with them.

use super::dtype::{f16_to_f32, f32_to_f16, DType};
use crate::error::Result;
use crate::{bail, ensure};
use half::f16;

/// The arithmetic of one element type.
trait Arith: Copy {
    /// An element from its native-endian bytes (float16: as an exact float).
    fn load(bytes: &[u8]) -> Self;
    fn store(self, out: &mut [u8]);
    fn zero() -> Self;
    /// `a + b` and `a - b` rounded to the element type (NaN bits unspecified).
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    /// The same with the NaN rules above.
    fn add_nan(a: Self, b: Self) -> Self;
    fn sub_nan(a: Self, b: Self) -> Self;
    fn is_inf(self) -> bool;
    fn is_nan(self) -> bool;
}

/// `op`'s result with x86's NaN rule for the operands in order (`first`,
/// `second`): the first NaN among them, quieted; no NaN operand: `default`.
macro_rules! nan_rule {
    ($r:expr, $first:expr, $second:expr, $quiet:expr, $default:expr, $T:ty) => {{
        let r: $T = $r;
        if !r.is_nan() {
            r
        } else if $first.is_nan() {
            <$T>::from_bits($first.to_bits() | $quiet)
        } else if $second.is_nan() {
            <$T>::from_bits($second.to_bits() | $quiet)
        } else {
            <$T>::from_bits($default)
        }
    }};
}

macro_rules! float_arith {
    ($T:ty, $quiet:expr, $default:expr) => {
        impl Arith for $T {
            #[inline(always)]
            fn load(bytes: &[u8]) -> Self {
                <$T>::from_ne_bytes(bytes.try_into().expect("one element"))
            }
            #[inline(always)]
            fn store(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn zero() -> Self {
                0.0
            }
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn sub(a: Self, b: Self) -> Self {
                a - b
            }
            #[inline(always)]
            fn add_nan(a: Self, b: Self) -> Self {
                nan_rule!(a + b, a, b, $quiet, $default, $T)
            }
            #[inline(always)]
            fn sub_nan(a: Self, b: Self) -> Self {
                nan_rule!(a - b, a, b, $quiet, $default, $T)
            }
            #[inline(always)]
            fn is_inf(self) -> bool {
                self.is_infinite()
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$T>::is_nan(self)
            }
        }
    };
}

float_arith!(f32, 0x0040_0000, 0xffc0_0000);
float_arith!(f64, 0x0008_0000_0000_0000, 0xfff8_0000_0000_0000);

/// A float16 value held as the float it converts to exactly (NaN payloads
/// shifted, not quieted), as `half_t` computes: float arithmetic, then
/// rounding to float16.
#[derive(Clone, Copy)]
struct Half(f32);

impl Half {
    #[inline(always)]
    fn round(f: f32) -> Half {
        Half(f16_to_f32(f32_to_f16(f)))
    }
}

impl Arith for Half {
    #[inline(always)]
    fn load(bytes: &[u8]) -> Self {
        Half(f16_to_f32(f16::from_bits(u16::from_ne_bytes(
            bytes.try_into().expect("one element"),
        ))))
    }
    #[inline(always)]
    fn store(self, out: &mut [u8]) {
        out.copy_from_slice(&f32_to_f16(self.0).to_bits().to_ne_bytes());
    }
    #[inline(always)]
    fn zero() -> Self {
        Half(0.0)
    }
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        Half::round(a.0 + b.0)
    }
    #[inline(always)]
    fn sub(a: Self, b: Self) -> Self {
        Half::round(a.0 - b.0)
    }
    #[inline(always)]
    fn add_nan(a: Self, b: Self) -> Self {
        Half::round(f32::add_nan(a.0, b.0))
    }
    #[inline(always)]
    fn sub_nan(a: Self, b: Self) -> Self {
        Half::round(f32::sub_nan(a.0, b.0))
    }
    #[inline(always)]
    fn is_inf(self) -> bool {
        self.0.is_infinite()
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        self.0.is_nan()
    }
}

/// One chain's state: the sum and the residual.
#[derive(Clone, Copy)]
struct State<T> {
    s: T,
    r: T,
}

impl<T: Arith> State<T> {
    fn new() -> Self {
        State {
            s: T::zero(),
            r: T::zero(),
        }
    }

    /// One step of mshadow's `red::sum::Reduce(s, x, r)`.
    #[inline(always)]
    fn step(&mut self, x: T) {
        let y = T::sub(x, self.r);
        let t = T::add(self.s, y);
        self.r = if t.is_inf() {
            T::zero()
        } else {
            T::sub(T::sub(t, self.s), y)
        };
        self.s = t;
    }

    /// [`State::step`] with the NaN rules.
    #[inline(always)]
    fn step_nan(&mut self, x: T) {
        let y = T::sub_nan(x, self.r);
        let t = T::add_nan(self.s, y);
        self.r = if t.is_inf() {
            T::zero()
        } else {
            T::sub_nan(T::sub_nan(t, self.s), y)
        };
        self.s = t;
    }
}

/// The chain of column `col` of `rows` (`cols` elements a row), with the NaN
/// rules.
fn column_with_nan_rules<T: Arith>(rows: &[u8], cols: usize, col: usize, size: usize) -> T {
    let mut st = State::<T>::new();
    for row in rows.chunks_exact(cols * size) {
        st.step_nan(T::load(&row[col * size..(col + 1) * size]));
    }
    st.s
}

fn sum_columns<T: Arith>(rows: &[u8], cols: usize, size: usize, out: &mut [u8]) {
    let mut sums: Vec<T> = if cols == 1 {
        // one chain: the plain loop
        let mut st = State::<T>::new();
        for x in rows.chunks_exact(size) {
            st.step(T::load(x));
        }
        vec![st.s]
    } else {
        // the chains side by side, a row at a time
        let mut states = vec![State::<T>::new(); cols];
        for row in rows.chunks_exact(cols * size) {
            for (st, x) in states.iter_mut().zip(row.chunks_exact(size)) {
                st.step(T::load(x));
            }
        }
        states.iter().map(|st| st.s).collect()
    };
    // A NaN met anywhere in a chain stays in its sum: run those chains again
    // with the NaN rules.
    for (col, sum) in sums.iter_mut().enumerate() {
        if sum.is_nan() {
            *sum = column_with_nan_rules(rows, cols, col, size);
        }
    }
    for (sum, o) in sums.into_iter().zip(out.chunks_exact_mut(size)) {
        sum.store(o);
    }
}

/// MXNet's sum of each column of `rows`, a row-major matrix of `cols`
/// columns of `dtype` elements (native-endian bytes), top to bottom: writes
/// the `cols` sums, in `dtype`, to `out`. float16, float32 and float64 only.
pub fn kahan_sum_columns(dtype: DType, rows: &[u8], cols: usize, out: &mut [u8]) -> Result<()> {
    let run: fn(&[u8], usize, usize, &mut [u8]) = match dtype {
        DType::F32 => sum_columns::<f32>,
        DType::F64 => sum_columns::<f64>,
        DType::F16 => sum_columns::<Half>,
        _ => bail!(
            "the Kahan sum is for float16, float32 and float64 elements, not {}",
            dtype.name()
        ),
    };
    let size = dtype.size();
    let Some(row_bytes) = cols.checked_mul(size) else {
        bail!("{cols} columns of {} do not fit in memory", dtype.name());
    };
    ensure!(
        out.len() == row_bytes
            && (rows.is_empty() || (row_bytes > 0 && rows.len() % row_bytes == 0)),
        "{} bytes of rows and {} bytes of sums for {cols} columns of {}",
        rows.len(),
        out.len(),
        dtype.name()
    );
    if row_bytes > 0 {
        run(rows, cols, size, out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum32(values: &[f32]) -> u32 {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut out = [0u8; 4];
        kahan_sum_columns(DType::F32, &bytes, 1, &mut out).unwrap();
        u32::from_ne_bytes(out)
    }

    /// The chain step by step in double, each result rounded to float32
    /// (the Python frontend's loop).
    fn reference32(values: &[f32]) -> f32 {
        let (mut s, mut r) = (0f64, 0f64);
        for &x in values {
            let y = (f64::from(x) - r) as f32 as f64;
            let t = (s + y) as f32 as f64;
            r = if t.is_infinite() {
                0.0
            } else {
                (((t - s) as f32 as f64) - y) as f32 as f64
            };
            s = t;
        }
        s as f32
    }

    #[test]
    fn compensates_as_mxnet() {
        // 1 + 1e-8 * 3: a plain float32 sum loses the small terms, the chain
        // carries them in the residual
        let v = [1.0f32, 1e-8, 1e-8, 1e-8, 1e-8, 1e-8, 1e-8, 1e-8, 1e-8];
        assert_eq!(f32::from_bits(sum32(&v)), reference32(&v));
        assert_ne!(f32::from_bits(sum32(&v)), v.iter().sum::<f32>());
        let mut x = 0x1234_5678u32;
        let vals: Vec<f32> = (0..10000)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((x >> 8) as f32 / 65536.0 - 128.0) * if x & 1 == 0 { 1e-3 } else { 1e3 }
            })
            .collect();
        assert_eq!(sum32(&vals), reference32(&vals).to_bits());
    }

    #[test]
    fn infinite_partial_sums_reset_the_residual_and_nans_follow_x86() {
        let inf = f32::INFINITY;
        assert_eq!(f32::from_bits(sum32(&[1.5, inf, 2.0])), inf);
        // inf - inf: the default NaN
        assert_eq!(sum32(&[inf, -inf]), 0xffc0_0000);
        // two NaNs: `s + y` passes s's on (the earlier element's), quieted;
        // MXNet 1.9.1 gives these bits
        let (a, b) = (f32::from_bits(0x7f80_0001), f32::from_bits(0xffc1_2345));
        assert_eq!(sum32(&[a, 1.0, b, f32::NAN]), 0x7fc0_0001);
        assert_eq!(sum32(&[b, a]), 0xffc1_2345);
        assert_eq!(sum32(&[1.0, a]), 0x7fc0_0001);
    }

    #[test]
    fn columns_are_chains_of_their_own() {
        let cols = 3;
        let vals: Vec<f64> = (0..300).map(|i| 1.0 / f64::from(i + 1)).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut out = vec![0u8; cols * 8];
        kahan_sum_columns(DType::F64, &bytes, cols, &mut out).unwrap();
        for c in 0..cols {
            let col: Vec<u8> = vals
                .iter()
                .skip(c)
                .step_by(cols)
                .flat_map(|v| v.to_ne_bytes())
                .collect();
            let mut one = [0u8; 8];
            kahan_sum_columns(DType::F64, &col, 1, &mut one).unwrap();
            assert_eq!(&out[c * 8..(c + 1) * 8], &one[..]);
        }
    }

    #[test]
    fn float16_rounds_every_step_and_overflows() {
        let h = |v: f32| f32_to_f16(v).to_bits().to_ne_bytes();
        let bytes: Vec<u8> = [60000.0, 60000.0, -60000.0, 1.0]
            .iter()
            .flat_map(|&v| h(v))
            .collect();
        let mut out = [0u8; 2];
        kahan_sum_columns(DType::F16, &bytes, 1, &mut out).unwrap();
        // 60000 + 60000 overflows to inf, which no later term brings back
        assert_eq!(u16::from_ne_bytes(out), 0x7c00);
        // 2048 + 1: the 1 is lost to the sum, kept by the residual, and
        // comes back with the next 1
        let bytes: Vec<u8> = [2048.0, 1.0, 1.0].iter().flat_map(|&v| h(v)).collect();
        kahan_sum_columns(DType::F16, &bytes, 1, &mut out).unwrap();
        assert_eq!(u16::from_ne_bytes(out), f32_to_f16(2050.0).to_bits());
    }

    #[test]
    fn refuses_other_dtypes_and_sizes() {
        let mut out = [0u8; 4];
        assert!(kahan_sum_columns(DType::I32, &[0; 8], 1, &mut out).is_err());
        assert!(kahan_sum_columns(DType::I32, &[], 0, &mut []).is_err());
        assert!(kahan_sum_columns(DType::F32, &[0; 8], 0, &mut []).is_err());
        assert!(kahan_sum_columns(DType::F32, &[0; 6], 1, &mut out).is_err());
        assert!(kahan_sum_columns(DType::F32, &[0; 8], 2, &mut out).is_err());
        assert!(kahan_sum_columns(DType::F32, &[], 0, &mut []).is_ok());
        assert!(kahan_sum_columns(DType::F32, &[], 1, &mut out).is_ok());
        assert_eq!(out, [0; 4]);
    }
}
