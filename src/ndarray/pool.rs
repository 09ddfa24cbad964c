//! A process-wide cache of freed mappings (buffers of 1 MiB and more), reused
//! by later arrays of the same or a slightly shorter mapped length (MXNet's
//! CPU storage keeps freed buffers the same way, in its default "Naive" pool).
//!
//! Memory a process gets back from the kernel is faulted in page by page on
//! first touch, and on a VM whose balloon reports freed memory to the host
//! each such fault can cost a host fault too: an init of a 64 MB key took
//! 80–100 ms that way on the reference machine, against ~8 ms into memory
//! already touched. The pool holds at most `MXKV_CPU_MEM_POOL_MB` MiB (read
//! once; default 1024, 0 disables it); beyond that freed mappings are unmapped.
//!
//! `fork()` while another thread holds the pool's lock would leave it held
//! forever in the child: the C API's `pthread_atfork` handlers hold it across
//! a fork ([`hold_for_fork`]). It is a std lock, whose guard the child may
//! drop (see src/registry.rs), in a plain static (no lazy initialisation a
//! fork could interrupt either); nothing else is locked while it is held.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) struct Pool {
    /// Free mappings by length.
    free: BTreeMap<usize, Vec<memmap2::MmapMut>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    free: BTreeMap::new(),
    bytes: 0,
});

fn lock() -> MutexGuard<'static, Pool> {
    // (nothing panics while the lock is held: a poisoned lock is as good)
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The pool's lock, held: see [`hold_for_fork`].
pub struct ForkHold {
    _held: MutexGuard<'static, Pool>,
}

/// Waits until no other thread is inside the pool and keeps every other
/// thread out until the hold is dropped (around a `fork()`: the child may
/// drop it too).
pub fn hold_for_fork() -> ForkHold {
    ForkHold { _held: lock() }
}

/// The limit in bytes, read from the environment by the first call that
/// needs it (outside the pool's lock; threads that race read the same value).
static LIMIT: AtomicUsize = AtomicUsize::new(UNSET);
const UNSET: usize = usize::MAX;

fn limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        UNSET => {
            let l = limit_from(std::env::var("MXKV_CPU_MEM_POOL_MB").ok());
            LIMIT.store(l, Ordering::Relaxed);
            l
        }
        l => l,
    }
}

const DEFAULT_MB: usize = 1024;

fn limit_from(v: Option<String>) -> usize {
    v.and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_MB)
        .saturating_mul(1 << 20)
        .min(UNSET - 1)
}

/// The shortest free mapping of `len` to `longest` bytes, if the pool holds
/// one. Its contents are whatever its last array left there.
pub(super) fn take(len: usize, longest: usize) -> Option<memmap2::MmapMut> {
    let mut p = lock();
    // (no length is kept with an empty list)
    let (&found, maps) = p.free.range_mut(len..=longest).next()?;
    let map = maps.pop()?;
    if maps.is_empty() {
        p.free.remove(&found);
    }
    p.bytes -= found;
    Some(map)
}

/// Keeps `map` for reuse while the pool has room; unmaps it otherwise.
pub(super) fn give(map: memmap2::MmapMut) {
    let len = map.len();
    let limit = limit();
    let mut p = lock();
    if p.bytes + len <= limit {
        p.bytes += len;
        p.free.entry(len).or_default().push(map);
    }
    // Otherwise `map` is unmapped on return, after the guard is released.
}

/// Bytes the pool holds, or None when its limit is too small for the tests
/// to rely on it keeping what they free.
#[cfg(test)]
pub(super) fn held() -> Option<usize> {
    (limit() >= 256 << 20).then(|| lock().bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_parses_mib_and_defaults() {
        assert_eq!(limit_from(None), DEFAULT_MB << 20);
        assert_eq!(limit_from(Some(" 0 ".into())), 0);
        assert_eq!(limit_from(Some("3".into())), 3 << 20);
        assert_eq!(limit_from(Some("lots".into())), DEFAULT_MB << 20);
    }
}
