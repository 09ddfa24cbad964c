//! Elementwise kernels over raw buffers: dtype conversion and the two
//! summation orders of MXNet's communicators. Work is split over elements
//! (rayon) and never reorders the inputs of one element, so every result is
//! bit-identical to a serial run.

use super::dtype::{convert, DType, Elem};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU32, Ordering};

/// Elements handled per block: one pass over all inputs per block, with the
/// output block staying in cache.
const BLOCK: usize = 4096;
/// Below this many elements a kernel runs on the calling thread.
const PAR_MIN: usize = 1 << 16;
/// Elements per parallel task (a multiple of `BLOCK`).
const TASK: usize = 1 << 16;

/// The process whose threads rayon's global pool has: the first one that
/// asked [`parallel`] (0: none yet).
static POOL_PID: AtomicU32 = AtomicU32::new(0);

/// Whether work may be handed to rayon's global pool in this process. A child
/// made by `fork()` inherits the pool's bookkeeping but none of its threads
/// (only the forking thread is copied), so work handed to the pool there would
/// wait forever; in any process other than the one that set the pool up, this
/// answers `false` and the work runs on the calling thread (the results are the
/// same: every kernel gives bit-identical results serial or split), as
/// MXNet's forked workers (Gluon DataLoader's fork start method) go on
/// working. Every use of rayon in the library asks this first, so the process
/// that first asks is the one whose threads the pool has.
pub fn parallel() -> bool {
    let me = std::process::id();
    match POOL_PID.compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => true,
        Err(owner) => owner == me,
    }
}

/// Sizes rayon's pool from `MXNET_KVSTORE_REDUCTION_NTHREADS` when set (once,
/// before the pool is first used).
pub fn init_pool() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if !parallel() {
            // A forked child: the pool (if any) belongs to the parent.
            return;
        }
        let n = std::env::var("MXNET_KVSTORE_REDUCTION_NTHREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        if let Some(n) = n {
            // Fails only if the pool already exists; then its size stays.
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(n.max(1))
                .build_global();
        }
    });
}

/// How several values of one key are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumOrder {
    /// MXNet's `CommCPU`: `m = v0; m += (v1+v2+v3+v4); m += (v5+…)`.
    GroupsOfFour,
    /// MXNet's `CommDevice`: plain left to right.
    LeftToRight,
}

/// Converts `src` (elements of `sdt`) into `dst` (elements of `ddt`).
pub fn convert_bytes(sdt: DType, src: &[u8], ddt: DType, dst: &mut [u8]) {
    if sdt == ddt {
        copy_bytes(src, dst);
        return;
    }
    crate::with_dtype!(sdt, S => crate::with_dtype!(ddt, D => {
        let s: &[S] = bytemuck::cast_slice(src);
        let d: &mut [D] = bytemuck::cast_slice_mut(dst);
                if d.len() >= PAR_MIN && parallel() {
            d.par_chunks_mut(TASK)
                .zip(s.par_chunks(TASK))
                .for_each(|(d, s)| convert(s, d));
        } else {
            convert(s, d);
        }
    }))
}

/// Copies `src` (elements of `sdt`) into every output, converting to each
/// output's dtype. The source is read once: it is walked in blocks, and each
/// block is written to all outputs while it is in cache.
pub fn broadcast_bytes(sdt: DType, src: &[u8], outs: &mut [(DType, &mut [u8])]) {
    let n = src.len() / sdt.size();
    let par = split(src.len() * outs.len()) && parallel();
    const ELEMS: usize = 1 << 14;
    let blocks = n.div_ceil(ELEMS);
    // One task per block: the block of the source and of every output.
    type Task<'a> = (usize, Vec<(DType, &'a mut [u8])>);
    let mut tasks: Vec<Task<'_>> = (0..blocks)
        .map(|b| (b, Vec::with_capacity(outs.len())))
        .collect();
    for (dt, buf) in outs.iter_mut() {
        let dt = *dt;
        for (b, chunk) in buf.chunks_mut(ELEMS * dt.size()).enumerate() {
            tasks[b].1.push((dt, chunk));
        }
    }
    let run = |(b, outs): &mut Task<'_>| {
        let s = &src[*b * ELEMS * sdt.size()..((*b + 1) * ELEMS).min(n) * sdt.size()];
        for (dt, o) in outs.iter_mut() {
            if *dt == sdt {
                o.copy_from_slice(s);
            } else {
                convert_bytes(sdt, s, *dt, o);
            }
        }
    };
    if par {
        tasks.par_iter_mut().for_each(run);
    } else {
        tasks.iter_mut().for_each(run);
    }
}

