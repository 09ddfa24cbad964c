//! MXNet 1.9.1's CPU random draws (uniform, normal, randint before their
//! parameters), for frontends that reproduce MXNet's `random.*` bit for bit
//! (mxkv's Python `mxkv.ndarray.random`, which keeps the engines' states and
//! applies the parameters; the C entry points are `MXKVMTSeed` and
//! `MXKVMTDraw`).
//!
//! MXNet's CPU parallel random resource holds 1024 `std::mt19937` engines.
//! A draw of `n` numbers is split into `nthread = min(ceil(n / 64), 1024)`
//! chunks of `step = ceil(n / nthread)` consecutive outputs; chunk `j` draws
//! with engine `j`, which keeps its state for the next draw. A uniform is
//! libstdc++'s `generate_canonical<FType>`, a randint word `(w1 << 31) + w2`
//! from two outputs, and a normal comes from a fresh libstdc++
//! `normal_distribution<FType>` (Marsaglia's
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

/// Sets engine `j` of `keys` (`MT_N` words each) to `std::mt19937(base + j)`
/// (seeds modulo 2^32, as MXNet's `uint32_t` arithmetic) and its position to
/// `MT_N` (a fresh engine twists before its first output). MXNet seeds
/// engine `j` of its resource copy `i` with `i * 16 + seed * 127 + j`.
pub fn seed_engines(keys: &mut [u32], positions: &mut [i64], base: u32) -> Result<()> {
    check_states(keys, positions)?;
    keys.par_chunks_mut(MT_N)
        .zip(positions.par_iter_mut())
        .enumerate()
        .for_each(|(j, (key, pos))| {
            let mut prev = base.wrapping_add(j as u32);
            key[0] = prev;
            for (i, word) in key.iter_mut().enumerate().skip(1) {
                prev = 1_812_433_253u32
                    .wrapping_mul(prev ^ (prev >> 30))
                    .wrapping_add(i as u32);
                *word = prev;
            }
            *pos = MT_N as i64;
        });
    Ok(())
}

/// Refuses key words and positions that are not engines' states.
fn check_states(keys: &[u32], positions: &[i64]) -> Result<()> {
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
    Ok(())
}

