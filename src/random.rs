//! MXNet 1.9.1's CPU standard normal draws, for frontends that reproduce
//! MXNet's `random.normal` bit for bit (mxkv's Python
//! `mxkv.ndarray.random`, which keeps the engines' states and applies the
//! parameters; the C entry point is `MXKVMTStandardNormal`).
//!
//! MXNet's CPU parallel random resource holds 1024 `std::mt19937` engines.
//! A draw of `n` numbers is split into `nthread = min(ceil(n / 64), 1024)`
//! chunks of `step = ceil(n / nthread)` consecutive outputs; chunk `j` draws
//! with engine `j`, which keeps its state for the next draw. Each number
//! comes from a fresh libstdc++ `normal_distribution<FType>` (Marsaglia's
//! polar method; the pair's second value `x * mult` is dropped):
//! `x = 2u - 1`, `y = 2u' - 1` from two `generate_canonical<FType>` values
//! (float: one 32-bit word / 2^32; double: `(w0 + w1 * 2^32) / 2^64`),
//! redrawn until `0 < x^2 + y^2 <= 1`, then `y * sqrt(-2 log(r2) / r2)`, every
//! operation rounded to FType (there is no fused multiply-add here, as in
//! MXNet's build). The logarithm is the caller's: the C library's `logf`
//! and `log`, which MXNet calls (a correctly rounded or SIMD log differs in
//! the last bit for some inputs).
//!
//! An engine's state is its 624 key words and a position in `0..=624`: the
//! next output is the tempered word at the position, and at 624 the words are
//! twisted first (a fresh engine, `std::mt19937(seed)`, is at 624).

use crate::error::{Error, Result};
use rayon::prelude::*;

/// Key words of one `std::mt19937`.
pub const MT_N: usize = 624;
const MT_M: usize = 397;
/// MXNet's `kMinNumRandomPerThread`: outputs per engine at least.
const MIN_PER_THREAD: usize = 64;

/// One engine: its key words (`MT_N`) and position (see the module docs).
pub struct Engine<'a> {
    key: &'a mut [u32],
    pos: usize,
}

impl Engine<'_> {
    /// The next 32-bit output, as `std::mt19937::operator()`.
    fn next_u32(&mut self) -> u32 {
        if self.pos >= MT_N {
            twist(self.key);
            self.pos = 0;
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C_5680;
        y ^= (y << 15) & 0xEFC6_0000;
        y ^ (y >> 18)
    }
}

/// The next `MT_N` key words, in place (libstdc++'s `_M_gen_rand`).
fn twist(mt: &mut [u32]) {
    const UPPER: u32 = 0x8000_0000;
    const LOWER: u32 = 0x7FFF_FFFF;
    const MATRIX: u32 = 0x9908_B0DF;
    for i in 0..MT_N {
        let y = (mt[i] & UPPER) | (mt[(i + 1) % MT_N] & LOWER);
        let mag = if y & 1 == 1 { MATRIX } else { 0 };
        mt[i] = mt[(i + MT_M) % MT_N] ^ (y >> 1) ^ mag;
    }
}

