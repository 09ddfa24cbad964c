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
// Off such a call (a callback called on another thread), a callback runs
// right here, inside the try/catch; a forced unwind is rethrown into the
// library, which then aborts the process as before.
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <cxxabi.h>
#include <exception>
#include <pthread.h>
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

// One library call running on a second stack (mxkv_run_beside).
struct Beside {
  ucontext_t caller;  // the thread's own stack, where callbacks run
  ucontext_t side;    // the library's stack
  body_fn body;
  void *data;
  bool done;
  bool exiting;       // a callback ended the thread: no more callbacks
  Request *request;   // the callback to run next, if any
  Beside *outer;      // the call this one runs inside (nested calls), if any
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

struct Stack {
  void *base;
  size_t size;
  unsigned vg_id;
};

struct Cache {
  Stack stacks[CACHED];
  int n;
  bool gone;  // the thread is ending: stacks go back at once
};

thread_local Cache cache;

void release(const Stack &s) {
#ifdef MXKV_HAVE_VALGRIND
  VALGRIND_STACK_DEREGISTER(s.vg_id);
#endif
  munmap(s.base, s.size);
}

// Empties the cache when the thread ends.
struct Reaper {
  ~Reaper() {
    for (int i = 0; i < cache.n; i++) release(cache.stacks[i]);
    cache.n = 0;
    cache.gone = true;
  }
};

thread_local Reaper reaper;

bool take_stack(Stack *out) {
  (void)&reaper;  // constructs it (once per thread), so that it runs at thread end
  if (cache.n > 0) {
    *out = cache.stacks[--cache.n];
    return true;
  }
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  size_t size = STACK_SIZE + page;
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return false;
  if (mprotect(p, page, PROT_NONE) != 0) {
    munmap(p, size);
    return false;
  }
  out->base = p;
  out->size = size;
  out->vg_id = 0;
#ifdef MXKV_HAVE_VALGRIND
  out->vg_id = VALGRIND_STACK_REGISTER(static_cast<char *>(p) + page, static_cast<char *>(p) + size);
#endif
  return true;
}

void give_stack(const Stack &s) {
  if (cache.gone || cache.n == CACHED) {
    release(s);
    return;
  }
  cache.stacks[cache.n++] = s;
}

// The second stack's first frame: runs the body, then (uc_link) resumes the
// caller where it last switched over.
void side_entry() {
  Beside *b = current;
  b->body(b->data);
  b->done = true;
}

// Runs one callback call on the thread's stack: 0/1/2 as documented above;
// a forced unwind passes on.
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
// runs beside it, else right here.
int call(Request *r) {
  Beside *b = current;
  if (b == nullptr) return run_guarded(r);
  if (b->exiting) return 3;
  b->request = r;
  swapcontext(&b->side, &b->caller);
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

// The library's context on stack `st`, starting in side_entry and going
// back to b->caller when that returns. (Its own function: getcontext
// returns twice as far as the compiler knows, though nothing resumes it.)
__attribute__((noinline)) bool make_side(Beside *b, const Stack &st) {
  if (getcontext(&b->side) != 0) return false;
  size_t page = size_t(sysconf(_SC_PAGESIZE));
  b->side.uc_stack.ss_sp = static_cast<char *>(st.base) + page;
  b->side.uc_stack.ss_size = st.size - page;
  b->side.uc_link = &b->caller;
  makecontext(&b->side, side_entry, 0);
  return true;
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
// Returns 0 when the body ran; -1 (errno set) when no stack could be made:
// the body did not run. If a callback ends the thread, the body is finished
// first (its callbacks then return 3 at once) and the forced unwind goes on
// from here: this function does not return.
extern "C" int mxkv_run_beside(body_fn body, void *data) {
  Stack st;
  if (!take_stack(&st)) return -1;
  Beside b;
  b.body = body;
  b.data = data;
  b.done = false;
  b.exiting = false;
  b.request = nullptr;
  b.outer = current;
  if (!make_side(&b, st)) {
    give_stack(st);
    return -1;
  }
  current = &b;
  swapcontext(&b.caller, &b.side);
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
      swapcontext(&b.caller, &b.side);
      current = b.outer;
      give_stack(st);
      throw;
    }
    current = &b;
    swapcontext(&b.caller, &b.side);
  }
  current = b.outer;
  give_stack(st);
  return 0;
}

// Thread cancellation while the library works: a cancellation request acted
// on inside the library (its file I/O and sleeps are cancellation points)
// would unwind Rust frames like a callback's pthread_exit. Every C API call
// turns cancellation off on entry (mxkv_cancel_off returns the caller's
// state) and puts the caller's state back on return (mxkv_cancel_set), and
// callbacks run with the caller's state; a request made meanwhile is acted
// on at the caller's next cancellation point.
extern "C" int mxkv_cancel_off() {
  int old = PTHREAD_CANCEL_ENABLE;
  if (pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old) != 0) return PTHREAD_CANCEL_ENABLE;
  return old;
}

extern "C" void mxkv_cancel_set(int state) {
  int old;
  pthread_setcancelstate(state, &old);
}
