//! The panic and error boundary: `api_call` runs an entry point's body,
//! catches panics, stores the error text per thread and returns 0 or -1.
//!
//! Per-thread buffers (the error text here, the shape and load buffers in
//! `ndarray.rs`) live in thread-locals, which Rust destroys when the thread
//! exits (and, for the main thread, at `exit()`). C and C++ code may still
//! call the library after that, from a `thread_local` or static object's
//! destructor: `per_thread` then keeps the thread's buffer in a process-wide
//! table keyed by the thread id instead, one buffer per thread, replaced by
//! the thread's next call (as the thread-local would be). Those tables'
//! locks are held across `fork()` as the other process-wide locks are (see
//! [`install_fork_handlers`]).

use super::args::{KvHandle, KVSTORES, NDARRAYS};
use crate::error::Error;
use crate::registry::ForkHold;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::os::raw::c_void;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::LocalKey;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A thread's buffer once its thread-locals are gone, by thread id.
///
/// A thread calling the library from a destructor (at its exit, or at
/// `exit()`) holds the table's lock for a moment; a `fork()` meanwhile left
/// it held forever in the child, whose own such calls then waited forever
/// (ctests/test_fork_orphans.c). Each table's lock is therefore held across
/// `fork()` by the `pthread_atfork` handlers ([`hold_orphans_for_fork`]),
/// taken before the other locks there (a load's table is held while its
/// handles go into the array registry). A std lock, whose guard the child
/// may drop (see src/registry.rs).
pub(crate) type Orphans<T> = Mutex<BTreeMap<libc::pid_t, T>>;

/// A table of [`Orphans`], held: see [`hold_orphans_for_fork`].
pub(crate) type OrphansHold<T> = MutexGuard<'static, BTreeMap<libc::pid_t, T>>;

/// Waits until no other thread uses `orphans` and keeps every other thread
/// out until the hold is dropped (around a `fork()`: the child may drop it).
pub(crate) fn hold_orphans_for_fork<T>(orphans: &'static Orphans<T>) -> OrphansHold<T> {
    lock_orphans(orphans)
}

fn lock_orphans<T>(orphans: &Orphans<T>) -> MutexGuard<'_, BTreeMap<libc::pid_t, T>> {
    // (a buffer left half-written by a panic is replaced by the next call)
    orphans.lock().unwrap_or_else(PoisonError::into_inner)
}

static LAST_ERROR_ORPHANS: Orphans<CString> = Mutex::new(BTreeMap::new());

/// Runs `f` on this thread's buffer: the thread-local `key` while it exists,
/// else this thread's entry of `orphans` (created empty on first use). A
/// pointer into the buffer stays valid until the thread's next `per_thread`
/// call on the same buffer.
pub(crate) fn per_thread<T: Default, R>(
    key: &'static LocalKey<RefCell<T>>,
    orphans: &Orphans<T>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut f = Some(f);
    if let Ok(r) = key.try_with(|b| f.take().expect("called once")(&mut b.borrow_mut())) {
        return r;
    }
    let f = f.expect("try_with did not run the closure");
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    let mut table = lock_orphans(orphans);
    f(table.entry(tid).or_default())
}

fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', "\\0")).expect("NULs were replaced");
    per_thread(&LAST_ERROR, &LAST_ERROR_ORPHANS, |e| *e = c);
}

thread_local! {
    /// The registries' locks, held by the forking thread between the
    /// `prepare` and the `parent`/`child` fork handlers.
    static FORK_HOLDS: RefCell<Option<ForkHolds>> = const { RefCell::new(None) };
}

type ForkHolds = (
    OrphansHold<CString>,
    super::ndarray::ForkHold,
    ForkHold<'static, Arc<KvHandle>>,
    ForkHold<'static, crate::ndarray::NDArray>,
    std::sync::MutexGuard<'static, usize>,
    crate::psenv::ForkHold,
    crate::factory::ForkHold,
    crate::ndarray::pool::ForkHold,
);

extern "C" fn fork_prepare() {
    // The library's process-wide locks that C API calls take, each held
    // briefly and nothing waited for under them. The per-thread tables' come
    // first: a load holds its table's lock while it registers handles (the
    // array registry's lock); no other lock here is taken while another of
    // them is held.
    let holds = (
        hold_orphans_for_fork(&LAST_ERROR_ORPHANS),
        super::ndarray::hold_for_fork(),
        KVSTORES.hold_for_fork(),
        NDARRAYS.hold_for_fork(),
        super::kvstore::hold_store_count_for_fork(),
        crate::psenv::hold_for_fork(),
        crate::factory::hold_for_fork(),
        crate::ndarray::pool::hold_for_fork(),
    );
    // (a fork from a thread whose thread-locals are gone goes unguarded)
    let _ = FORK_HOLDS.try_with(|h| *h.borrow_mut() = Some(holds));
}

