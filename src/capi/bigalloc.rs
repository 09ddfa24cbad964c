//! The allocator behind every `malloc`, `free` and `realloc` made from inside
//! `libmxkv.so`: ours, Rust's standard library's and libzmq's (the shared
//! library is linked with `--wrap=malloc,--wrap=free,--wrap=realloc`, with
//! `__wrap_malloc`, `__wrap_free` and `__wrap_realloc` defined there as
//! hidden aliases of [`mxkv_bigalloc_malloc`], [`mxkv_bigalloc_free`] and
//! [`mxkv_bigalloc_realloc`], and `-Bsymbolic-functions`, see build.rs, so
//! those calls come here and a
//! program defining functions of the same names does not take them over).
//! Nothing outside the library comes here: the process's own allocator and
//! its settings are left as they are.
//!
//! While a store exists, blocks of [`BIG`] bytes or more are mapped here
//! and, when freed, kept for the next request of about the same size (the
//! bookkeeping is [`crate::blockcache`], which says why), up to [`BUDGET`]
//! bytes; everything else goes to the process's allocator, found with
//! `dlsym` as the library's calls would have found it. When the last store
//! is freed, [`keep`]`(false)` gives the kept blocks back and later frees
//! unmap at once.
//!
//! Tools: LeakSanitizer does not scan these blocks, and a kept block hides a
//! use after free of it from ASan and valgrind.
//!
//! Only the shared library's own calls are redirected: a program that links
//! `libmxkv.a` statically keeps its `malloc` (and its own `--wrap=malloc`, if
//! it has one: the archive defines no `__wrap_*`), and these functions go
//! unused.

use crate::blockcache::{Block, BlockCache, ROUNDING};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests this large or larger are served by mapped blocks.
pub const BIG: usize = 4 << 20;
/// What the kept blocks may add up to.
pub const BUDGET: usize = 512 << 20;
/// Blocks mapped here at once (in use or kept); beyond, the process's
/// allocator serves.
const SLOTS: usize = 256;
/// Every block starts on a page, and pages are multiples of 4 KiB: an
/// address off this alignment is not ours.
const MIN_PAGE: usize = 4096;

static CACHE: BlockCache<SLOTS> = BlockCache::new(BUDGET);

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;

/// The process's `malloc`, `free` and `realloc`, and the page size; 0 until
/// looked up (all together, by the first call).
static REAL: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// The process's definitions of `malloc`, `free` and `realloc` (what an
/// unredirected call from this library binds to: the program's, a preloaded
/// allocator's, or the C library's), and the page size.
fn real() -> [usize; 4] {
    let got = REAL.each_ref().map(|a| a.load(Ordering::Acquire));
    if got[3] != 0 {
        return got;
    }
    let mut found = [0; 4];
    for (f, name) in found.iter_mut().zip([c"malloc", c"free", c"realloc"]) {
        // SAFETY: `name` is NUL-terminated and RTLD_DEFAULT is a valid pseudo
        // handle. dlsym's own allocations bind to the process's allocator,
        // never to this library's redirected calls, so this does not recurse.
        *f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    }
    // SAFETY: sysconf only reads a system value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    found[3] = usize::try_from(page).unwrap_or(MIN_PAGE).max(MIN_PAGE);
    if found.contains(&0) {
        // Only a process without a dynamic `malloc` could get here, and such
        // a process cannot have loaded this shared library.
        std::process::abort();
    }
    // The page size last: a thread that sees it sees the three functions.
    for (a, f) in REAL.iter().zip(found) {
        a.store(f, Ordering::Release);
    }
    found
}

fn real_malloc() -> MallocFn {
    // SAFETY: the address of the process's `malloc`, found by dlsym, which
    // has this signature.
    unsafe { std::mem::transmute::<usize, MallocFn>(real()[0]) }
}

fn real_free() -> FreeFn {
    // SAFETY: as in `real_malloc`, for `free`.
    unsafe { std::mem::transmute::<usize, FreeFn>(real()[1]) }
}

fn real_realloc() -> ReallocFn {
    // SAFETY: as in `real_malloc`, for `realloc`.
    unsafe { std::mem::transmute::<usize, ReallocFn>(real()[2]) }
}