/// Bytes per parallel task of a copy or fill.
const PAR_BYTES: usize = 1 << 20;

/// Whether work of `bytes` bytes is split over threads: from 4 MiB (below it
/// the hand-off to rayon and back costs more here than it saves; a broadcast
/// of 256 KB to 8 outputs took 43-144 us split, 43-57 us not).
fn split(bytes: usize) -> bool {
    bytes >= 4 << 20
}

/// `dst.copy_from_slice(src)`, in parallel for large buffers.
pub fn copy_bytes(src: &[u8], dst: &mut [u8]) {
    // Large copies: 1 MiB tasks, each copied in 64 KiB pieces (regular
    // stores, which this kind of machine streams faster than glibc's
    // non-temporal path for big blocks).
    const PIECE: usize = 1 << 16;
    let copy = |d: &mut [u8], s: &[u8]| {
        for (d, s) in d.chunks_mut(PIECE).zip(s.chunks(PIECE)) {
            d.copy_from_slice(s);
        }
    };
    if split(dst.len()) && parallel() {
        dst.par_chunks_mut(PAR_BYTES)
            .zip(src.par_chunks(PAR_BYTES))
            .for_each(|(d, s)| copy(d, s));
    } else {
        copy(dst, src);
    }
}

/// Zeroes `dst`, split over threads as copies are.
pub fn zero_bytes(dst: &mut [u8]) {
    if split(dst.len()) && parallel() {
        dst.par_chunks_mut(PAR_BYTES).for_each(|d| d.fill(0));
    } else {
        dst.fill(0);
    }
}

/// Elements per parallel task of a kernel touching `streams` arrays of
/// `size`-byte elements: about 1 MiB of traffic (rayon's hand-off costs tens
/// of µs here, so smaller pieces do not pay), at most `TASK`, whole blocks.
fn task_elems(streams: usize, size: usize) -> usize {
    ((1 << 20) / (streams * size).max(1)).clamp(BLOCK, TASK) / BLOCK * BLOCK
}

/// Sums `inputs` (all of element type `dtype`, same length as `out`) into
/// `out` in the given order. `inputs` must not be empty.
pub fn sum_bytes(dtype: DType, inputs: &[&[u8]], out: &mut [u8], order: SumOrder) {
    crate::with_dtype!(dtype, T => {
        let ins: Vec<&[T]> = inputs.iter().map(|b| bytemuck::cast_slice(b)).collect();
        sum::<T>(&ins, bytemuck::cast_slice_mut(out), order)
    })
}

/// Typed form of [`sum_bytes`].
pub fn sum<T: Elem>(inputs: &[&[T]], out: &mut [T], order: SumOrder) {
    assert!(!inputs.is_empty());
    let (streams, size) = (inputs.len() + 1, std::mem::size_of::<T>());
    let task = task_elems(streams, size);
    if out.len() > task && split(out.len().saturating_mul(streams * size)) && parallel() {
        out.par_chunks_mut(task)
            .enumerate()
            .for_each(|(i, o)| sum_range(inputs, i * task, o, order));
    } else {
        sum_range(inputs, 0, out, order);
    }
}

