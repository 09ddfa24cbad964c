//! Element types (MXNet's mshadow type flags 0–12) and the per-element
//! arithmetic MXNet uses: conversions that behave like the x86-64 C++ casts of
//! the reference build, and additions that round the way mshadow's types do.

use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

/// An element type, numbered as MXNet numbers them (`mshadow::TypeFlag`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32 = 0,
    F64 = 1,
    F16 = 2,
    U8 = 3,
    I32 = 4,
    I8 = 5,
    I64 = 6,
    Bool = 7,
    I16 = 8,
    U16 = 9,
    U32 = 10,
    U64 = 11,
    BF16 = 12,
}

impl DType {
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::U8,
        DType::I32,
        DType::I8,
        DType::I64,
        DType::Bool,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::BF16,
    ];

    pub fn from_code(code: i32) -> Result<DType> {
        usize::try_from(code)
            .ok()
            .and_then(|i| DType::ALL.get(i).copied())
            .ok_or_else(|| Error::new(format!("Unknown type enum {code}")))
    }

    pub fn code(self) -> i32 {
        self as i32
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// MXNet's (numpy's) name of the type.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I8 => "int8",
            DType::I64 => "int64",
            DType::Bool => "bool",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::BF16 => "bfloat16",
        }
    }
}

/// MXNet's boolean element: one byte, 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Pod, Zeroable)]
#[repr(transparent)]
pub struct Bool8(pub u8);

/// A value on its way from one element type to another: integers keep every
/// bit, floats travel as f64 (exact for every float source).
#[derive(Debug, Clone, Copy)]
pub enum Wide {
    I(i64),
    U(u64),
    F(f64),
}

/// x86-64 `cvttsd2si` with a 32-bit destination: truncation toward zero, and
/// the "integer indefinite" value `i32::MIN` for NaN and out-of-range inputs.
fn cvtt32(f: f64) -> i32 {
    if f > -2147483649.0 && f < 2147483648.0 {
        f as i32
    } else {
        i32::MIN
    }
}

/// `cvttsd2si` with a 64-bit destination.
fn cvtt64(f: f64) -> i64 {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    if (-TWO63..TWO63).contains(&f) {
        f as i64
    } else {
        i64::MIN
    }
}

/// One element type: how it converts and how two of them add.
pub trait Elem: Pod + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_wide(self) -> Wide;
    fn from_wide(w: Wide) -> Self;
    /// `a + b` as the reference computes it for this type.
    fn add(self, other: Self) -> Self;
}

macro_rules! float_elem {
    ($t:ty, $dt:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            #[inline]
            fn to_wide(self) -> Wide {
                Wide::F(self as f64)
            }
            #[inline]
            fn from_wide(w: Wide) -> Self {
                match w {
                    Wide::I(i) => i as $t,
                    Wide::U(u) => u as $t,
                    Wide::F(f) => f as $t,
                }
            }
            #[inline]
            fn add(self, other: Self) -> Self {
                self + other
            }
        }
    };
}
float_elem!(f32, DType::F32);
float_elem!(f64, DType::F64);

// mshadow's half_t and bf16_t convert through float: an integer or a double is
// first cast to float, then rounded to 16 bits; `a + b` adds the two as floats
// and rounds the sum once. float16 rounds to nearest-even and keeps NaN
// payloads without quieting them (a zero payload becomes 1); bfloat16
// truncates (keeps the top 16 bits), NaN included.

/// float → float16 as mshadow's software conversion does it.
pub fn f32_to_f16(f: f32) -> f16 {
    if f.is_nan() {
        let bits = f.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let payload = ((bits & 0x007f_ffff) >> 13) as u16;
        f16::from_bits(sign | 0x7c00 | if payload == 0 { 1 } else { payload })
    } else {
        f16::from_f32(f)
    }
}

/// float16 → float, exact; NaN payloads are shifted, not quieted.
pub fn f16_to_f32(h: f16) -> f32 {
    if h.is_nan() {
        let b = u32::from(h.to_bits());
        f32::from_bits(((b & 0x8000) << 16) | 0x7f80_0000 | ((b & 0x03ff) << 13))
    } else {
        h.to_f32()
    }
}

/// float → bfloat16: truncation to the top 16 bits.
pub fn f32_to_bf16(f: f32) -> bf16 {
    bf16::from_bits((f.to_bits() >> 16) as u16)
}

fn wide_to_f32(w: Wide) -> f32 {
    match w {
        Wide::I(i) => i as f32,
        Wide::U(u) => u as f32,
        Wide::F(f) => f as f32,
    }
}

impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    #[inline]
    fn to_wide(self) -> Wide {
        Wide::F(f64::from(f16_to_f32(self)))
    }
    #[inline]
    fn from_wide(w: Wide) -> Self {
        f32_to_f16(wide_to_f32(w))
    }
    #[inline]
    fn add(self, other: Self) -> Self {
        f32_to_f16(f16_to_f32(self) + f16_to_f32(other))
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline]
    fn to_wide(self) -> Wide {
        Wide::F(f64::from(self.to_f32()))
    }
    #[inline]
    fn from_wide(w: Wide) -> Self {
        f32_to_bf16(wide_to_f32(w))
    }
    #[inline]
    fn add(self, other: Self) -> Self {
        f32_to_bf16(self.to_f32() + other.to_f32())
    }
}