/// Fills `out` with MXNet's next `out.len()` numbers from the engines whose
/// key words are `keys` (`MT_N` per engine) and positions `positions` (one
/// per engine, `0..=MT_N`; MXNet's resource has 1024 engines), split over
/// them as MXNet's `LaunchRNG`, each number made by `one` from its chunk's
/// engine, and moves those engines on. Nothing changes when the arguments
/// are refused.
fn draw<T, F>(keys: &mut [u32], positions: &mut [i64], out: &mut [T], one: F) -> Result<()>
where
    T: Send,
    F: Fn(&mut Engine<'_>) -> T + Sync,
{
    check_states(keys, positions)?;
    if out.is_empty() {
        return Ok(());
    }
    if positions.is_empty() {
        return Err(Error::new("no engines to draw with"));
    }
    let (_, step) = split(out.len(), positions.len());
    out.par_chunks_mut(step)
        .zip(keys.par_chunks_mut(MT_N))
        .zip(positions.par_iter_mut())
        .for_each(|((chunk, key), pos)| {
            let mut engine = Engine {
                key,
                pos: *pos as usize,
            };
            for v in chunk.iter_mut() {
                *v = one(&mut engine);
            }
            *pos = engine.pos as i64;
        });
    Ok(())
}

/// MXNet's next standard normals (see [`draw`]): a fresh libstdc++
/// `normal_distribution<T>` per number, with `log` the logarithm MXNet calls
/// (the C library's).
pub fn standard_normals<T: Real>(
    keys: &mut [u32],
    positions: &mut [i64],
    out: &mut [T],
    log: fn(T) -> T,
) -> Result<()> {
    // An engine whose state is zero (word 0's top bit and words 1..624: the
    // 19937 bits of the state) gives only zeros, and a normal would be
    // drawn for ever; no seeding gives such a state.
    if !out.is_empty() {
        for (e, key) in keys.chunks(MT_N).enumerate() {
            if key[0] & 0x8000_0000 == 0 && key[1..].iter().all(|w| *w == 0) {
                return Err(Error::new(format!(
                    "engine {e}'s state is all zero (no seeding gives it): it gives only zeros, and a normal would never be drawn"
                )));
            }
        }
    }
    draw(keys, positions, out, |engine| loop {
        let x = T::centred(T::canonical(engine));
        let y = T::centred(T::canonical(engine));
        let r2 = T::radius2(x, y);
        if T::accepted(r2) {
            break T::polar(y, r2, log);
        }
    })
}

/// MXNet's next uniforms on `[0, 1)` before its parameters are applied (see
/// [`draw`]): libstdc++'s `generate_canonical<T>`, not clamped below 1 (as in
/// MXNet's build: a float32 draw can be 1.0).
pub fn canonicals<T: Real>(keys: &mut [u32], positions: &mut [i64], out: &mut [T]) -> Result<()> {
    draw(keys, positions, out, T::canonical)
}

/// MXNet's next `randint` words before the modulo (see [`draw`]): two
/// outputs `w1`, `w2` per number, `(w1 << 31) + w2` as a 64-bit integer.
pub fn randint_words(keys: &mut [u32], positions: &mut [i64], out: &mut [i64]) -> Result<()> {
    draw(keys, positions, out, |engine| {
        let w1 = engine.next_u32() as u64;
        let w2 = engine.next_u32() as u64;
        ((w1 << 31) + w2) as i64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zero state is refused for normals (they were drawn for ever) and
    /// gives zeros for uniforms, as the recurrence does; a state with one
    /// bit among its 19937 set is drawn from.
    #[test]
    fn a_zero_state_gives_no_normals() {
        let mut out = [0f32; 3];
        let mut keys = vec![0u32; 2 * MT_N];
        keys[MT_N] = 1; // engine 1: word 0's low bits are not state
        let mut pos = vec![MT_N as i64; 2];
        let e = standard_normals(&mut keys, &mut pos, &mut out, f32::ln).unwrap_err();
        assert!(e.message().contains("engine 0's state is all zero"), "{e}");
        assert_eq!(pos, vec![MT_N as i64; 2]);
        canonicals(&mut keys, &mut pos, &mut out).unwrap();
        assert_eq!(out, [0.0; 3]);
        let mut one = vec![0u32; MT_N];
        one[MT_N - 1] = 1;
        let mut p1 = vec![MT_N as i64];
        standard_normals(&mut one, &mut p1, &mut out[..1], f32::ln).unwrap();
        assert!(out[0].is_finite());
    }

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
        let mut positions = [0i64; 2];
        assert!(seed_engines(&mut keys, &mut positions, 3).is_err());
        assert_eq!(keys, seeded(1));
        assert_eq!(positions, [0, 0]);
    }

    #[test]
    fn seeding_gives_std_mt19937_of_base_plus_index() {
        let mut keys = vec![0u32; 3 * MT_N];
        let mut pos = vec![0i64; 3];
        seed_engines(&mut keys, &mut pos, u32::MAX - 1).unwrap();
        let want: Vec<u32> = [u32::MAX - 1, u32::MAX, 0]
            .into_iter()
            .flat_map(seeded)
            .collect();
        assert_eq!(keys, want);
        assert_eq!(pos, [MT_N as i64; 3]);
    }

    #[test]
    fn uniforms_and_randint_words_are_the_engines_outputs() {
        // 130 numbers over 3 engines of 44 (the last has 42); float32 uniforms
        // take one output each, float64 uniforms and randint words two
        let engines = 3;
        let outputs = |per: usize| -> Vec<Vec<u32>> {
            (0..engines as u32)
                .map(|j| {
                    let mut key = seeded(9 + j);
                    let mut e = Engine {
                        key: &mut key,
                        pos: MT_N,
                    };
                    (0..44 * per).map(|_| e.next_u32()).collect()
                })
                .collect()
        };
        let fresh = || {
            let mut keys = vec![0u32; engines * MT_N];
            let mut pos = vec![0i64; engines];
            seed_engines(&mut keys, &mut pos, 9).unwrap();
            (keys, pos)
        };
        let (one, two) = (outputs(1), outputs(2));
        let (mut keys, mut pos) = fresh();
        let mut f = vec![0f32; 130];
        canonicals(&mut keys, &mut pos, &mut f).unwrap();
        for (i, v) in f.iter().enumerate() {
            assert_eq!(*v, one[i / 44][i % 44] as f32 / 4_294_967_296.0);
        }
        assert_eq!(pos, [44, 44, 42]);
        let (mut keys, mut pos) = fresh();
        let mut d = vec![0f64; 130];
        canonicals(&mut keys, &mut pos, &mut d).unwrap();
        let (mut keys, mut pos) = fresh();
        let mut w = vec![0i64; 130];
        randint_words(&mut keys, &mut pos, &mut w).unwrap();
        for i in 0..130 {
            let (lo, hi) = (two[i / 44][2 * (i % 44)], two[i / 44][2 * (i % 44) + 1]);
            let want = (lo as f64 + hi as f64 * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
            assert_eq!(d[i], want);
            assert_eq!(w[i], (((lo as u64) << 31) + hi as u64) as i64);
        }
        assert_eq!(pos, [88, 88, 84]);
    }
}
