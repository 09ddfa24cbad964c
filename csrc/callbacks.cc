// How the library calls the C callbacks a user hands to the C API (updaters,
// the server controller), so that whatever a callback does on its way out
// stays out of the library's Rust frames:
//
// * A C++ exception is caught here. Each trampoline returns 0 when the
//   callback returned, 1 when it threw a std::exception (its what() copied,
//   truncated and NUL-terminated, into err[0..err_len)), 2 when it threw
//   anything else.
//
// * A thread's forced unwind (pthread_exit or a cancellation inside the
//   callback; CPython 3.11 calls pthread_exit when a daemon thread takes the
//   GIL during interpreter finalisation) cannot be stopped: glibc aborts
//   ("FATAL: exception not rethrown") if it is caught and not rethrown. Nor
//   may it cross Rust frames: Rust's catch_unwind aborts on it, and a forced
//   unwind through Rust frames that hold destructors is undefined behaviour
//   (RFC 2945, "Forced unwinding"). So the C API calls that may call back
//   (MXKVStorePush*, MXKVStorePushPull*, MXKVStoreRunServer) do their work on
//   a second stack of the same thread (mxkv_run_beside): the callbacks run on
//   the thread's own stack, where the only frames between the callback and
//   the C API's caller are the one below and the export's frame, which holds
//   nothing to drop. When a callback's thread ends, the catch below switches
//   back to the library's stack, where the trampoline returns 3 ("the thread
//   is exiting"): the library call fails as on any callback error, releasing
//   its locks as it returns; then the forced unwind goes on (rethrown) and the
//   thread ends as the callback asked, with its exit value.
//
// Off such a call (a push that started before the first C updater was set,
// or no second stack could be mapped), a callback runs right here, inside
// the try/catch; a forced unwind could only go on into the library's Rust
// frames, so the process ends with a message instead (std::abort).
//
// The switches between the two stacks are _setjmp/_longjmp (no system call;
// swapcontext sets the signal mask each time, a system call that made a
// push with an updater four times as slow); a second stack is started once
// with makecontext/setcontext and then kept, parked in its loop.

// glibc's fortified longjmp (__longjmp_chk) refuses a jump to another stack,
// which is what the switches below are (as in QEMU's coroutine-ucontext).
#ifdef _FORTIFY_SOURCE
#undef _FORTIFY_SOURCE
#endif
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <exception>
#include <new>
#include <pthread.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define MXKV_HAVE_VALGRIND 1
#endif
#endif

namespace {

typedef void (*int_updater)(int, void *, void *, void *);
typedef void (*str_updater)(const char *, void *, void *, void *);
typedef void (*controller)(int, const char *, void *);
typedef void (*body_fn)(void *);

void copy_what(const std::exception &e, char *err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  const char *w = e.what();
  if (w == nullptr) w = "";
  size_t n = std::strlen(w);
  if (n >= err_len) n = err_len - 1;
  std::memcpy(err, w, n);
  err[n] = '\0';
}

// A callback call waiting to run on the thread's own stack.
struct Request {
  int (*run)(void *ctx, char *err, size_t err_len);
  void *ctx;
  char *err;
  size_t err_len;
  int ret;
};

// A second stack, with its loop (fiber_main) parked in `resume` when no
// body runs on it. The header sits at the top of the stack's own mapping.
struct Fiber {
  jmp_buf resume;  // where the fiber waits: for a body, or for a callback's result
  jmp_buf *start;  // while the fiber starts: where it parks back to
  void *base;      // the mapping: guard page, stack, this header
  size_t size;
  unsigned vg_id;
  void *sp;        // the stack (for AddressSanitizer)
  size_t len;
  void *fake;      // AddressSanitizer's fake stack of the fiber while away
};

// One library call running on a second stack (mxkv_run_beside).
struct Beside {
  jmp_buf caller;     // the thread's own stack, where callbacks run
  Fiber *fiber;       // the library's stack
  body_fn body;
  void *data;
  bool done;
  bool exiting;       // a callback ended the thread: no more callbacks
  Request *request;   // the callback to run next, if any
  Beside *outer;      // the call whose callback made this call, if any
};

// The library call of this thread whose callbacks would run now: set while
// its body runs on its second stack; while one of its callbacks runs on the
// thread's stack it is the enclosing call's (usually none), so that a nested
// C API call from the callback starts its own.
thread_local Beside *current = nullptr;

// Second stacks: 8 MiB (as a main thread's) of address space with a guard
// page below, reserved lazily and kept per thread for reuse (up to four: one
// per nesting depth in use), unmapped when the thread ends. The cache is
// plain data (no thread_local destructor of its own to outlive): C API calls
// from other thread_local or static destructors still find it.
const size_t STACK_SIZE = size_t(8) << 20;
const int CACHED = 4;

struct Cache {
  Fiber *fibers[CACHED];
  int n;
  bool gone;  // the thread is ending: stacks go back at once
};

thread_local Cache cache;

void release(Fiber *f) {
#ifdef MXKV_HAVE_VALGRIND
  VALGRIND_STACK_DEREGISTER(f->vg_id);
#endif
  munmap(f->base, f->size);
}

// Empties the cache when the thread ends.
struct Reaper {
  ~Reaper() {
    for (int i = 0; i < cache.n; i++) release(cache.fibers[i]);
    cache.n = 0;
    cache.gone = true;
  }
};

thread_local Reaper reaper;

// The fiber being started (start_fiber to fiber_main).
thread_local Fiber *starting = nullptr;

}  // namespace