/// A kept block of about `len` bytes, or a new mapping; None when the table
/// is full or the kernel refuses (the caller goes to the process's malloc).
fn big_block(len: usize) -> Option<*mut c_void> {
    let b = match CACHE.take(len, &mut unmap) {
        Some(b) => b,
        None => CACHE.insert_with(|| map_huge(len))?,
    };
    Some(b.addr as *mut c_void)
}

/// A new mapping of `len` bytes rounded up to whole pages, starting on a huge
/// page boundary, which the kernel is asked to back with huge pages: a value
/// copied in and out of it goes through 512 times fewer page-table entries
/// (the part past the last whole huge page gets small pages, so nothing is
/// resident beyond the request's last page).
fn map_huge(len: usize) -> Option<Block> {
    let page = real()[3];
    let cap = len.checked_add(page - 1)? / page * page;
    let span = cap.checked_add(ROUNDING)?;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let p = p as usize;
    // ROUNDING is a multiple of every page size, so the cut points are pages
    let addr = (p + ROUNDING - 1) & !(ROUNDING - 1);
    let (head, tail) = (addr - p, span - (addr - p) - cap);
    if head > 0 {
        unmap(Block { addr: p, cap: head });
    }
    if tail > 0 {
        unmap(Block {
            addr: addr + cap,
            cap: tail,
        });
    }
    // SAFETY: advice on the range just mapped, which nothing else uses yet;
    // a kernel without transparent huge pages refuses it, which is harmless.
    unsafe { libc::madvise(addr as *mut c_void, cap, libc::MADV_HUGEPAGE) };
    Some(Block { addr, cap })
}

fn unmap(b: Block) {
    // SAFETY: `b` is (part of) a mapping made by `map_huge` that nobody holds
    // any more (freed by its holder, never handed out, or trimmed off).
    unsafe { libc::munmap(b.addr as *mut c_void, b.cap) };
}

// The three functions below are the shared library's `__wrap_malloc`,
// `__wrap_free` and `__wrap_realloc`: build.rs defines those names as
// aliases of these at the cdylib's link only (`--defsym`), so the static
// library has no `__wrap_*` of its own (a program linking `libmxkv.a` with
// its own `--wrap=malloc` keeps its `__wrap_malloc`). They are hidden, and
// so are the aliases (rustc's version script makes every name it does not
// list local): the linker's `--wrap` binds the library's own calls to them
// inside it, and nothing outside sees them. Exported, a program or another
// library linked with `--wrap=malloc` could bind its calls to ours, or ours
// to its; rustc lists every `#[no_mangle]` function in its version script,
// which a second script cannot narrow, so `.hidden` does it (the linker
// keeps the strictest visibility of all mentions). tests/header.rs checks
// that the shared library exports only the header's functions,
// tests/python/test_bigalloc.py the static library.
#[cfg(target_os = "linux")]
std::arch::global_asm!(
    ".hidden mxkv_bigalloc_malloc",
    ".hidden mxkv_bigalloc_free",
    ".hidden mxkv_bigalloc_realloc"
);

/// `malloc` for the code linked into the shared library.
///
/// # Safety
/// As C's `malloc`.
#[no_mangle]
pub unsafe extern "C" fn mxkv_bigalloc_malloc(len: usize) -> *mut c_void {
    // with no store, nothing is kept: the process's malloc serves
    if len >= BIG && CACHE.keeping() {
        if let Some(p) = big_block(len) {
            return p;
        }
    }
    // SAFETY: the process's malloc, with the caller's argument.
    unsafe { real_malloc()(len) }
}

/// `free` for the code linked into the shared library.
///
/// # Safety
/// As C's `free`: `p` is NULL or came from this library's `malloc`/`realloc`
/// (or the process's, which is where ours send what is not theirs) and is
/// freed once.
#[no_mangle]
pub unsafe extern "C" fn mxkv_bigalloc_free(p: *mut c_void) {
    if p.is_null() || (p as usize % MIN_PAGE == 0 && CACHE.free(p as usize, &mut unmap)) {
        return;
    }
    // SAFETY: not one of our blocks, so it came from the process's malloc.
    unsafe { real_free()(p) }
}

