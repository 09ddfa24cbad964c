//! Gradient compression: parameters and the quantization kernels.
//!
//! # Parameters (`MXKVStoreSetGradientCompression`)
//!
//! [`CompressionParams::parse`] reads the key/value strings as MXNet 1.9.1's
//! `GradientCompression::SetParams` does (`src/kvstore/gradient_compression.cc`):
//! a dmlc parameter struct (`InitAllowUnknown`: unknown keys are ignored, keys
//! are applied in list order so the last value of a repeated key wins) with
//! `type` (string, required) and `threshold` (float, default 0.5), then
//! `CHECK_GT(threshold, 0)`, then the type must be `2bit` (exact,
//! case-sensitive). The error texts are MXNet's:
//!
//! * no `type`: `Required parameter type of string is not presented`
//!   (a bad `threshold` is reported first: values are parsed before defaults
//!   are checked);
//! * `threshold` is parsed by dmlc-core's `FieldEntry<float>::Set`, i.e.
//!   `dmlc::stof` (see [`parse_float_param`]; *not* correctly rounded);
//! * `threshold <= 0` (or NaN): `Check failed: params.threshold > 0 (-1 vs. 0)
//!   : threshold must be greater than 0`, the value printed like C++'s
//!   `ostream << float` (`%g`, 6 significant digits);
//! * any other type: `Unknown type for gradient compression <type>`.
//!
//! **Extension**: `type = "1bit"` selects MXNet 2.0's 1-bit compression
//! (below). As in MXNet 2.0 the `threshold > 0` check does not apply to it: any
//! threshold, including 0 and negative values, is accepted, and its default is
//! the same 0.5.
//!
//! # 2-bit compression (MXNet 1.9.1)
//!
//! Per element, in float32, with a persistent residual `r` (zeros at first):
//! `r += g`; if `r >= t` emit `+t` (code `11`) and `r -= t`; else if `r <= -t`
//! emit `-t` (code `10`) and `r += t`; else emit 0 (code `00`). NaN never
//! quantizes (code `00`, residual stays NaN); `±inf` emits `±t` every time and
//! the residual stays `±inf`. 16 codes per `u32` word (`ceil(n/16)` words):
//! element `16w + j` sits at shift `8*(j/4) + 6 - 2*(j%4)` of word `w` (byte
//! `j/4` of the little-endian word, most significant bit pair first). Unused
//! slots are `00`; every word is fully rewritten. Dequantization: `11` → `+t`,
//! `10` → `-t`, `00` and `01` → `+0.0`.
//!
//! # 1-bit compression (MXNet 2.0, extension)
//!
//! From apache/mxnet master (b84609d3, MXNet 2.0)
//! `src/kvstore/gradient_compression-inl.h` (`quantize_1bit`, lines 48-83;
//! `dequantize_1bit`, lines 99-121) and `gradient_compression.cc`
//! (`SetParams` lines 40-52, `GetCompressionFactor` lines 92-101):
//! per element, `r += g`; if `r > t` (strict) the bit is 1 and `r -= 1`,
//! otherwise the bit is 0 and `r += 1`. Dequantization gives `+1.0` for a 1
//! bit and `-1.0` for a 0 bit: the threshold is only the decision boundary,
//! the emitted magnitude is always 1 (whatever `t` is) and the residual moves
//! by 1. NaN gives bit 0 (dequantized -1, residual stays NaN). 32 bits per
//! `u32` word (`ceil(n/32)` words, `GetCompressionFactor` returns 32):
//! element `32w + j` sits in byte `j/8` of the little-endian word, bit
//! `7 - j%8` (most significant bit first), i.e. at shift `8*(j/8) + 7 - j%8`.
//! Unused bits are 0; every word is fully rewritten.
//!
//! # Dist parameters
//!
//! [`CompressionParams::encode`] / [`CompressionParams::decode`] are
//! `EncodeParams` / `DecodeParams`: the `kSetGradientCompression` body
//! `"1,<threshold %f>"`, read back correctly rounded on the server, so the
//! server dequantizes with `float("%f" % t)` while workers quantize with `t`.
//!
//! # Parallelism
//!
//! Arrays of at least [`PARALLEL_MIN_ELEMENTS`] elements are processed with
//! rayon in chunks of [`PARALLEL_CHUNK_ELEMENTS`] elements (a multiple of 32,
//! so no word straddles two chunks). Every element is computed independently,
//! so results are bit-identical to the serial loop.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use rayon::prelude::*;

/// The threshold when none is given (`GradientCompressionParam`).
pub const DEFAULT_THRESHOLD: f32 = 0.5;

/// Arrays with at least this many elements are quantized in parallel.
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Elements per parallel chunk; a multiple of 16 and 32.
pub const PARALLEL_CHUNK_ELEMENTS: usize = 1 << 14;

/// Which quantization the store applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressionKind {
    /// MXNet 1.9.1's 2-bit compression (`type = "2bit"`).
    TwoBit,
    /// MXNet 2.0's 1-bit compression (`type = "1bit"`, an extension).
    OneBit,
}

impl CompressionKind {
    /// Gradient values per compressed `u32` word (MXNet's
    /// `GetCompressionFactor`): 16 for 2-bit, 32 for 1-bit.
    pub fn values_per_word(self) -> usize {
        match self {
            CompressionKind::TwoBit => 16,
            CompressionKind::OneBit => 32,
        }
    }

    /// Number of `u32` words for `n` values: `ceil(n / values_per_word)`.
    pub fn compressed_len(self, n: usize) -> usize {
        n.div_ceil(self.values_per_word())
    }
}

/// Validated gradient compression settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressionParams {
    pub kind: CompressionKind,
    pub threshold: f32,
}

