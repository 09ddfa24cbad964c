//! The bookkeeping of the library's cache of big memory blocks: which blocks
//! the library mapped itself, which of them are in use, and which are kept
//! for the next allocation of about the same size. The allocator around it
//! (mapping, unmapping, and the `malloc`/`free`/`realloc` the library's code
//! calls) is `capi::bigalloc`; here addresses are plain numbers.
//!
//! Why the library keeps big blocks: libzmq receives every message into
//! memory it allocates with `malloc`, and glibc maps every block over 32 MiB
//! afresh and unmaps it on `free`, so the kernel zero-fills each received
//! value again, page by page (about 5 ms for 64 MB here). With the blocks
//! kept, a pull of a big value lands in memory that is already there.
//!
//! This code runs inside `malloc` and `free`, so it never allocates and never
//! blocks: every slot is a small state machine moved with atomic
//! compare-and-swap, and only the thread that holds a block moves its slot out
//! of "in use".

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Nothing recorded.
const EMPTY: u8 = 0;
/// Being filled in or emptied by one thread.
const BUSY: u8 = 1;
/// Handed out: only its holder moves it on (by freeing it).
const USED: u8 = 2;
/// Freed, kept for reuse: whoever wins the swap to `USED` gets it.
const CACHED: u8 = 3;

/// One block the library mapped: its address and mapped length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub addr: usize,
    pub cap: usize,
}

/// What `free` has to do with an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freed {
    /// Not a block of the cache: the process's `free` takes it.
    NotOurs,
    /// Kept for reuse.
    Kept,
    /// Ours, but over the budget: the caller unmaps it.
    Unmap(Block),
}

struct Slot {
    state: AtomicU8,
    addr: AtomicUsize,
    cap: AtomicUsize,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU8::new(EMPTY),
            addr: AtomicUsize::new(0),
            cap: AtomicUsize::new(0),
        }
    }
}

/// Up to `N` blocks, of which those freed are kept while their lengths add up
/// to at most the budget.
pub struct BlockCache<const N: usize> {
    slots: [Slot; N],
    /// Slots not `EMPTY`: `free` of an address skips the scan when 0.
    recorded: AtomicUsize,
    cached_bytes: AtomicUsize,
    budget: usize,
}

/// The huge page: mappings start on its boundary, and a kept block may be
/// this much (plus a quarter) larger than a request it serves.
pub const ROUNDING: usize = 2 << 20;

/// Whether a kept block of `cap` bytes should serve a request of `len`: large
/// enough, and not more than a quarter (plus [`ROUNDING`]) larger; a much
/// larger block stays for a request of its own size.
pub fn fits(cap: usize, len: usize) -> bool {
    cap >= len && cap - len <= len / 4 + ROUNDING
}

impl<const N: usize> BlockCache<N> {
    pub const fn new(budget: usize) -> Self {
        BlockCache {
            slots: [const { Slot::new() }; N],
            recorded: AtomicUsize::new(0),
            cached_bytes: AtomicUsize::new(0),
            budget,
        }
    }