/// Sums `inputs` into `out` as [`sum`] does and copies the result into every
/// array of `copies` (each `out`'s length) in the same pass: each block is
/// summed, then written to the copies while it is still in cache. The
/// stored value and the outputs of a PushPull, without a second read.
pub fn sum_copy<T: Elem>(inputs: &[&[T]], out: &mut [T], copies: &mut [&mut [T]], order: SumOrder) {
    assert!(!inputs.is_empty());
    type Task<'a, T> = (usize, &'a mut [T], Vec<&'a mut [T]>);
    let (streams, size) = (inputs.len() + 1 + copies.len(), std::mem::size_of::<T>());
    let par = split(out.len().saturating_mul(streams * size)) && parallel();
    let chunk = task_elems(streams, size).min(out.len()).max(1);
    let mut tasks: Vec<Task<'_, T>> = out
        .chunks_mut(chunk)
        .enumerate()
        .map(|(i, o)| (i * chunk, o, Vec::with_capacity(copies.len())))
        .collect();
    for c in copies.iter_mut() {
        for (t, piece) in tasks.iter_mut().zip(c.chunks_mut(chunk)) {
            t.2.push(piece);
        }
    }
    let run = |(start, o, cs): &mut Task<'_, T>| {
        let mut block: Vec<&[T]> = Vec::with_capacity(inputs.len());
        for (i, ob) in o.chunks_mut(BLOCK).enumerate() {
            let s = *start + i * BLOCK;
            let e = s + ob.len();
            block.clear();
            block.extend(inputs.iter().map(|v| &v[s..e]));
            sum_block(&block, ob, order);
            for c in cs.iter_mut() {
                c[i * BLOCK..i * BLOCK + ob.len()].copy_from_slice(ob);
            }
        }
    };
    if tasks.len() > 1 && par {
        tasks.par_iter_mut().for_each(run);
    } else {
        tasks.iter_mut().for_each(run);
    }
}

/// [`sum_copy`] over raw buffers of element type `dtype`.
pub fn sum_copy_bytes(
    dtype: DType,
    inputs: &[&[u8]],
    out: &mut [u8],
    copies: &mut [&mut [u8]],
    order: SumOrder,
) {
    crate::with_dtype!(dtype, T => {
        let ins: Vec<&[T]> = inputs.iter().map(|b| bytemuck::cast_slice(b)).collect();
        let mut cs: Vec<&mut [T]> = copies.iter_mut().map(|b| bytemuck::cast_slice_mut(b)).collect();
        sum_copy::<T>(&ins, bytemuck::cast_slice_mut(out), &mut cs, order)
    })
}

/// Sums elements `start..start + out.len()` block by block.
fn sum_range<T: Elem>(inputs: &[&[T]], start: usize, out: &mut [T], order: SumOrder) {
    let mut block: Vec<&[T]> = Vec::with_capacity(inputs.len());
    for (i, o) in out.chunks_mut(BLOCK).enumerate() {
        let s = start + i * BLOCK;
        let e = s + o.len();
        block.clear();
        block.extend(inputs.iter().map(|v| &v[s..e]));
        sum_block(&block, o, order);
    }
}