impl CompressionParams {
    /// Parses `MXKVStoreSetGradientCompression`'s key/value pairs; see the
    /// module documentation for the rules and error texts.
    pub fn parse(params: &[(Vec<u8>, Vec<u8>)]) -> Result<CompressionParams> {
        let mut kind: Option<&[u8]> = None;
        let mut threshold = DEFAULT_THRESHOLD;
        for (key, value) in params {
            match key.as_slice() {
                b"type" => kind = Some(value),
                b"threshold" => threshold = parse_float_param("threshold", value)?,
                _ => {}
            }
        }
        let Some(kind) = kind else {
            return Err(Error::new(
                "Required parameter type of string is not presented",
            ));
        };
        if kind == b"1bit" {
            return Ok(CompressionParams {
                kind: CompressionKind::OneBit,
                threshold,
            });
        }
        let positive = threshold > 0.0; // false for NaN too
        if !positive {
            return Err(Error::new(format!(
                "Check failed: params.threshold > 0 ({} vs. 0) : threshold must be greater than 0",
                format_float_g(threshold)
            )));
        }
        if kind != b"2bit" {
            return Err(Error::new(format!(
                "Unknown type for gradient compression {}",
                String::from_utf8_lossy(kind)
            )));
        }
        Ok(CompressionParams {
            kind: CompressionKind::TwoBit,
            threshold,
        })
    }

    /// The `kSetGradientCompression` body rank 0 sends to the servers
    /// (`GradientCompression::EncodeParams`): `"<type>,<threshold as %f>"`,
    /// e.g. `1,0.500000`. Type 1 is 1.9.1's code for 2-bit. 1-bit gets 2,
    /// a libmxkv choice: MXNet 2.0 numbers 1-bit 1 and 2-bit 2, which cannot
    /// be followed without breaking 1.9.1's `1` = 2-bit.
    pub fn encode(&self) -> String {
        let code = match self.kind {
            CompressionKind::TwoBit => 1,
            CompressionKind::OneBit => 2,
        };
        format!("{code},{}", format_float_f(self.threshold))
    }

    /// The server side of [`encode`](Self::encode)
    /// (`GradientCompression::DecodeParams`): `"0"` is no compression
    /// (`None`); the threshold is read back correctly rounded (`std::stof`),
    /// so the server works with `float("%f" % t)`: 0.1234567 becomes
    /// 0.123457 and 1e-7 becomes 0. A missing threshold leaves MXNet's
    /// initial 0.
    pub fn decode(body: &[u8]) -> Result<Option<CompressionParams>> {
        let text = String::from_utf8_lossy(body);
        let bad = || Error::new(format!("invalid gradient compression parameters '{text}'"));
        let mut parts = text.split(',');
        let code: i32 = parts
            .next()
            .unwrap_or("")
            .trim()
            .parse()
            .map_err(|_| bad())?;
        let kind = match code {
            0 => return Ok(None),
            1 => CompressionKind::TwoBit,
            2 => CompressionKind::OneBit,
            _ => return Err(bad()),
        };
        let threshold = match parts.next().map(str::trim) {
            None | Some("") => 0.0,
            Some(t) => t.parse::<f32>().map_err(|_| bad())?,
        };
        Ok(Some(CompressionParams { kind, threshold }))
    }

    /// `u32` words needed to compress `n` values.
    pub fn compressed_len(&self, n: usize) -> usize {
        self.kind.compressed_len(n)
    }

    /// [`quantize_2bit`] or [`quantize_1bit`] with these settings.
    pub fn quantize(&self, grad: &[f32], residual: &mut [f32], out: &mut [u32]) {
        match self.kind {
            CompressionKind::TwoBit => quantize_2bit(grad, residual, self.threshold, out),
            CompressionKind::OneBit => quantize_1bit(grad, residual, self.threshold, out),
        }
    }

    /// [`dequantize_2bit`] or [`dequantize_1bit`] with these settings.
    pub fn dequantize(&self, words: &[u32], n: usize, out: &mut [f32]) {
        match self.kind {
            CompressionKind::TwoBit => dequantize_2bit(words, n, self.threshold, out),
            CompressionKind::OneBit => dequantize_1bit(words, n, self.threshold, out),
        }
    }