/// The floating-point type a draw computes in (MXNet's FType).
pub trait Real: Copy + Send + Sync + PartialOrd {
    /// libstdc++'s `generate_canonical<Self, digits>` from `engine`.
    fn canonical(engine: &mut Engine<'_>) -> Self;
    /// One normal from accepted `r2` (`0 < r2 <= 1`) and `y`, with `log`.
    fn polar(y: Self, r2: Self, log: fn(Self) -> Self) -> Self;
    /// `2u - 1`, `x * x + y * y`, and whether `0 < r2 <= 1`.
    fn centred(u: Self) -> Self;
    fn radius2(x: Self, y: Self) -> Self;
    fn accepted(r2: Self) -> bool;
}

impl Real for f32 {
    fn canonical(engine: &mut Engine<'_>) -> f32 {
        engine.next_u32() as f32 / 4_294_967_296.0
    }
    fn polar(y: f32, r2: f32, log: fn(f32) -> f32) -> f32 {
        y * (-2.0 * log(r2) / r2).sqrt()
    }
    fn centred(u: f32) -> f32 {
        2.0 * u - 1.0
    }
    fn radius2(x: f32, y: f32) -> f32 {
        x * x + y * y
    }
    fn accepted(r2: f32) -> bool {
        r2 <= 1.0 && r2 != 0.0
    }
}

impl Real for f64 {
    fn canonical(engine: &mut Engine<'_>) -> f64 {
        let low = engine.next_u32() as f64;
        let high = engine.next_u32() as f64;
        (low + high * 4_294_967_296.0) / 18_446_744_073_709_551_616.0
    }
    fn polar(y: f64, r2: f64, log: fn(f64) -> f64) -> f64 {
        y * (-2.0 * log(r2) / r2).sqrt()
    }
    fn centred(u: f64) -> f64 {
        2.0 * u - 1.0
    }
    fn radius2(x: f64, y: f64) -> f64 {
        x * x + y * y
    }
    fn accepted(r2: f64) -> bool {
        r2 <= 1.0 && r2 != 0.0
    }
}

/// MXNet's split of `n` outputs: (engines used, outputs per engine), with at
/// most `engines` engines.
pub fn split(n: usize, engines: usize) -> (usize, usize) {
    let nthread = n.div_ceil(MIN_PER_THREAD).min(engines).max(1);
    (nthread, n.div_ceil(nthread))
}

/// Fills `out` with MXNet's next `out.len()` standard normals from the
/// engines whose key words are `keys` (`MT_N` per engine) and positions
/// `positions` (one per engine, `0..=MT_N`; MXNet's resource has 1024
/// engines), and moves those engines on. `log` is the logarithm MXNet calls
/// (the C library's). Nothing changes when the arguments are refused.
pub fn standard_normals<T: Real>(
    keys: &mut [u32],
    positions: &mut [i64],
    out: &mut [T],
    log: fn(T) -> T,
) -> Result<()> {
    let engines = positions.len();
    if Some(keys.len()) != engines.checked_mul(MT_N) {
        return Err(Error::new(format!(
            "{} key words for {engines} engines (624 each)",
            keys.len()
        )));
    }
    if let Some(p) = positions.iter().find(|p| !(0..=MT_N as i64).contains(*p)) {
        return Err(Error::new(format!(
            "an engine's position is {p}, outside [0, 624]"
        )));
    }
    if out.is_empty() {
        return Ok(());
    }
    if engines == 0 {
        return Err(Error::new("no engines to draw with"));
    }
    let (_, step) = split(out.len(), engines);
    out.par_chunks_mut(step)
        .zip(keys.par_chunks_mut(MT_N))
        .zip(positions.par_iter_mut())
        .for_each(|((chunk, key), pos)| {
            let mut engine = Engine {
                key,
                pos: *pos as usize,
            };
            for v in chunk.iter_mut() {
                *v = loop {
                    let x = T::centred(T::canonical(&mut engine));
                    let y = T::centred(T::canonical(&mut engine));
                    let r2 = T::radius2(x, y);
                    if T::accepted(r2) {
                        break T::polar(y, r2, log);
                    }
                };
            }
            *pos = engine.pos as i64;
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `std::mt19937(seed)`'s key words, position 624.
    fn seeded(seed: u32) -> Vec<u32> {
        let mut key = vec![seed];
        for i in 1..MT_N as u32 {
            let prev = key[i as usize - 1];
            key.push(
                1_812_433_253u32
                    .wrapping_mul(prev ^ (prev >> 30))
                    .wrapping_add(i),
            );
        }
        key
    }

    #[test]
    fn engines_are_std_mt19937() {
        // the C++ standard: the 10000th output of a default-constructed
        // std::mt19937 (seed 5489) is 4123659995
        let mut key = seeded(5489);
        let mut e = Engine {
            key: &mut key,
            pos: MT_N,
        };
        let last = (0..10_000).map(|_| e.next_u32()).last();
        assert_eq!(last, Some(4_123_659_995));
    }

    #[test]
    fn draws_split_over_engines_and_continue_where_they_stopped() {
        // 200 numbers: 4 engines of 50; one draw of 50 from engine 0 alone
        // then gives engine 0's next numbers
        let engines = 8;
        let fresh = || {
            let keys: Vec<u32> = (0..engines as u32).flat_map(seeded).collect();
            (keys, vec![MT_N as i64; engines])
        };
        let (mut keys, mut pos) = fresh();
        let mut all = vec![0f32; 200];
        standard_normals(&mut keys, &mut pos, &mut all, f32::ln).unwrap();
        assert!(pos[..4].iter().all(|&p| p != MT_N as i64));
        assert_eq!(&pos[4..], &[MT_N as i64; 4]);
        let (mut keys2, mut pos2) = fresh();
        let mut first = vec![0f32; 50];
        standard_normals(&mut keys2, &mut pos2, &mut first, f32::ln).unwrap();
        assert_eq!(first, all[..50]);
        let mut next = vec![0f32; 50];
        standard_normals(&mut keys2, &mut pos2, &mut next, f32::ln).unwrap();
        assert_ne!(next, first);
        // engine 1's state after the second draw equals its state in the first
        // draw's position, and so on: the sequences are per engine
        assert!(all.iter().chain(&next).all(|v| v.is_finite()));
        let mean = all.iter().map(|&v| v as f64).sum::<f64>() / 200.0;
        assert!(mean.abs() < 0.3, "{mean}");
    }

    #[test]
    fn bad_states_are_refused_untouched() {
        let mut keys = seeded(1);
        let mut out = [0f64; 3];
        assert!(standard_normals(&mut keys, &mut [625], &mut out, f64::ln).is_err());
        assert!(standard_normals(&mut keys[..10], &mut [0], &mut out, f64::ln).is_err());
        assert_eq!(keys, seeded(1));
        assert_eq!(split(1, 1024), (1, 1));
        assert_eq!(split(65, 1024), (2, 33));
        assert_eq!(split(1 << 20, 1024), (1024, 1024));
    }
}