    /// A kept block that [`fits`] `len` bytes (the smallest such), now in use.
    pub fn take(&self, len: usize) -> Option<Block> {
        // Each failed swap means another thread took or moved a block: a
        // bounded number of retries, then the caller maps a new one.
        for _ in 0..4 {
            let mut best: Option<(usize, usize)> = None;
            for (i, s) in self.slots.iter().enumerate() {
                if s.state.load(Ordering::Acquire) == CACHED {
                    let cap = s.cap.load(Ordering::Relaxed);
                    if fits(cap, len) && best.map_or(true, |(_, c)| cap < c) {
                        best = Some((i, cap));
                    }
                }
            }
            let (i, _) = best?;
            let s = &self.slots[i];
            if s.state
                .compare_exchange(CACHED, USED, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // Ours now: read what the slot holds (it may have been reused
            // between the scan and the swap).
            let cap = s.cap.load(Ordering::Relaxed);
            self.cached_bytes.fetch_sub(cap, Ordering::AcqRel);
            if fits(cap, len) {
                return Some(Block {
                    addr: s.addr.load(Ordering::Relaxed),
                    cap,
                });
            }
            self.keep_or_unmap(s);
        }
        None
    }

    /// Records a block just mapped, as in use. False when every slot is taken
    /// (the caller unmaps it and allocates elsewhere).
    pub fn insert(&self, block: Block) -> bool {
        for s in &self.slots {
            if s.state
                .compare_exchange(EMPTY, BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                s.addr.store(block.addr, Ordering::Relaxed);
                s.cap.store(block.cap, Ordering::Relaxed);
                self.recorded.fetch_add(1, Ordering::AcqRel);
                s.state.store(USED, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// The slot of the block in use at `addr`. Only its holder asks, so the
    /// slot cannot change under it.
    fn used_slot(&self, addr: usize) -> Option<&Slot> {
        if self.recorded.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.slots.iter().find(|s| {
            s.state.load(Ordering::Acquire) == USED && s.addr.load(Ordering::Relaxed) == addr
        })
    }

    /// The mapped length of the block in use at `addr`, if it is one of ours.
    pub fn cap_of(&self, addr: usize) -> Option<usize> {
        self.used_slot(addr).map(|s| s.cap.load(Ordering::Relaxed))
    }

    /// `free(addr)`: keeps one of our blocks while the budget allows.
    pub fn free(&self, addr: usize) -> Freed {
        match self.used_slot(addr) {
            None => Freed::NotOurs,
            Some(s) => match self.keep_or_unmap(s) {
                None => Freed::Kept,
                Some(b) => Freed::Unmap(b),
            },
        }
    }

    /// Moves a slot its caller holds (`USED`) to `CACHED` if the budget has
    /// room, else empties it and returns the block to unmap.
    fn keep_or_unmap(&self, s: &Slot) -> Option<Block> {
        let cap = s.cap.load(Ordering::Relaxed);
        let room = self
            .cached_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c + cap <= self.budget).then_some(c + cap)
            })
            .is_ok();
        if room {
            s.state.store(CACHED, Ordering::Release);
            return None;
        }
        let block = Block {
            addr: s.addr.load(Ordering::Relaxed),
            cap,
        };
        self.recorded.fetch_sub(1, Ordering::AcqRel);
        s.state.store(EMPTY, Ordering::Release);
        Some(block)
    }

    /// Takes one kept block out of the cache for the caller to unmap (None
    /// when none is kept).
    pub fn evict_one(&self) -> Option<Block> {
        for s in &self.slots {
            if s.state
                .compare_exchange(CACHED, BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                let block = Block {
                    addr: s.addr.load(Ordering::Relaxed),
                    cap: s.cap.load(Ordering::Relaxed),
                };
                self.cached_bytes.fetch_sub(block.cap, Ordering::AcqRel);
                self.recorded.fetch_sub(1, Ordering::AcqRel);
                s.state.store(EMPTY, Ordering::Release);
                return Some(block);
            }
        }
        None
    }

    /// Bytes kept for reuse now.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Acquire)
    }

    /// Blocks recorded now (in use or kept).
    pub fn recorded(&self) -> usize {
        self.recorded.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const MB: usize = 1 << 20;

    fn block(addr: usize, cap: usize) -> Block {
        Block { addr, cap }
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_about_its_size() {
        let c = BlockCache::<4>::new(100 * MB);
        assert_eq!(c.take(64 * MB), None);
        assert!(c.insert(block(0x1000, 64 * MB + 4096)));
        assert_eq!(c.cap_of(0x1000), Some(64 * MB + 4096));
        assert_eq!(c.free(0x1000), Freed::Kept);
        assert_eq!(c.cached_bytes(), 64 * MB + 4096);
        assert_eq!(c.cap_of(0x1000), None, "a kept block is not in use");
        // too small for it, and much smaller than it: neither takes it
        assert_eq!(c.take(65 * MB), None);
        assert_eq!(c.take(48 * MB), None);
        assert_eq!(c.take(64 * MB + 48), Some(block(0x1000, 64 * MB + 4096)));
        assert_eq!(c.cached_bytes(), 0);
        assert_eq!(c.take(64 * MB), None, "handed out once");
    }

    #[test]
    fn addresses_that_are_not_ours_go_to_the_process() {
        let c = BlockCache::<4>::new(100 * MB);
        assert_eq!(c.free(0x1000), Freed::NotOurs);
        assert!(c.insert(block(0x1000, 8 * MB)));
        assert_eq!(c.free(0x2000), Freed::NotOurs);
        assert_eq!(c.free(0x1000), Freed::Kept);
        assert_eq!(
            c.free(0x1000),
            Freed::NotOurs,
            "a kept block is not freed twice"
        );
    }

    #[test]
    fn the_budget_bounds_what_is_kept_and_the_smallest_fitting_block_is_taken() {
        let c = BlockCache::<8>::new(20 * MB);
        for (i, cap) in [8 * MB, 10 * MB, 9 * MB].into_iter().enumerate() {
            assert!(c.insert(block(0x1000 * (i + 1), cap)));
        }
        assert_eq!(c.free(0x1000), Freed::Kept);
        assert_eq!(c.free(0x2000), Freed::Kept);
        assert_eq!(c.free(0x3000), Freed::Unmap(block(0x3000, 9 * MB)));
        assert_eq!(c.recorded(), 2);
        assert_eq!(c.take(8 * MB), Some(block(0x1000, 8 * MB)));
        assert_eq!(c.take(8 * MB), Some(block(0x2000, 10 * MB)));
        assert_eq!(c.evict_one(), None);
        assert_eq!(c.free(0x2000), Freed::Kept);
        assert_eq!(c.evict_one(), Some(block(0x2000, 10 * MB)));
        assert_eq!((c.cached_bytes(), c.recorded()), (0, 1));
    }

    #[test]
    fn a_full_table_refuses_new_blocks() {
        let c = BlockCache::<2>::new(100 * MB);
        assert!(c.insert(block(0x1000, MB)));
        assert!(c.insert(block(0x2000, MB)));
        assert!(!c.insert(block(0x3000, MB)));
        assert_eq!(c.free(0x1000), Freed::Kept);
        assert!(!c.insert(block(0x3000, MB)), "a kept block holds its slot");
        assert_eq!(c.evict_one(), Some(block(0x1000, MB)));
        assert!(c.insert(block(0x3000, MB)));
    }

    #[test]
    fn threads_never_get_the_same_block_twice() {
        let c = BlockCache::<16>::new(usize::MAX);
        for i in 0..16 {
            assert!(c.insert(block(0x1000 * (i + 1), MB)));
            assert_eq!(c.free(0x1000 * (i + 1)), Freed::Kept);
        }
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        let mut held = Vec::new();
                        for round in 0..2000 {
                            if let Some(b) = c.take(MB) {
                                held.push(b.addr);
                            }
                            if round % 3 == 0 {
                                if let Some(a) = held.pop() {
                                    assert_eq!(c.free(a), Freed::Kept);
                                }
                            }
                        }
                        held
                    })
                })
                .collect();
            let mut all = HashSet::new();
            for h in hs {
                for a in h.join().unwrap() {
                    assert!(all.insert(a), "block {a:#x} held by two threads");
                }
            }
            assert_eq!(c.cached_bytes(), (16 - all.len()) * MB);
        });
    }
}