    /// [`quantize_dequantize_2bit`] or [`quantize_dequantize_1bit`].
    pub fn quantize_dequantize(&self, grad: &[f32], residual: &mut [f32], out: &mut [f32]) {
        match self.kind {
            CompressionKind::TwoBit => {
                quantize_dequantize_2bit(grad, residual, self.threshold, out)
            }
            CompressionKind::OneBit => {
                quantize_dequantize_1bit(grad, residual, self.threshold, out)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Parameter parsing: dmlc-core's float parser.

/// Parses a float parameter as dmlc-core's `FieldEntry<float>::Set` does
/// (`include/dmlc/parameter.h` at the dmlc-core commit MXNet 1.9.1 pins,
/// 5df8305f): `dmlc::stof` (`include/dmlc/strtonum.h`:
/// `ParseFloat<float, CheckRange = true>`), which must consume the whole
/// string. `key` only names the parameter in error messages.
///
/// The parser is dmlc's, not a correctly rounded one: leading blanks
/// (` \t\r\n\f`) are skipped, then an optional sign, `inf`/`infinity`/`nan`
/// (case-insensitive; `nan(chars)` too), else integer digits (as `u64`), up to
/// 19 fraction digits (divided in double precision, then added in float), an
/// exponent applied by float multiplications by `1e8` and `10`, and an
/// optional `f` suffix. Exponents above 38, and exactly 38 with a significand
/// out of range, are range errors (also for negative exponents: `1e-39`).
/// Errors:
/// * nothing parsed: `Invalid Parameter format for <key> expect float but value='<value>'`
/// * range: `Out of range value for <key>, value='<value>'`
/// * unparsed rest: `Some trailing characters could not be parsed: '<rest>'`
///
/// `dmlc::stof` also reports a range error when a stale `errno == ERANGE`
/// meets a `+inf` result; that depends on unrelated earlier calls and is not
/// reproduced.
pub fn parse_float_param(key: &str, value: &[u8]) -> Result<f32> {
    let shown = || String::from_utf8_lossy(value).into_owned();
    match dmlc_parse_f32(value) {
        Parsed::Value(v, pos) => {
            if pos < value.len() {
                Err(Error::new(format!(
                    "Some trailing characters could not be parsed: '{}'",
                    String::from_utf8_lossy(&value[pos..])
                )))
            } else {
                Ok(v)
            }
        }
        Parsed::Nothing => Err(Error::new(format!(
            "Invalid Parameter format for {key} expect float but value='{}'",
            shown()
        ))),
        Parsed::OutOfRange => Err(Error::new(format!(
            "Out of range value for {key}, value='{}'",
            shown()
        ))),
        Parsed::BadNan(found) => {
            // CHECK_EQ(*p, ')') << "Invalid NAN literal"; the C string of
            // the message ends at a NUL character printed for end of input.
            let mut msg = String::from("Check failed: *p == ')' (");
            if let Some(c) = found {
                msg.push_str(&String::from_utf8_lossy(&[c]));
                msg.push_str(" vs. )) : Invalid NAN literal");
            }
            Err(Error::new(msg))
        }
    }
}

/// Outcome of [`dmlc_parse_f32`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Parsed {
    /// The value and the number of bytes consumed (`endptr - nptr`, > 0).
    Value(f32, usize),
    /// `endptr == nptr`: `std::invalid_argument`.
    Nothing,
    /// `errno = ERANGE` with `+inf`: `std::out_of_range`.
    OutOfRange,
    /// `nan(` not closed by `)`: the byte found instead (None = end).
    BadNan(Option<u8>),
}

/// `dmlc::stof`: `dmlc::ParseFloat<float, true>` plus its two throws.
fn dmlc_parse_f32(s: &[u8]) -> Parsed {
    // The C string: reading past the end yields the NUL terminator.
    let at = |i: usize| -> u8 { s.get(i).copied().unwrap_or(0) };
    const MAX_EXPONENT: u32 = 38;
    const MAX_SIGNIFICAND: f32 = 3.402_823_5; // (float)3.402823466
    const MAX_SIGNIFICAND_NEG: f32 = 1.175_494_4; // (float)1.175494351
    const MAX_DIGITS: u32 = 19;

    let mut p = 0usize;
    while matches!(at(p), b' ' | b'\t' | b'\r' | b'\n' | b'\x0c') {
        p += 1;
    }
    let mut positive = true;
    if at(p) == b'-' {
        positive = false;
        p += 1;
    } else if at(p) == b'+' {
        p += 1;
    }
    // inf / infinity, nan / nan(chars): `(*p | 32) == "infinity"[i]`.
    let matched = |p: usize, word: &[u8]| -> usize {
        word.iter()
            .enumerate()
            .take_while(|&(i, &c)| at(p + i) | 32 == c)
            .count()
    };
    let i = matched(p, b"infinity");
    if i == 3 || i == 8 {
        return Parsed::Value(
            if positive {
                f32::INFINITY
            } else {
                f32::NEG_INFINITY
            },
            p + i,
        );
    }
    if matched(p, b"nan") == 3 {
        p += 3;
        if at(p) == b'(' {
            p += 1;
            while at(p).is_ascii_alphanumeric() || at(p) == b'_' {
                p += 1;
            }
            if at(p) != b')' {
                return Parsed::BadNan(s.get(p).copied());
            }
            p += 1;
        }
        return Parsed::Value(f32::NAN, p);
    }

    let mut predec: u64 = 0;
    while at(p).is_ascii_digit() {
        predec = predec
            .wrapping_mul(10)
            .wrapping_add(u64::from(at(p) - b'0'));
        p += 1;
    }
    let mut value = predec as f32;

    if at(p) == b'.' {
        p += 1;
        let mut pow10: u64 = 1;
        let mut val2: u64 = 0;
        let mut count = 0u32;
        while at(p).is_ascii_digit() {
            if count < MAX_DIGITS {
                val2 = val2 * 10 + u64::from(at(p) - b'0');
                pow10 *= 10;
            }
            p += 1;
            count += 1;
        }
        value += (val2 as f64 / pow10 as f64) as f32;
    }

    if at(p) == b'e' || at(p) == b'E' {
        p += 1;
        let mut frac = false;
        if at(p) == b'-' {
            frac = true;
            p += 1;
        } else if at(p) == b'+' {
            p += 1;
        }
        let mut expon: u32 = 0;
        while at(p).is_ascii_digit() {
            expon = expon.wrapping_mul(10).wrapping_add(u32::from(at(p) - b'0'));
            p += 1;
        }
        if expon > MAX_EXPONENT {
            return Parsed::OutOfRange;
        }
        if expon == MAX_EXPONENT
            && ((!frac && value > MAX_SIGNIFICAND) || (frac && value < MAX_SIGNIFICAND_NEG))
        {
            return Parsed::OutOfRange;
        }
        let mut scale: f32 = 1.0;
        while expon >= 8 {
            scale *= 1e8;
            expon -= 8;
        }
        while expon > 0 {
            scale *= 10.0;
            expon -= 1;
        }
        value = if frac { value / scale } else { value * scale };
    }
    if at(p) == b'f' || at(p) == b'F' {
        p += 1;
    }
    if p == 0 {
        return Parsed::Nothing;
    }
    Parsed::Value(if positive { value } else { -value }, p)
}

/// A float as C++'s `ostream << float` prints it by default (`%g` with 6
/// significant digits: `0.001`, `-1`, `1e-07`, `1.23457e+06`, `nan`, `-inf`).
pub fn format_float_g(x: f32) -> String {
    let x = f64::from(x);
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    const P: i32 = 6;
    let e_form = format!("{:.*e}", (P - 1) as usize, x);
    let (mantissa, exp) = e_form.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..P).contains(&exp) {
        trim(&format!("{:.*}", (P - 1 - exp) as usize, x))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{}{:02}", trim(mantissa), sign, exp.abs())
    }
}

/// A float as C's `printf("%f")` (and `std::to_string(float)`) prints it:
/// six decimals, `inf`, `nan`/`-nan`.
pub fn format_float_f(x: f32) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    format!("{:.6}", f64::from(x))
}

// ---------------------------------------------------------------------------
// Kernels.

/// One 2-bit step for one element: updates the residual, returns the code.
#[inline(always)]
fn step_2bit(g: f32, r: &mut f32, pos: f32, neg: f32) -> u32 {
    let v = *r + g;
    if v >= pos {
        *r = v - pos;
        0b11
    } else if v <= neg {
        *r = v - neg;
        0b10
    } else {
        *r = v;
        0b00
    }
}

/// The value a 2-bit code stands for.
#[inline(always)]
fn value_2bit(code: u32, pos: f32, neg: f32) -> f32 {
    match code {
        0b11 => pos,
        0b10 => neg,
        _ => 0.0,
    }
}

/// One 1-bit step for one element: updates the residual, returns the bit.
#[inline(always)]
fn step_1bit(g: f32, r: &mut f32, t: f32) -> u32 {
    let v = *r + g;
    if v > t {
        *r = v - 1.0;
        1
    } else {
        *r = v + 1.0;
        0
    }
}

#[inline(always)]
fn value_1bit(bit: u32) -> f32 {
    if bit == 1 {
        1.0
    } else {
        -1.0
    }
}

#[inline(always)]
fn shift_2bit(j: usize) -> u32 {
    (8 * (j / 4) + 6 - 2 * (j % 4)) as u32
}

#[inline(always)]
fn shift_1bit(j: usize) -> u32 {
    (8 * (j / 8) + 7 - j % 8) as u32
}

fn check_quantize_lens(grad: &[f32], residual: &[f32], words: usize, out: usize, kind: &str) {
    assert_eq!(
        grad.len(),
        residual.len(),
        "{kind} quantize: gradient and residual lengths differ"
    );
    assert_eq!(
        out,
        words,
        "{kind} quantize: output needs {words} words for {} values",
        grad.len()
    );
}

fn quantize_words_serial<F>(grad: &[f32], residual: &mut [f32], out: &mut [u32], per: usize, f: &F)
where
    F: Fn(&[f32], &mut [f32]) -> u32,
{
    for (w, word) in out.iter_mut().enumerate() {
        let start = (w * per).min(grad.len());
        let end = (start + per).min(grad.len());
        *word = f(&grad[start..end], &mut residual[start..end]);
    }
}

fn quantize_words<F>(grad: &[f32], residual: &mut [f32], out: &mut [u32], per: usize, f: F)
where
    F: Fn(&[f32], &mut [f32]) -> u32 + Sync,
{
    if grad.len() < PARALLEL_MIN_ELEMENTS || !crate::ndarray::kernels::parallel() {
        quantize_words_serial(grad, residual, out, per, &f);
        return;
    }
    grad.par_chunks(PARALLEL_CHUNK_ELEMENTS)
        .zip(residual.par_chunks_mut(PARALLEL_CHUNK_ELEMENTS))
        .zip(out.par_chunks_mut(PARALLEL_CHUNK_ELEMENTS / per))
        .for_each(|((g, r), o)| quantize_words_serial(g, r, o, per, &f));
}

fn for_each_element<F>(grad: &[f32], residual: &mut [f32], out: &mut [f32], f: F)
where
    F: Fn(f32, &mut f32) -> f32 + Sync,
{
    let serial = |g: &[f32], r: &mut [f32], o: &mut [f32]| {
        for ((g, r), o) in g.iter().zip(r.iter_mut()).zip(o.iter_mut()) {
            *o = f(*g, r);
        }
    };
    if grad.len() < PARALLEL_MIN_ELEMENTS || !crate::ndarray::kernels::parallel() {
        serial(grad, residual, out);
        return;
    }
    grad.par_chunks(PARALLEL_CHUNK_ELEMENTS)
        .zip(residual.par_chunks_mut(PARALLEL_CHUNK_ELEMENTS))
        .zip(out.par_chunks_mut(PARALLEL_CHUNK_ELEMENTS))
        .for_each(|((g, r), o)| serial(g, r, o));
}

fn dequantize_words<F>(words: &[u32], out: &mut [f32], per: usize, f: F)
where
    F: Fn(u32, usize) -> f32 + Sync,
{
    let serial = |w: &[u32], o: &mut [f32]| {
        for (block, word) in o.chunks_mut(per).zip(w) {
            for (j, v) in block.iter_mut().enumerate() {
                *v = f(*word, j);
            }
        }
    };
    if out.len() < PARALLEL_MIN_ELEMENTS || !crate::ndarray::kernels::parallel() {
        serial(words, out);
        return;
    }
    words
        .par_chunks(PARALLEL_CHUNK_ELEMENTS / per)
        .zip(out.par_chunks_mut(PARALLEL_CHUNK_ELEMENTS))
        .for_each(|(w, o)| serial(w, o));
}

/// MXNet 1.9.1's 2-bit quantization: adds `grad` into `residual` and writes
/// the codes into `out` (`ceil(n/16)` words, every word rewritten).
///
/// Panics if `residual` is not as long as `grad` or `out` is not
/// `ceil(grad.len() / 16)` words long.
pub fn quantize_2bit(grad: &[f32], residual: &mut [f32], threshold: f32, out: &mut [u32]) {
    let words = CompressionKind::TwoBit.compressed_len(grad.len());
    check_quantize_lens(grad, residual, words, out.len(), "2-bit");
    let (pos, neg) = (threshold, -threshold);
    quantize_words(grad, residual, out, 16, |g, r| {
        let mut word = 0u32;
        for (j, (g, r)) in g.iter().zip(r.iter_mut()).enumerate() {
            word |= step_2bit(*g, r, pos, neg) << shift_2bit(j);
        }
        word
    });
}

/// MXNet 1.9.1's 2-bit dequantization of the first `n` values of `words`
/// into `out`: `11` → `threshold`, `10` → `-threshold`, else `0.0`.
///
/// Panics if `out` is not `n` long or `words` is not `ceil(n/16)` long.
pub fn dequantize_2bit(words: &[u32], n: usize, threshold: f32, out: &mut [f32]) {
    assert_eq!(out.len(), n, "2-bit dequantize: output is not {n} long");
    assert_eq!(
        words.len(),
        CompressionKind::TwoBit.compressed_len(n),
        "2-bit dequantize: wrong word count for {n} values"
    );
    let (pos, neg) = (threshold, -threshold);
    dequantize_words(words, out, 16, |word, j| {
        value_2bit((word >> shift_2bit(j)) & 0b11, pos, neg)
    });
}

/// What `dequantize_2bit(quantize_2bit(grad))` gives, without the words:
/// updates `residual` and writes `±threshold` or `0.0` into `out`.
///
/// Panics if the three slices differ in length.
pub fn quantize_dequantize_2bit(
    grad: &[f32],
    residual: &mut [f32],
    threshold: f32,
    out: &mut [f32],
) {
    assert!(
        grad.len() == residual.len() && grad.len() == out.len(),
        "2-bit quantize: gradient, residual and output lengths differ"
    );
    let (pos, neg) = (threshold, -threshold);
    for_each_element(grad, residual, out, |g, r| {
        value_2bit(step_2bit(g, r, pos, neg), pos, neg)
    });
}

/// MXNet 2.0's 1-bit quantization: adds `grad` into `residual`; a value
/// above `threshold` gives bit 1 and `residual -= 1`, otherwise bit 0 and
/// `residual += 1`. Writes `ceil(n/32)` words, every word rewritten.
///
/// Panics if `residual` is not as long as `grad` or `out` is not
/// `ceil(grad.len() / 32)` words long.
pub fn quantize_1bit(grad: &[f32], residual: &mut [f32], threshold: f32, out: &mut [u32]) {
    let words = CompressionKind::OneBit.compressed_len(grad.len());
    check_quantize_lens(grad, residual, words, out.len(), "1-bit");
    quantize_words(grad, residual, out, 32, |g, r| {
        let mut word = 0u32;
        for (j, (g, r)) in g.iter().zip(r.iter_mut()).enumerate() {
            word |= step_1bit(*g, r, threshold) << shift_1bit(j);
        }
        word
    });
}

/// MXNet 2.0's 1-bit dequantization: bit 1 → `+1.0`, bit 0 → `-1.0`
/// (`threshold` is not used; it is taken for symmetry with MXNet's kernel).
///
/// Panics if `out` is not `n` long or `words` is not `ceil(n/32)` long.
pub fn dequantize_1bit(words: &[u32], n: usize, threshold: f32, out: &mut [f32]) {
    let _ = threshold;
    assert_eq!(out.len(), n, "1-bit dequantize: output is not {n} long");
    assert_eq!(
        words.len(),
        CompressionKind::OneBit.compressed_len(n),
        "1-bit dequantize: wrong word count for {n} values"
    );
    dequantize_words(words, out, 32, |word, j| {
        value_1bit((word >> shift_1bit(j)) & 1)
    });
}

/// What `dequantize_1bit(quantize_1bit(grad))` gives, without the words.
///
/// Panics if the three slices differ in length.
pub fn quantize_dequantize_1bit(
    grad: &[f32],
    residual: &mut [f32],
    threshold: f32,
    out: &mut [f32],
) {
    assert!(
        grad.len() == residual.len() && grad.len() == out.len(),
        "1-bit quantize: gradient, residual and output lengths differ"
    );
    for_each_element(grad, residual, out, |g, r| {
        value_1bit(step_1bit(g, r, threshold))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<CompressionParams> {
        CompressionParams::parse(&kv(pairs))
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        parse(pairs)
            .expect_err("expected an error")
            .message()
            .to_string()
    }

    #[test]
    fn parse_defaults_and_kinds() {
        let p = parse(&[("type", "2bit")]).unwrap();
        assert_eq!(p.kind, CompressionKind::TwoBit);
        assert_eq!(p.threshold, 0.5);
        let p = parse(&[("type", "1bit")]).unwrap();
        assert_eq!(p.kind, CompressionKind::OneBit);
        assert_eq!(p.threshold, 0.5);
        let p = parse(&[("threshold", "1e-3"), ("type", "2bit")]).unwrap();
        assert_eq!(p.threshold, 0.001);
        let p = parse(&[("type", "2bit"), ("threshold", "  0.25")]).unwrap();
        assert_eq!(p.threshold, 0.25);
    }

    #[test]
    fn parse_unknown_keys_ignored_last_value_wins() {
        let p = parse(&[
            ("foo", "bar"),
            ("type", "1bit"),
            ("threshold", "2"),
            ("type", "2bit"),
            ("threshold", "3"),
            ("compression", "x"),
        ])
        .unwrap();
        assert_eq!(p.kind, CompressionKind::TwoBit);
        assert_eq!(p.threshold, 3.0);
        // A bad earlier value is still an error (every value is parsed).
        assert_eq!(
            err(&[("threshold", "abc"), ("threshold", "1"), ("type", "2bit")]),
            "Invalid Parameter format for threshold expect float but value='abc'"
        );
    }

    #[test]
    fn parse_missing_type() {
        let msg = "Required parameter type of string is not presented";
        assert_eq!(CompressionParams::parse(&[]).unwrap_err().message(), msg);
        assert_eq!(err(&[("threshold", "1")]), msg);
        assert_eq!(err(&[("Type", "2bit")]), msg);
        // Values are parsed before missing parameters are reported.
        assert_eq!(
            err(&[("threshold", "1x")]),
            "Some trailing characters could not be parsed: 'x'"
        );
    }

    #[test]
    fn parse_unknown_type() {
        for t in ["2BIT", "none", "", "1BIT", "2bit "] {
            assert_eq!(
                err(&[("type", t)]),
                format!("Unknown type for gradient compression {t}")
            );
        }
    }

    #[test]
    fn parse_threshold_check() {
        let check = |v: &str| {
            format!(
                "Check failed: params.threshold > 0 ({v} vs. 0) : threshold must be greater than 0"
            )
        };
        assert_eq!(err(&[("type", "2bit"), ("threshold", "0")]), check("0"));
        assert_eq!(err(&[("type", "2bit"), ("threshold", "-1")]), check("-1"));
        assert_eq!(err(&[("type", "2bit"), ("threshold", "-0")]), check("-0"));
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "-0.001")]),
            check("-0.001")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "-1e-7")]),
            check("-1e-07")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "-1234567")]),
            check("-1.23457e+06")
        );
        assert_eq!(err(&[("type", "2bit"), ("threshold", "nan")]), check("nan"));
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "-inf")]),
            check("-inf")
        );
        // dmlc accepts a lone sign, '.', 'e' or 'f' (all zero) and blanks.
        assert_eq!(err(&[("type", "2bit"), ("threshold", "-")]), check("-0"));
        assert_eq!(err(&[("type", "2bit"), ("threshold", ".")]), check("0"));
        assert_eq!(err(&[("type", "2bit"), ("threshold", "f")]), check("0"));
        assert_eq!(err(&[("type", "2bit"), ("threshold", "  ")]), check("0"));
        // MXNet checks the threshold before the type.
        assert_eq!(err(&[("type", "none"), ("threshold", "0")]), check("0"));
        // 1-bit (MXNet 2.0) takes any threshold.
        let p = parse(&[("type", "1bit"), ("threshold", "0")]).unwrap();
        assert_eq!((p.kind, p.threshold), (CompressionKind::OneBit, 0.0));
        let p = parse(&[("type", "1bit"), ("threshold", "-2")]).unwrap();
        assert_eq!(p.threshold, -2.0);
        // +inf passes the check.
        assert_eq!(
            parse(&[("type", "2bit"), ("threshold", "INF")])
                .unwrap()
                .threshold,
            f32::INFINITY
        );
    }

    #[test]
    fn parse_threshold_format_errors() {
        let bad = |v: &str| {
            format!("Invalid Parameter format for threshold expect float but value='{v}'")
        };
        assert_eq!(err(&[("type", "2bit"), ("threshold", "abc")]), bad("abc"));
        assert_eq!(err(&[("type", "2bit"), ("threshold", "")]), bad(""));
        assert_eq!(err(&[("type", "2bit"), ("threshold", "x1")]), bad("x1"));
        let trailing = |v: &str| format!("Some trailing characters could not be parsed: '{v}'");
        assert_eq!(err(&[("type", "2bit"), ("threshold", "1x")]), trailing("x"));
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "0.5 ")]),
            trailing(" ")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "1e5e")]),
            trailing("e")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", " +infin")]),
            trailing("infin")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "1.5ff")]),
            trailing("f")
        );
        let range = |v: &str| format!("Out of range value for threshold, value='{v}'");
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "1e39")]),
            range("1e39")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "-1e39")]),
            range("-1e39")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "1e-39")]),
            range("1e-39")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "1e-38")]),
            range("1e-38")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "4e38")]),
            range("4e38")
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "nan(1")]),
            "Check failed: *p == ')' ("
        );
        assert_eq!(
            err(&[("type", "2bit"), ("threshold", "nan(1-")]),
            "Check failed: *p == ')' (- vs. )) : Invalid NAN literal"
        );
    }

    #[test]
    fn dmlc_parser_values() {
        let f = |s: &str| parse_float_param("x", s.as_bytes()).unwrap();
        assert_eq!(f("0.5"), 0.5);
        assert_eq!(f("1e-3"), 0.001);
        assert_eq!(f("+2.5E+1"), 25.0);
        assert_eq!(f("1.5f"), 1.5);
        // Not correctly rounded: one ulp off (as bindings/python/mxkv/_numerics.py).
        assert_eq!(f("3e38").to_bits(), 0x7f61_b1e7); // strtof: 0x7f61b1e6
        assert_eq!(f("2e-38").to_bits(), 0x00d9_c7dc); // strtof: 0x00d9c7dd
        assert_eq!(f("-1.001e+08").to_bits(), 0xccbe_ecf5); // strtof: 0xccbeecf4
        assert_eq!(f("Infinity"), f32::INFINITY);
        assert_eq!(f("-inf"), f32::NEG_INFINITY);
        assert!(f("nan(abc_1)").is_nan());
        assert!(f("-nan").is_nan());
        // Overflow by multiplication is not a range error.
        assert_eq!(f("100e37"), f32::INFINITY);
        let v = f("5.692038748222122e-09");
        let correct: f32 = "5.692038748222122e-09".parse().unwrap();
        assert_eq!(v.to_bits().abs_diff(correct.to_bits()), 1);
        // 20th and later fraction digits are ignored.
        assert_eq!(f("0.12345678901234567899999"), f("0.1234567890123456789"));
    }

    #[test]
    fn float_g_format() {
        let cases: &[(f32, &str)] = &[
            (0.0, "0"),
            (-1.0, "-1"),
            (0.001, "0.001"),
            (0.5, "0.5"),
            (0.1234567, "0.123457"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1e-7, "1e-07"),
            (1e20, "1e+20"),
            (0.0009765625, "0.000976562"),
            (999999.5, "1e+06"),
            (f32::MAX, "3.40282e+38"),
            (f32::from_bits(1), "1.4013e-45"),
        ];
        for (x, s) in cases {
            assert_eq!(format_float_g(*x), *s, "{x:e}");
        }
    }

    #[test]
    fn encode_decode() {
        let p = parse(&[("type", "2bit"), ("threshold", "0.1234567")]).unwrap();
        assert_eq!(p.encode(), "1,0.123457");
        let back = CompressionParams::decode(p.encode().as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(
            (back.kind, back.threshold),
            (CompressionKind::TwoBit, 0.123457)
        );
        let p = parse(&[("type", "2bit"), ("threshold", "1e-7")]).unwrap();
        assert_eq!(p.encode(), "1,0.000000");
        assert_eq!(
            CompressionParams::decode(p.encode().as_bytes())
                .unwrap()
                .unwrap()
                .threshold,
            0.0
        );
        assert_eq!(parse(&[("type", "2bit")]).unwrap().encode(), "1,0.500000");
        assert_eq!(
            parse(&[("type", "1bit"), ("threshold", "0")])
                .unwrap()
                .encode(),
            "2,0.000000"
        );
        assert_eq!(CompressionParams::decode(b"0").unwrap(), None);
        let one = CompressionParams::decode(b"2,-1.5").unwrap().unwrap();
        assert_eq!((one.kind, one.threshold), (CompressionKind::OneBit, -1.5));
        assert!(CompressionParams::decode(b"x,1").is_err());
        assert!(CompressionParams::decode(b"7,1").is_err());
        assert_eq!(format_float_f(0.0078125), "0.007812");
        assert_eq!(format_float_f(f32::INFINITY), "inf");
        assert_eq!(format_float_f(-f32::NAN), "-nan");
    }

    #[test]
    fn bit_layout_2bit() {
        let t = 1.0;
        for (i, expect) in [
            (0usize, 0xC0u32),
            (1, 0x30),
            (2, 0x0C),
            (3, 0x03),
            (4, 0xC000),
            (15, 0x0300_0000),
        ] {
            let mut g = vec![0.0f32; 16];
            g[i] = 1.0;
            let mut r = vec![0.0f32; 16];
            let mut w = [0xdead_beefu32];
            quantize_2bit(&g, &mut r, t, &mut w);
            assert_eq!(w[0], expect, "element {i}");
            g[i] = -1.0;
            r.fill(0.0);
            quantize_2bit(&g, &mut r, t, &mut w);
            assert_eq!(w[0], expect & 0xAAAA_AAAA, "element {i} negative");
        }
        // Element 16 starts the next word; unused slots are 00.
        let mut g = vec![0.0f32; 17];
        g[16] = 2.0;
        let mut r = vec![0.0f32; 17];
        let mut w = [u32::MAX; 2];
        quantize_2bit(&g, &mut r, t, &mut w);
        assert_eq!(w, [0, 0xC0]);
        assert_eq!(r[16], 1.0);
    }

    #[test]
    fn dequantize_2bit_codes() {
        let mut out = [9.0f32; 16];
        dequantize_2bit(&[0x5555_5555], 16, 0.5, &mut out);
        assert!(out.iter().all(|v| v.to_bits() == 0));
        dequantize_2bit(&[0xFFFF_FFFF], 16, 0.5, &mut out);
        assert!(out.iter().all(|&v| v == 0.5));
        dequantize_2bit(&[0xAAAA_AAAA], 16, 0.5, &mut out);
        assert!(out.iter().all(|&v| v == -0.5));
        let mut out = [9.0f32; 5];
        dequantize_2bit(&[0x0000_C0B4], 5, 2.0, &mut out);
        assert_eq!(out, [-2.0, 2.0, 0.0, 0.0, 2.0]);
    }

    #[test]
    fn worked_example_b4() {
        let g = [0.3f32, 0.6, -0.7, 1.2];
        let mut r = [0.0f32; 4];
        let mut r2 = [0.0f32; 4];
        let expect_words = [0x3b, 0xfb, 0x3b];
        let expect_deq = [
            [0.0, 0.5, -0.5, 0.5],
            [0.5, 0.5, -0.5, 0.5],
            [0.0, 0.5, -0.5, 0.5],
        ];
        for step in 0..3 {
            let mut w = [0u32];
            quantize_2bit(&g, &mut r, 0.5, &mut w);
            assert_eq!(w[0], expect_words[step]);
            assert_eq!(w[0].to_le_bytes(), [expect_words[step] as u8, 0, 0, 0]);
            let mut d = [1.0f32; 4];
            dequantize_2bit(&w, 4, 0.5, &mut d);
            assert_eq!(d, expect_deq[step]);
            let mut fused = [1.0f32; 4];
            quantize_dequantize_2bit(&g, &mut r2, 0.5, &mut fused);
            assert_eq!(fused, d);
            assert_eq!(r.map(f32::to_bits), r2.map(f32::to_bits));
            if step == 0 {
                assert_eq!(r, [0.3, 0.100000024, -0.19999999, 0.70000005]);
            }
        }
        // 17 × 0.3 with t 0.25, then 17 × -0.3.
        let mut r = [0.0f32; 17];
        let mut w = [0u32; 2];
        quantize_2bit(&[0.3; 17], &mut r, 0.25, &mut w);
        assert_eq!(w, [0xffff_ffff, 0x0000_00c0]);
        quantize_2bit(&[-0.3; 17], &mut r, 0.25, &mut w);
        assert_eq!(w, [0xaaaa_aaaa, 0x0000_0080]);
    }

    #[test]
    fn ties_nan_inf_big_values() {
        let mut r = [0.0f32; 8];
        let mut w = [0u32];
        quantize_2bit(
            &[0.5, -0.5, 0.49999997, -0.49999997, 0.0, -0.0, 1.0, -1.0],
            &mut r,
            0.5,
            &mut w,
        );
        assert_eq!(w[0], 0x0000_0ee0);
        assert_eq!(r, [0.0, 0.0, 0.49999997, -0.49999997, 0.0, 0.0, 0.5, -0.5]);

        let g = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.7];
        let mut r = [0.0f32; 4];
        for _ in 0..2 {
            quantize_2bit(&g, &mut r, 0.5, &mut w);
            assert_eq!(w[0], 0x3b);
            assert!(r[0].is_nan());
            assert_eq!(&r[1..3], &[f32::INFINITY, f32::NEG_INFINITY]);
        }

        let mut r = [0.0f32; 2];
        for step in 1..=3 {
            quantize_2bit(&[10.0, -10.0], &mut r, 0.5, &mut w);
            assert_eq!(w[0], 0xe0);
            assert_eq!(r, [step as f32 * 9.5, step as f32 * -9.5]);
        }
    }

    #[test]
    fn one_bit_semantics_and_layout() {
        // Bit j of a 32-value block: byte j/8, most significant bit first.
        for (i, expect) in [
            (0usize, 0x80u32),
            (1, 0x40),
            (7, 0x01),
            (8, 0x8000),
            (31, 0x0100_0000),
        ] {
            let mut g = vec![0.0f32; 32];
            g[i] = 1.0;
            let mut r = vec![0.0f32; 32];
            let mut w = [0xdead_beefu32];
            quantize_1bit(&g, &mut r, 0.5, &mut w);
            assert_eq!(w[0], expect, "element {i}");
            // Set bit: residual -= 1; the others: residual += 1.
            assert_eq!(r[i], 0.0);
            assert!(r.iter().enumerate().all(|(j, &v)| j == i || v == 1.0));
        }
        // Strict comparison, ±1 output whatever the threshold, residual moves by 1.
        let g = [0.5f32, 0.6, -3.0, f32::NAN, 2.0];
        let mut r = [0.0f32; 5];
        let mut w = [0u32];
        quantize_1bit(&g, &mut r, 0.5, &mut w);
        assert_eq!(w[0], 0x48);
        assert_eq!(&r[..3], &[1.5, 0.6 - 1.0, -2.0]);
        assert!(r[3].is_nan());
        assert_eq!(r[4], 1.0);
        let mut d = [0.0f32; 5];
        dequantize_1bit(&w, 5, 0.5, &mut d);
        assert_eq!(d, [-1.0, 1.0, -1.0, -1.0, 1.0]);
        let mut r2 = [0.0f32; 5];
        let mut fused = [0.0f32; 5];
        quantize_dequantize_1bit(&g, &mut r2, 0.5, &mut fused);
        assert_eq!(fused, d);
        assert_eq!(r[..3], r2[..3]);
        // 33 values: two words, unused bits 0.
        let mut r = [0.0f32; 33];
        let mut w = [u32::MAX; 2];
        quantize_1bit(&[1.0; 33], &mut r, 0.0, &mut w);
        assert_eq!(w, [u32::MAX, 0x80]);
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
            })
            .collect()
    }

    fn serial_2bit(g: &[f32], r: &mut [f32], t: f32) -> (Vec<u32>, Vec<f32>) {
        let mut words = vec![0u32; g.len().div_ceil(16)];
        let mut deq = vec![0f32; g.len()];
        for i in 0..g.len() {
            let code = step_2bit(g[i], &mut r[i], t, -t);
            words[i / 16] |= code << shift_2bit(i % 16);
            deq[i] = value_2bit(code, t, -t);
        }
        (words, deq)
    }

    #[test]
    fn parallel_matches_serial() {
        for kind in [CompressionKind::TwoBit, CompressionKind::OneBit] {
            let p = CompressionParams {
                kind,
                threshold: 0.4,
            };
            for n in [
                PARALLEL_MIN_ELEMENTS - 1,
                PARALLEL_MIN_ELEMENTS,
                PARALLEL_MIN_ELEMENTS + 17,
                200_003,
            ] {
                let g = pseudo_random(n, n as u64);
                let mut r_par = pseudo_random(n, 7);
                let mut r_ser = r_par.clone();
                let mut r_fused = r_par.clone();
                let mut words = vec![0xffff_ffffu32; p.compressed_len(n)];
                p.quantize(&g, &mut r_par, &mut words);
                let mut deq = vec![7.0f32; n];
                p.dequantize(&words, n, &mut deq);
                let mut fused = vec![7.0f32; n];
                p.quantize_dequantize(&g, &mut r_fused, &mut fused);
                let (sw, sd) = match kind {
                    CompressionKind::TwoBit => serial_2bit(&g, &mut r_ser, 0.4),
                    CompressionKind::OneBit => {
                        let mut w = vec![0u32; n.div_ceil(32)];
                        let mut d = vec![0f32; n];
                        for i in 0..n {
                            let b = step_1bit(g[i], &mut r_ser[i], 0.4);
                            w[i / 32] |= b << shift_1bit(i % 32);
                            d[i] = value_1bit(b);
                        }
                        (w, d)
                    }
                };
                assert_eq!(words, sw, "{kind:?} n={n}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&deq), bits(&sd));
                assert_eq!(bits(&fused), bits(&sd));
                assert_eq!(bits(&r_par), bits(&r_ser));
                assert_eq!(bits(&r_fused), bits(&r_ser));
            }
        }
    }

    #[test]
    #[should_panic(expected = "output needs 2 words")]
    fn quantize_checks_word_count() {
        quantize_2bit(&[0.0; 17], &mut [0.0; 17], 0.5, &mut [0u32; 1]);
    }
}
