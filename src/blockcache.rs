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

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

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
/// to at most the budget (and while keeping is on).
pub struct BlockCache<const N: usize> {
    slots: [Slot; N],
    /// Slots not `EMPTY`: `free` of an address skips the scan when 0.
    recorded: AtomicUsize,
    cached_bytes: AtomicUsize,
    budget: usize,
    /// Off: freed blocks are unmapped at once.
    keeping: AtomicBool,
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
    /// An empty cache, keeping off.
    pub const fn new(budget: usize) -> Self {
        BlockCache {
            slots: [const { Slot::new() }; N],
            recorded: AtomicUsize::new(0),
            cached_bytes: AtomicUsize::new(0),
            budget,
            keeping: AtomicBool::new(false),
        }
    }

    /// Whether freed blocks are kept from now on (blocks kept already stay
    /// until taken or evicted).
    pub fn set_keeping(&self, on: bool) {
        self.keeping.store(on, Ordering::Release);
    }

    pub fn keeping(&self) -> bool {
        self.keeping.load(Ordering::Acquire)
    }

    /// A kept block that [`fits`] `len` bytes (the smallest such), now in
    /// use. A block this gives up on its way goes to `unmap`.
    pub fn take(&self, len: usize, unmap: &mut dyn FnMut(Block)) -> Option<Block> {
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
            self.give_back(s, unmap);
        }
        None
    }

    /// Records a new block, in use: claims a free slot first, then calls
    /// `map` for the block. None (and `map` not called) when every slot is
    /// taken, or when `map` fails.
    pub fn insert_with(&self, map: impl FnOnce() -> Option<Block>) -> Option<Block> {
        let s = self.slots.iter().find(|s| {
            s.state
                .compare_exchange(EMPTY, BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        let Some(block) = map() else {
            s.state.store(EMPTY, Ordering::Release);
            return None;
        };
        s.addr.store(block.addr, Ordering::Relaxed);
        s.cap.store(block.cap, Ordering::Relaxed);
        self.recorded.fetch_add(1, Ordering::AcqRel);
        s.state.store(USED, Ordering::Release);
        Some(block)
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

    /// `free(addr)`: false when `addr` is not one of our blocks in use.
    /// Otherwise the block is kept, or goes to `unmap`, as [`Self::give_back`]
    /// decides.
    pub fn free(&self, addr: usize, unmap: &mut dyn FnMut(Block)) -> bool {
        match self.used_slot(addr) {
            None => false,
            Some(s) => {
                self.give_back(s, unmap);
                true
            }
        }
    }

    /// Gives back a block its caller holds (slot `USED`): kept when keeping
    /// is on and it fits the budget, older kept blocks going to `unmap` to
    /// make room (the block just freed is the likelier to be asked for
    /// again); else the slot is emptied and the block goes to `unmap`.
    fn give_back(&self, s: &Slot, unmap: &mut dyn FnMut(Block)) {
        let cap = s.cap.load(Ordering::Relaxed);
        if self.keeping.load(Ordering::Acquire) && cap <= self.budget {
            loop {
                let room = self
                    .cached_bytes
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                        (c + cap <= self.budget).then_some(c + cap)
                    })
                    .is_ok();
                if room {
                    s.state.store(CACHED, Ordering::Release);
                    return;
                }
                match self.evict_one() {
                    Some(old) => unmap(old),
                    None => break,
                }
            }
        }
        let block = Block {
            addr: s.addr.load(Ordering::Relaxed),
            cap,
        };
        self.recorded.fetch_sub(1, Ordering::AcqRel);
        s.state.store(EMPTY, Ordering::Release);
        unmap(block);
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

    fn cache<const N: usize>(budget: usize) -> BlockCache<N> {
        let c = BlockCache::new(budget);
        c.set_keeping(true);
        c
    }

    fn add<const N: usize>(c: &BlockCache<N>, addr: usize, cap: usize) -> bool {
        c.insert_with(|| Some(block(addr, cap))).is_some()
    }

    /// `free`, collecting what it unmaps.
    fn free<const N: usize>(c: &BlockCache<N>, addr: usize) -> (bool, Vec<Block>) {
        let mut gone = Vec::new();
        let ours = c.free(addr, &mut |b| gone.push(b));
        (ours, gone)
    }

    fn take<const N: usize>(c: &BlockCache<N>, len: usize) -> Option<Block> {
        c.take(len, &mut |b| panic!("unmapped {b:?}"))
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_about_its_size() {
        let c = cache::<4>(100 * MB);
        assert_eq!(take(&c, 64 * MB), None);
        assert!(add(&c, 0x1000, 64 * MB + 4096));
        assert_eq!(c.cap_of(0x1000), Some(64 * MB + 4096));
        assert_eq!(free(&c, 0x1000), (true, vec![]));
        assert_eq!(c.cached_bytes(), 64 * MB + 4096);
        assert_eq!(c.cap_of(0x1000), None, "a kept block is not in use");
        // too small for it, and much smaller than it: neither takes it
        assert_eq!(take(&c, 65 * MB), None);
        assert_eq!(take(&c, 48 * MB), None);
        assert_eq!(take(&c, 64 * MB + 48), Some(block(0x1000, 64 * MB + 4096)));
        assert_eq!(c.cached_bytes(), 0);
        assert_eq!(take(&c, 64 * MB), None, "handed out once");
    }

    #[test]
    fn addresses_that_are_not_ours_go_to_the_process() {
        let c = cache::<4>(100 * MB);
        assert_eq!(free(&c, 0x1000), (false, vec![]));
        assert!(add(&c, 0x1000, 8 * MB));
        assert_eq!(free(&c, 0x2000), (false, vec![]));
        assert_eq!(free(&c, 0x1000), (true, vec![]));
        assert_eq!(
            free(&c, 0x1000),
            (false, vec![]),
            "a kept block is not freed twice"
        );
    }

    #[test]
    fn older_kept_blocks_make_room_for_the_one_just_freed() {
        let c = cache::<8>(20 * MB);
        for (i, cap) in [8 * MB, 10 * MB, 9 * MB].into_iter().enumerate() {
            assert!(add(&c, 0x1000 * (i + 1), cap));
        }
        assert_eq!(free(&c, 0x1000), (true, vec![]));
        assert_eq!(free(&c, 0x2000), (true, vec![]));
        // 8 + 10 + 9 > 20: the first kept block goes
        assert_eq!(free(&c, 0x3000), (true, vec![block(0x1000, 8 * MB)]));
        assert_eq!((c.cached_bytes(), c.recorded()), (19 * MB, 2));
        assert_eq!(take(&c, 9 * MB), Some(block(0x3000, 9 * MB)));
        assert_eq!(take(&c, 8 * MB), Some(block(0x2000, 10 * MB)));
        assert_eq!(c.evict_one(), None);
        // a block larger than the whole budget is never kept
        assert!(add(&c, 0x4000, 21 * MB));
        assert_eq!(free(&c, 0x4000), (true, vec![block(0x4000, 21 * MB)]));
        assert_eq!(free(&c, 0x2000), (true, vec![]));
        assert_eq!(c.evict_one(), Some(block(0x2000, 10 * MB)));
        assert_eq!((c.cached_bytes(), c.recorded()), (0, 1));
    }

    #[test]
    fn with_keeping_off_freed_blocks_are_unmapped_at_once() {
        let c = cache::<4>(100 * MB);
        assert!(add(&c, 0x1000, 8 * MB));
        assert!(add(&c, 0x2000, 8 * MB));
        assert_eq!(free(&c, 0x1000), (true, vec![]));
        c.set_keeping(false);
        assert_eq!(free(&c, 0x2000), (true, vec![block(0x2000, 8 * MB)]));
        assert_eq!(
            take(&c, 8 * MB),
            Some(block(0x1000, 8 * MB)),
            "kept before stays"
        );
        assert_eq!(free(&c, 0x1000), (true, vec![block(0x1000, 8 * MB)]));
        assert_eq!(c.recorded(), 0);
    }

    #[test]
    fn a_full_table_refuses_new_blocks_without_mapping_them() {
        let c = cache::<2>(100 * MB);
        assert!(add(&c, 0x1000, MB));
        assert!(add(&c, 0x2000, MB));
        let mut mapped = false;
        assert_eq!(
            c.insert_with(|| {
                mapped = true;
                Some(block(0x3000, MB))
            }),
            None
        );
        assert!(!mapped, "no slot: nothing is mapped");
        assert_eq!(free(&c, 0x1000), (true, vec![]));
        assert!(!add(&c, 0x3000, MB), "a kept block holds its slot");
        assert_eq!(c.evict_one(), Some(block(0x1000, MB)));
        // a failed mapping gives its slot back
        assert_eq!(c.insert_with(|| None), None);
        assert!(add(&c, 0x3000, MB));
    }

    #[test]
    fn threads_never_get_the_same_block_twice_and_nothing_is_lost() {
        let c = cache::<16>(8 * MB);
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let c = &c;
                    sc.spawn(move || {
                        let (mut held, mut mapped, mut unmapped) = (Vec::new(), 0, 0);
                        for round in 0..4000usize {
                            let len = if (round + t) % 2 == 0 { MB } else { 2 * MB };
                            let mut unmap = |_: Block| unmapped += 1;
                            if let Some(b) = c.take(len, &mut unmap) {
                                held.push(b.addr);
                            } else if let Some(b) = c.insert_with(|| {
                                Some(block(0x1_0000_0000 * (t + 1) + round * 0x1000, len))
                            }) {
                                mapped += 1;
                                held.push(b.addr);
                            }
                            if round % 2 == 0 {
                                if let Some(a) = held.pop() {
                                    assert!(c.free(a, &mut unmap));
                                }
                            }
                        }
                        (held, mapped, unmapped)
                    })
                })
                .collect();
            let (mut all, mut mapped, mut unmapped) = (HashSet::new(), 0, 0);
            for h in hs {
                let (held, m, u) = h.join().unwrap();
                (mapped, unmapped) = (mapped + m, unmapped + u);
                for a in held {
                    assert!(all.insert(a), "block {a:#x} held by two threads");
                }
            }
            let mut kept = 0;
            while c.evict_one().is_some() {
                kept += 1;
            }
            assert_eq!(
                mapped,
                unmapped + kept + all.len(),
                "every block accounted for"
            );
            assert_eq!(c.recorded(), all.len());
        });
    }
}