// AddressSanitizer's annotations of stack switches, when the program runs
// under it (weak: null otherwise). Without them it takes a second stack for
// a corrupt one ("False positive error reports may follow").
extern "C" {
__attribute__((weak, visibility("default"))) void __sanitizer_start_switch_fiber(
    void **fake_stack_save, const void *bottom, size_t size);
__attribute__((weak, visibility("default"))) void __sanitizer_finish_switch_fiber(
    void *fake_stack_save, const void **bottom_old, size_t *size_old);
}

namespace {

// The thread's own stack as AddressSanitizer knows it, and its fake stack
// while the thread runs on a second stack.
thread_local const void *own_bottom = nullptr;
thread_local size_t own_size = 0;
thread_local void *own_fake = nullptr;

inline void leave_own(Fiber *to) {
  if (__sanitizer_start_switch_fiber != nullptr)
    __sanitizer_start_switch_fiber(&own_fake, to->sp, to->len);
}

inline void arrive_own() {
  if (__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(own_fake, nullptr, nullptr);
}

inline void leave_fiber(Fiber *f) {
  if (__sanitizer_start_switch_fiber != nullptr)
    __sanitizer_start_switch_fiber(&f->fake, own_bottom, own_size);
}

inline void arrive_fiber(Fiber *f) {
  if (__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(f->fake, &own_bottom, &own_size);
}

// A fiber's whole life: parks at once (start_fiber), then runs one body per
// resume and switches back to its caller. Never returns.
[[noreturn]] void fiber_main() {
  Fiber *f = starting;
  arrive_fiber(f);
  leave_fiber(f);
  if (_setjmp(f->resume) == 0) _longjmp(*f->start, 1);
  for (;;) {
    Beside *b = current;
    arrive_fiber(b->fiber);
    b->body(b->data);
    b->done = true;
    leave_fiber(b->fiber);
    if (_setjmp(b->fiber->resume) == 0) _longjmp(b->caller, 1);
  }
}

// Runs the new fiber `f` up to its first park. The only switch made with
// setcontext (a system call, for the signal mask); the others are
// _setjmp/_longjmp, which leave the signal mask alone.
__attribute__((noinline)) bool start_fiber(Fiber *f, void *sp, size_t len) {
  ucontext_t uc;
  if (getcontext(&uc) != 0) return false;
  uc.uc_stack.ss_sp = sp;
  uc.uc_stack.ss_size = len;
  uc.uc_link = nullptr;
  makecontext(&uc, fiber_main, 0);
  jmp_buf back;
  f->start = &back;
  starting = f;
  f->sp = sp;
  f->len = len;
  leave_own(f);
  if (_setjmp(back) == 0) {
    setcontext(&uc);
    arrive_own();
    return false;  // setcontext failed
  }
  arrive_own();
  return true;
}

// Whether this thread runs with a shadow stack (x86 CET), which a
// _longjmp to another stack would break. (rdsspq is a no-op without one.)
bool shadow_stack() {
#if defined(__x86_64__)
  unsigned long long ssp = 0;
  __asm__ volatile("rdsspq %0" : "+r"(ssp));
  return ssp != 0;
#else
  return false;
#endif
}

Fiber *take_fiber() {
  (void)&reaper;  // constructs it (once per thread), so that it runs at thread end
  if (cache.n > 0) return cache.fibers[--cache.n];
  if (shadow_stack()) return nullptr;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t size = STACK_SIZE + page;
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (mprotect(p, page, PROT_NONE) != 0) {
    munmap(p, size);
    return nullptr;
  }
  char *top = static_cast<char *>(p) + size;
  uintptr_t at = (reinterpret_cast<uintptr_t>(top) - sizeof(Fiber)) & ~uintptr_t(63);
  Fiber *f = new (reinterpret_cast<void *>(at)) Fiber();
  f->base = p;
  f->size = size;
  f->vg_id = 0;
  char *sp = static_cast<char *>(p) + page;
  size_t len = size_t(reinterpret_cast<char *>(at) - sp) & ~size_t(63);
#ifdef MXKV_HAVE_VALGRIND
  f->vg_id = VALGRIND_STACK_REGISTER(sp, sp + len);
#endif
  if (!start_fiber(f, sp, len)) {
    release(f);
    return nullptr;
  }
  return f;
}

void give_fiber(Fiber *f) {
  if (cache.gone || cache.n == CACHED) {
    release(f);
    return;
  }
  cache.fibers[cache.n++] = f;
}

// Runs one callback call: 0/1/2 as documented above; a forced unwind passes
// on.
int run_guarded(Request *r) {
  try {
    return r->run(r->ctx, r->err, r->err_len);
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (const std::exception &e) {
    copy_what(e, r->err, r->err_len);
    return 1;
  } catch (...) {
    return 2;
  }
}

// Runs the callback of `r`: on the thread's own stack when the library call
// runs beside it; else right here, where a forced unwind would have to
// cross the library's Rust frames: the process ends instead, saying why.
int call(Request *r) {
  Beside *b = current;
  if (b == nullptr) {
    try {
      return run_guarded(r);
    } catch (abi::__forced_unwind &) {
      static const char msg[] =
          "libmxkv: a callback ended its thread (pthread_exit or cancellation) where the library "
          "cannot let it: in a call that was not made on a second stack (see MXKVStoreSetUpdater); "
          "aborting\n";
      ssize_t w = write(2, msg, sizeof msg - 1);
      (void)w;
      std::abort();
    }
  }
  if (b->exiting) return 3;
  b->request = r;
  leave_fiber(b->fiber);
  if (_setjmp(b->fiber->resume) == 0) _longjmp(b->caller, 1);
  arrive_fiber(b->fiber);
  // back on the library's stack: `r->ret` is set (3 if the thread is exiting)
  return r->ret;
}

template <typename F>
int call_with(F f, char *err, size_t err_len) {
  Request r;
  r.run = [](void *ctx, char *, size_t) {
    (*static_cast<F *>(ctx))();
    return 0;
  };
  r.ctx = &f;
  r.err = err;
  r.err_len = err_len;
  r.ret = 0;
  return call(&r);
}

}  // namespace

extern "C" int mxkv_guarded_int_updater(int_updater f, int key, void *recv, void *local,
                                        void *user, char *err, size_t err_len) {
  return call_with([&] { f(key, recv, local, user); }, err, err_len);
}

extern "C" int mxkv_guarded_str_updater(str_updater f, const char *key, void *recv, void *local,
                                        void *user, char *err, size_t err_len) {
  return call_with([&] { f(key, recv, local, user); }, err, err_len);
}

extern "C" int mxkv_guarded_controller(controller f, int head, const char *body, void *user,
                                       char *err, size_t err_len) {
  return call_with([&] { f(head, body, user); }, err, err_len);
}

// Runs body(data) on a second stack of this thread; the callbacks it makes
// through the trampolines above run on this (the thread's own) stack.
// Returns 0 when the body ran; -1 when no stack could be made: the body did
// not run. If a callback ends the thread, the body is finished first (its
// callbacks then return 3 at once) and the forced unwind goes on from here:
// this function does not return.
extern "C" int mxkv_run_beside(body_fn body, void *data) {
  Fiber *f = take_fiber();
  if (f == nullptr) return -1;
  Beside b;
  b.fiber = f;
  b.body = body;
  b.data = data;
  b.done = false;
  b.exiting = false;
  b.request = nullptr;
  b.outer = current;
  current = &b;
  leave_own(f);
  if (_setjmp(b.caller) == 0) _longjmp(f->resume, 1);
  arrive_own();
  while (!b.done) {
    // The body asks for a callback: run it here, on the thread's stack.
    Request *r = b.request;
    b.request = nullptr;
    current = b.outer;
    try {
      r->ret = run_guarded(r);
    } catch (abi::__forced_unwind &) {
      // The thread ends. Let the body finish (its callbacks return 3 from
      // now on) so that it releases what it holds, then end the thread.
      r->ret = 3;
      b.exiting = true;
      current = &b;
      leave_own(b.fiber);
      if (_setjmp(b.caller) == 0) _longjmp(b.fiber->resume, 1);
      arrive_own();
      current = b.outer;
      give_fiber(b.fiber);
      throw;
    }
    current = &b;
    leave_own(b.fiber);
    if (_setjmp(b.caller) == 0) _longjmp(b.fiber->resume, 1);
    arrive_own();
  }
  current = b.outer;
  give_fiber(b.fiber);
  return 0;
}

// Thread cancellation while the library works: a cancellation request acted
// on inside the library (its file I/O and sleeps are cancellation points)
// would unwind Rust frames like a callback's pthread_exit. Every C API call
// whose work may reach a cancellation point turns cancellation off on entry
// (mxkv_cancel_off returns the caller's state) and puts the caller's state
// back on return (mxkv_cancel_set), and callbacks run with the caller's
// state; a request made meanwhile is acted on at the caller's next
// cancellation point. (Calls that reach none, such as the array getters and
// MXNDArrayFree, leave the state alone: src/capi/boundary.rs, api_call_light.)
// (src/capi/boundary.rs knows the disabled state as 1)
static_assert(PTHREAD_CANCEL_DISABLE == 1, "PTHREAD_CANCEL_DISABLE is 1");

extern "C" int mxkv_cancel_off() {
  int old = PTHREAD_CANCEL_ENABLE;
  if (pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old) != 0) return PTHREAD_CANCEL_ENABLE;
  return old;
}

extern "C" void mxkv_cancel_set(int state) {
  int old;
  pthread_setcancelstate(state, &old);
}