extern "C" fn fork_done() {
    let _ = FORK_HOLDS.try_with(|h| h.borrow_mut().take());
}

/// Installs the `pthread_atfork` handlers that keep a `fork()` from
/// happening while another thread holds one of the library's process-wide
/// locks (the per-thread buffers' tables of calls made after a thread's
/// thread-locals are gone, a handle registry's, the store count's, the
/// ps-lite variables', the worker node's and dist stores' of `factory`, the
/// buffer pool's):
/// the child would find it held forever. Run when the library is loaded (an ELF
/// constructor, below), before any entry point can run: installed lazily by
/// the first call, a fork made while another thread was installing them left
/// the child waiting for the installation forever. Locks of single arrays and
/// stores held by other threads at the fork stay held in the child, as in
/// MXNet: a child must not use what other threads of the parent were using.
extern "C" fn install_fork_handlers() {
    // SAFETY: the handlers are plain functions that take or release a
    // lock. They stay valid while the library is loaded, and glibc's
    // pthread_atfork (from libc_nonshared.a, linked into this library)
    // registers them under the library's __dso_handle, so that unloading
    // the library unregisters them.
    let rc = unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_done), Some(fork_done)) };
    // ENOMEM only: forks then go unguarded, as before.
    let _ = rc;
}

// The loader runs `install_fork_handlers` when it loads the library (or a
// program linked with libmxkv.a), before `main` or `dlopen` returns.
#[used]
#[link_section = ".init_array"]
static INSTALL_FORK_HANDLERS: extern "C" fn() = install_fork_handlers;

// csrc/callbacks.cc: turn thread cancellation off, returning the state it
// had; set a state returned by `mxkv_cancel_off`. (Declared inside functions,
// where cbindgen does not look: they are not part of the C API.)

/// Turns the calling thread's cancellation off; returns the state it had.
fn cancel_off() -> c_int {
    extern "C" {
        fn mxkv_cancel_off() -> c_int;
    }
    // SAFETY: only changes the calling thread's cancellation state.
    unsafe { mxkv_cancel_off() }
}

/// Sets the calling thread's cancellation state to one `cancel_off` returned.
fn cancel_set(state: c_int) {
    extern "C" {
        fn mxkv_cancel_set(state: c_int);
    }
    // SAFETY: only changes the calling thread's cancellation state. (With
    // the asynchronous cancellation type and a request pending, glibc would
    // act on it right here and unwind; but no library call may be made with
    // that type on at all: POSIX allows only async-cancel-safe functions.)
    unsafe { mxkv_cancel_set(state) }
}

thread_local! {
    /// The cancellation state of the innermost C API call's caller, for the
    /// callbacks the call makes.
    static CALLER_CANCEL: Cell<Option<c_int>> = const { Cell::new(None) };
}

/// glibc's `PTHREAD_CANCEL_DISABLE` (checked in csrc/callbacks.cc).
const CANCEL_DISABLE: c_int = 1;

/// Runs `f` (a user callback call) with the thread's cancellation state as
/// the C API's caller had it, and turns cancellation off again after it.
/// (A caller's "disabled" is the state the call works in already: only the
/// turning off after the callback is made, in case the callback changed it.)
pub(crate) fn with_caller_cancel_state<R>(f: impl FnOnce() -> R) -> R {
    let Some(state) = CALLER_CANCEL.try_with(Cell::get).ok().flatten() else {
        return f();
    };
    if state != CANCEL_DISABLE {
        cancel_set(state);
    }
    let r = f();
    // off again, as on entry
    cancel_off();
    r
}

/// Runs `body` for the entry point `name`: 0 on success; on error or panic,
/// `-1` with `"{name}: {message}"` kept for `MXGetLastError`. Thread
/// cancellation is off meanwhile (a request is acted on at the caller's next
/// cancellation point; see csrc/callbacks.cc), except in user callbacks.
/// Two `pthread_setcancelstate` calls (one when the caller had cancellation
/// off), and two more around each callback: entry points whose work
/// reaches no cancellation point use [`api_call_light`] instead.
pub(crate) fn api_call(name: &'static str, body: impl FnOnce() -> Result<(), Error>) -> c_int {
    // (put back below)
    let caller = cancel_off();
    let outer = CALLER_CANCEL.try_with(|c| c.replace(Some(caller))).ok();
    let rc = api_call_inner(name, body);
    if let Some(outer) = outer {
        let _ = CALLER_CANCEL.try_with(|c| c.set(outer));
    }
    // (a caller's "disabled" is the state now: off on entry and after
    // every callback)
    if caller != CANCEL_DISABLE {
        cancel_set(caller);
    }
    rc
}