/// `realloc` for the code linked into the shared library.
///
/// # Safety
/// As C's `realloc`, with `p` as for [`mxkv_bigalloc_free`].
#[no_mangle]
pub unsafe extern "C" fn mxkv_bigalloc_realloc(p: *mut c_void, len: usize) -> *mut c_void {
    let cap = if p.is_null() || p as usize % MIN_PAGE != 0 {
        None
    } else {
        CACHE.cap_of(p as usize)
    };
    let Some(cap) = cap else {
        // SAFETY: NULL or from the process's malloc, as the contract says.
        return unsafe { real_realloc()(p, len) };
    };
    if (BIG..=cap).contains(&len) {
        return p;
    }
    // SAFETY: as C's malloc.
    let q = unsafe { mxkv_bigalloc_malloc(len) };
    if q.is_null() {
        return q; // C's realloc: the old block stays valid
    }
    // SAFETY: `p` is our mapping of `cap` bytes and `q` a fresh allocation
    // of `len` bytes; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, cap.min(len)) };
    // SAFETY: `p` is ours and its holder gives it up here, as realloc does.
    unsafe { mxkv_bigalloc_free(p) };
    q
}

/// Whether freed big blocks are kept (on while a store exists); turning it
/// off also unmaps every kept block.
pub fn keep(on: bool) {
    CACHE.set_keeping(on);
    if !on {
        while let Some(b) = CACHE.evict_one() {
            unmap(b);
        }
    }
}

/// Bytes of kept blocks, and blocks mapped here (in use or kept).
pub fn stats() -> (usize, usize) {
    (CACHE.cached_bytes(), CACHE.recorded())
}

#[cfg(test)]
mod tests {
    use super::*;

    static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    // The functions are called directly here (the test binary is not linked
    // with `--wrap`); the shared library's link is checked in
    // tests/python/test_bigalloc.py.

    #[test]
    fn big_blocks_are_kept_and_reused_and_small_ones_go_to_malloc() {
        let _g = SERIAL.lock();
        keep(true);
        // SAFETY: (test) each pointer is used within its length and freed once.
        unsafe {
            let small = mxkv_bigalloc_malloc(100);
            assert!(!small.is_null());
            std::ptr::write_bytes(small as *mut u8, 7, 100);
            mxkv_bigalloc_free(small);

            let a = mxkv_bigalloc_malloc(BIG + 48);
            assert_eq!(a as usize % ROUNDING, 0, "on a huge page boundary");
            std::ptr::write_bytes(a as *mut u8, 1, BIG + 48);
            let (_, mapped) = stats();
            mxkv_bigalloc_free(a);
            assert!(stats().0 >= BIG + 48, "kept");
            let b = mxkv_bigalloc_malloc(BIG + 48);
            assert_eq!(b, a, "the kept block serves the same size again");
            assert_eq!(*(b as *const u8).add(BIG), 1, "and is the same memory");
            assert_eq!(stats(), (0, mapped));

            // growing past the block moves it, keeping the contents
            let c = mxkv_bigalloc_realloc(b, 2 * BIG);
            assert_ne!(c, b);
            assert_eq!(*(c as *const u8).add(BIG + 47), 1);
            // shrinking below BIG goes to malloc, keeping what fits
            let d = mxkv_bigalloc_realloc(c, 64);
            assert_eq!(*(d as *const u8).add(63), 1);
            mxkv_bigalloc_free(d);
            // growing a malloc block stays with malloc
            let e = mxkv_bigalloc_realloc(std::ptr::null_mut(), 10);
            let e = mxkv_bigalloc_realloc(e, 20);
            mxkv_bigalloc_free(e);
        }
        keep(false);
        assert_eq!(stats().0, 0);
    }

    #[test]
    fn the_budget_unmaps_what_it_cannot_keep() {
        let _g = SERIAL.lock();
        keep(true);
        let n = BUDGET / BIG + 2;
        // SAFETY: (test) the blocks are freed once, never touched.
        unsafe {
            let ps: Vec<_> = (0..n).map(|_| mxkv_bigalloc_malloc(BIG)).collect();
            let (_, mapped) = stats();
            for p in ps {
                mxkv_bigalloc_free(p);
            }
            assert!(stats().0 <= BUDGET);
            assert!(stats().1 < mapped, "some were unmapped");
            // with keeping off, what was kept goes, what is freed goes, and
            // big requests go to malloc
            let a = mxkv_bigalloc_malloc(BIG);
            keep(false);
            assert_eq!(stats(), (0, 1));
            mxkv_bigalloc_free(a);
            assert_eq!(stats(), (0, 0));
            let b = mxkv_bigalloc_malloc(BIG);
            assert_eq!(stats(), (0, 0));
            mxkv_bigalloc_free(b);
        }
        keep(false);
    }
}
