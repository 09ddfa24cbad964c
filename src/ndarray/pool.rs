//! A process-wide cache of freed large mappings, reused by later arrays of the
//! same mapped length (MXNet's CPU storage keeps freed buffers the same way, in
//! its default "Naive" pool).
//!
//! Memory a process gets back from the kernel is faulted in page by page on
//! first touch, and on a VM whose balloon reports freed memory to the host
//! each such fault can cost a host fault too: an init of a 64 MB key took
//! 80–100 ms that way on the reference machine, against ~8 ms into memory
//! already touched. The pool holds at most `MXKV_CPU_MEM_POOL_MB` MiB (read
//! once; default 1024, 0 disables it); beyond that freed mappings are unmapped.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::LazyLock;

struct Pool {
    /// Free mappings by length.
    free: HashMap<usize, Vec<memmap2::MmapMut>>,
    bytes: usize,
}

static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(|| {
    Mutex::new(Pool {
        free: HashMap::new(),
        bytes: 0,
    })
});

static LIMIT: LazyLock<usize> =
    LazyLock::new(|| limit_from(std::env::var("MXKV_CPU_MEM_POOL_MB").ok()));

const DEFAULT_MB: usize = 1024;

fn limit_from(v: Option<String>) -> usize {
    v.and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_MB)
        .saturating_mul(1 << 20)
}

/// A free mapping of exactly `len` bytes, if the pool holds one. Its contents
/// are whatever its last array left there.
pub(super) fn take(len: usize) -> Option<memmap2::MmapMut> {
    let mut p = POOL.lock();
    let map = p.free.get_mut(&len)?.pop()?;
    p.bytes -= len;
    Some(map)
}

/// Keeps `map` for reuse while the pool has room; unmaps it otherwise.
pub(super) fn give(map: memmap2::MmapMut) {
    let len = map.len();
    let mut p = POOL.lock();
    if p.bytes + len <= *LIMIT {
        p.bytes += len;
        p.free.entry(len).or_default().push(map);
    }
    // Otherwise `map` is unmapped on return, after the guard is released.
}

/// Bytes the pool holds, or None when its limit is too small for the tests
/// to rely on it keeping what they free.
#[cfg(test)]
pub(super) fn held() -> Option<usize> {
    (*LIMIT >= 256 << 20).then(|| POOL.lock().bytes)
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