/// [`api_call`] for entry points whose work reaches no cancellation point,
/// so that a cancellation request cannot be acted on inside them and the
/// thread's cancellation state need not change: handle lookups, reads of an
/// array's shape, dtype, context and storage type, the freeing of an array
/// handle (dropping memory: `free`, `munmap`, the buffer pool), writes of
/// outputs and of the per-thread buffers. No file or socket I/O, printing,
/// sleeps, thread joins, libc waits (`pthread_cond_wait`, `sem_wait`; the
/// std and parking_lot locks wait with the futex system call, which is not
/// a cancellation point), rayon or callbacks. (Bindings call these all the
/// time, and updaters call `MXNDArrayFree` twice per update: the two
/// `pthread_setcancelstate` calls were about half of `MXNDArrayGetDType`.)
/// A panic's message printed by the panic hook is the one exception: with
/// a cancellation request pending and cancellation on, that write would act
/// on it (an internal error then aborts the process instead of returning -1).
pub(crate) fn api_call_light(
    name: &'static str,
    body: impl FnOnce() -> Result<(), Error>,
) -> c_int {
    api_call_inner(name, body)
}

fn api_call_inner(name: &'static str, body: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {e}"));
            -1
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            set_last_error(format!("{name}: internal error (panic: {what})"));
            -1
        }
    }
}

/// A C API call that may call user callbacks, and its result.
struct Job<F> {
    /// Taken exactly once (by `run_job`, or inline when no second stack
    /// could be made); `ManuallyDrop` so that the frame of `beside` holds
    /// nothing to drop while callbacks run.
    f: ManuallyDrop<F>,
    rc: c_int,
}

extern "C" fn run_job<F: FnOnce() -> c_int>(data: *mut c_void) {
    // SAFETY: `data` is the `Job<F>` of `beside`, alive and not otherwise
    // used while the body runs; its closure has not been taken yet (this is
    // the only call, made before `mxkv_run_beside` returns).
    let job = unsafe { &mut *(data as *mut Job<F>) };
    // SAFETY: taken once, here (see above).
    let f = unsafe { ManuallyDrop::take(&mut job.f) };
    job.rc = f();
}

/// Runs `job` (a C API call's whole work, `api_call` included, which may call
/// user callbacks) on a second stack of this thread, so that callbacks run on
/// the thread's own stack with no Rust frame that holds anything between
/// them and the C API's caller: see csrc/callbacks.cc. A callback that ends
/// its thread (`pthread_exit`, cancellation; CPython at interpreter exit)
/// makes the call fail inside, which releases what it holds, and the thread
/// then ends from here without returning; the C API function calling this
/// must be `extern "C-unwind"` and hold nothing to drop either.
pub(crate) fn beside<F: FnOnce() -> c_int>(job: F) -> c_int {
    extern "C-unwind" {
        // csrc/callbacks.cc: 0 when the body ran, -1 when no second stack
        // could be made (the body did not run); unwinds (a thread's forced
        // unwind) when a callback ended the thread.
        fn mxkv_run_beside(body: extern "C" fn(*mut c_void), data: *mut c_void) -> c_int;
    }
    let mut job = Job {
        f: ManuallyDrop::new(job),
        rc: -1,
    };
    let data = &mut job as *mut Job<F> as *mut c_void;
    // SAFETY: `run_job::<F>` reads `data` as the `Job<F>` it is, which lives
    // until this function returns; the body runs at most once.
    if unsafe { mxkv_run_beside(run_job::<F>, data) } == 0 {
        return job.rc;
    }
    // No second stack (out of address space): run here; callbacks then run
    // inside this call as everywhere else.
    // SAFETY: the body did not run, so the closure is still there.
    let f = unsafe { ManuallyDrop::take(&mut job.f) };
    f()
}

/// `const char *MXGetLastError();` — the message of the last failing call on
/// this thread (`""` if none). Valid until the next failing call on the same
/// thread; not cleared by successful calls. Calls made while the thread
/// exits (from destructors of thread-local or static objects) work too; the
/// text of a failure from before the library's thread-locals were destroyed
/// is gone by then.
#[no_mangle]
pub extern "C" fn MXGetLastError() -> *const c_char {
    per_thread(&LAST_ERROR, &LAST_ERROR_ORPHANS, |e| e.as_ptr())
}