// Integers: integer sources wrap (two's complement truncation); float sources
// go through the x86-64 truncating conversion the reference compiler emits (a
// 32-bit conversion for types of 32 bits and less, except uint32, which
// converts to 64 bits first).
macro_rules! int_elem {
    ($t:ty, $dt:expr, $wide:ident, |$f:ident| $from_float:expr) => {
        impl Elem for $t {
            const DTYPE: DType = $dt;
            #[inline]
            fn to_wide(self) -> Wide {
                Wide::$wide(self as _)
            }
            #[inline]
            fn from_wide(w: Wide) -> Self {
                match w {
                    Wide::I(i) => i as $t,
                    Wide::U(u) => u as $t,
                    Wide::F($f) => $from_float,
                }
            }
            #[inline]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    };
}
int_elem!(u8, DType::U8, I, |f| cvtt32(f) as u8);
int_elem!(i8, DType::I8, I, |f| cvtt32(f) as i8);
int_elem!(i16, DType::I16, I, |f| cvtt32(f) as i16);
int_elem!(u16, DType::U16, I, |f| cvtt32(f) as u16);
int_elem!(i32, DType::I32, I, |f| cvtt32(f));
int_elem!(u32, DType::U32, I, |f| cvtt64(f) as u32);
int_elem!(i64, DType::I64, I, |f| cvtt64(f));
int_elem!(u64, DType::U64, U, |f| {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    if f >= TWO63 {
        (cvtt64(f - TWO63) as u64) ^ (1 << 63)
    } else {
        cvtt64(f) as u64
    }
});

impl Elem for Bool8 {
    const DTYPE: DType = DType::Bool;
    #[inline]
    fn to_wide(self) -> Wide {
        Wide::I(i64::from(self.0 != 0))
    }
    #[inline]
    fn from_wide(w: Wide) -> Self {
        Bool8(u8::from(match w {
            Wide::I(i) => i != 0,
            Wide::U(u) => u != 0,
            Wide::F(f) => f != 0.0,
        }))
    }
    /// Never used for sums (the store refuses to sum booleans, as MXNet
    /// cannot); defined as logical or.
    #[inline]
    fn add(self, other: Self) -> Self {
        Bool8(u8::from(self.0 != 0 || other.0 != 0))
    }
}

/// Runs `$body` with `$T` bound to the Rust element type of `$dt`.
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr) => {{
        use $crate::ndarray::dtype::{Bool8, DType};
        match $dt {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I8 => {
                type $T = i8;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::Bool => {
                type $T = Bool8;
                $body
            }
            DType::I16 => {
                type $T = i16;
                $body
            }
            DType::U16 => {
                type $T = u16;
                $body
            }
            DType::U32 => {
                type $T = u32;
                $body
            }
            DType::U64 => {
                type $T = u64;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
        }
    }};
}

/// Converts `src` elementwise into `dst` (same length).
pub fn convert<S: Elem, D: Elem>(src: &[S], dst: &mut [D]) {
    debug_assert_eq!(src.len(), dst.len());
    for (d, s) in dst.iter_mut().zip(src) {
        *d = D::from_wide(s.to_wide());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (i, dt) in DType::ALL.iter().enumerate() {
            assert_eq!(DType::from_code(i as i32).unwrap(), *dt);
            assert_eq!(dt.code(), i as i32);
        }
        assert_eq!(
            DType::from_code(99).unwrap_err().message(),
            "Unknown type enum 99"
        );
        assert!(DType::from_code(-1).is_err());
    }

    #[test]
    fn float_to_int_follows_x86_truncation() {
        assert_eq!(i32::from_wide(Wide::F(1.7)), 1);
        assert_eq!(i32::from_wide(Wide::F(-2.7)), -2);
        assert_eq!(i32::from_wide(Wide::F(1e10)), i32::MIN);
        assert_eq!(i32::from_wide(Wide::F(f64::NAN)), i32::MIN);
        assert_eq!(u8::from_wide(Wide::F(300.7)), 44);
        assert_eq!(u8::from_wide(Wide::F(-1.5)), 255);
        assert_eq!(u64::from_wide(Wide::F(1.5e19)), 15000000000000000000);
        assert_eq!(u64::from_wide(Wide::F(f64::NAN)), 1 << 63);
        assert_eq!(Bool8::from_wide(Wide::F(-0.0)), Bool8(0));
        assert_eq!(Bool8::from_wide(Wide::F(0.25)), Bool8(1));
    }

    #[test]
    fn half_adds_round_once_per_operation() {
        let a = f16::from_f32(1.0);
        let b = f16::from_f32(0.0004);
        // 1 + 0.0004 rounds back to 1 in float16.
        assert_eq!(a.add(b), a);
        assert_eq!(f16::from_wide(Wide::I(65519)).to_f32(), 65504.0);
        // double → half rounds through float first.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16::from_wide(Wide::F(x)).to_bits(), 0x3c00);
        assert_eq!(f32_to_f16(f32::from_bits(0x7f80_0001)).to_bits(), 0x7c01);
        assert_eq!(f32_to_f16(f32::from_bits(0x7fc0_0000)).to_bits(), 0x7e00);
        assert_eq!(f16_to_f32(f16::from_bits(0x7c01)).to_bits(), 0x7f80_2000);
        assert_eq!(f32_to_f16(65520.0).to_bits(), 0x7c00);
    }

    #[test]
    fn bfloat16_truncates() {
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0).to_bits(), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)).to_bits(), 0x7f80);
        let one = bf16::from_bits(0x3f80);
        let tiny = bf16::from_wide(Wide::F(1.0 / 256.0));
        assert_eq!(one.add(tiny).to_bits(), 0x3f80);
    }
}