fn sum_block<T: Elem>(v: &[&[T]], out: &mut [T], order: SumOrder) {
    out.copy_from_slice(v[0]);
    match order {
        SumOrder::LeftToRight => {
            for x in &v[1..] {
                for (o, &a) in out.iter_mut().zip(x.iter()) {
                    *o = o.add(a);
                }
            }
        }
        SumOrder::GroupsOfFour => {
            for g in v[1..].chunks(4) {
                match g {
                    [a] => {
                        for (o, &a) in out.iter_mut().zip(a.iter()) {
                            *o = o.add(a);
                        }
                    }
                    [a, b] => {
                        for ((o, &a), &b) in out.iter_mut().zip(a.iter()).zip(b.iter()) {
                            *o = o.add(a.add(b));
                        }
                    }
                    [a, b, c] => {
                        for (((o, &a), &b), &c) in
                            out.iter_mut().zip(a.iter()).zip(b.iter()).zip(c.iter())
                        {
                            *o = o.add(a.add(b).add(c));
                        }
                    }
                    [a, b, c, d] => {
                        for ((((o, &a), &b), &c), &d) in out
                            .iter_mut()
                            .zip(a.iter())
                            .zip(b.iter())
                            .zip(c.iter())
                            .zip(d.iter())
                        {
                            *o = o.add(a.add(b).add(c).add(d));
                        }
                    }
                    _ => unreachable!("chunks(4) yields 1 to 4 items"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn order_sensitive_float_sums() {
        let a = [1.0f32];
        let b = [1e8f32];
        let c = [-1e8f32];
        let mut out = [0f32];
        sum(&[&a, &b, &c], &mut out, SumOrder::GroupsOfFour);
        assert_eq!(out[0], 1.0); // 1 + (1e8 + -1e8)
        sum(&[&a, &b, &c], &mut out, SumOrder::LeftToRight);
        assert_eq!(out[0], 0.0); // (1 + 1e8) + -1e8
        let v = [[1e8f32], [1.0], [1.0], [-1e8], [1.0]];
        let ins: Vec<&[f32]> = v.iter().map(|x| &x[..]).collect();
        sum(&ins, &mut out, SumOrder::GroupsOfFour);
        assert_eq!(out[0], 0.0);
        sum(&ins, &mut out, SumOrder::LeftToRight);
        assert_eq!(out[0], 1.0);
    }

    #[test]
    fn parallel_sum_equals_serial() {
        let n = PAR_MIN * 3 + 17;
        assert!(split(n * 8 * 4), "the test must reach the parallel path");
        let ins: Vec<Vec<f32>> = (0..7)
            .map(|k| {
                (0..n)
                    .map(|i| ((i * 31 + k * 7) % 97) as f32 * 1.37e-3 + k as f32 * 1e5)
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = ins.iter().map(|v| &v[..]).collect();
        for order in [SumOrder::GroupsOfFour, SumOrder::LeftToRight] {
            let mut par = vec![0f32; n];
            sum(&refs, &mut par, order);
            let mut ser = vec![0f32; n];
            for (i, o) in ser.chunks_mut(n).enumerate() {
                let block: Vec<&[f32]> = refs.iter().map(|v| &v[i * n..i * n + n]).collect();
                sum_block(&block, o, order);
            }
            assert!(par
                .iter()
                .zip(&ser)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn sum_copy_equals_sum_then_copy() {
        assert!(
            split((PAR_MIN * 2 + 9) * (6 + 1 + 2) * 4),
            "the test must reach the parallel path"
        );
        for n in [0, 5, BLOCK + 3, PAR_MIN * 2 + 9] {
            let ins: Vec<Vec<f32>> = (0..6)
                .map(|k| {
                    (0..n)
                        .map(|i| ((i * 13 + k * 5) % 89) as f32 * 0.37 - 1e3 * k as f32)
                        .collect()
                })
                .collect();
            let refs: Vec<&[f32]> = ins.iter().map(|v| &v[..]).collect();
            for order in [SumOrder::GroupsOfFour, SumOrder::LeftToRight] {
                let mut want = vec![0f32; n];
                sum(&refs, &mut want, order);
                let mut out = vec![7f32; n];
                let (mut c1, mut c2) = (vec![9f32; n], vec![-9f32; n]);
                sum_copy(&refs, &mut out, &mut [&mut c1[..], &mut c2[..]], order);
                for got in [&out, &c1, &c2] {
                    assert!(got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
    }

    #[test]
    fn conversions() {
        let src: Vec<u8> = bytemuck::cast_slice(&[1.5f32, -2.5, 65520.0]).to_vec();
        let mut dst = vec![0u8; 6];
        convert_bytes(DType::F32, &src, DType::F16, &mut dst);
        let h: &[f16] = bytemuck::cast_slice(&dst);
        assert_eq!(h[0].to_f32(), 1.5);
        assert!(h[2].is_infinite());
        let mut ints = vec![0u8; 12];
        convert_bytes(DType::F32, &src, DType::I32, &mut ints);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&ints), &[1, -2, 65520]);
    }
}
