/*
 * Helpers shared by the C tests that fork (include after check.h).
 *
 *   under_asan(), under_valgrind()   the test runs under AddressSanitizer /
 *                         valgrind (forks while other threads run are not
 *                         tested there: ASan's allocator is not fork-safe,
 *                         and valgrind counts what the other threads held as
 *                         the child's leaks)
 *   fork_child(fn, arg, timeout_s)   forks (stdio flushed first); the child
 *                         runs fn(arg) under alarm(timeout_s) (0: none) and
 *                         _exits with its value. Returns the child's pid.
 *   wait_child(pid)       waits for it; returns its wait status.
 *   child_failed(status, what)   0 when the child exited 0; otherwise prints
 *                         why to stderr ("hung" for SIGALRM) and returns 1.
 *   CHECK_CHILD(status, what)    exit(1) unless the child exited 0.
 *   churn(fn), churn_arg(fn, arg), churn_stop()   threads that run fn (fn(arg))
 *                         until churn_stop() (fn loops while churning());
 *                         churn_stop joins them.
 *   churn_big                    a churn function: creates and frees 32 MiB
 *                         arrays (mapped, through the buffer pool of
 *                         src/ndarray/pool.rs).
 *   fork_rounds(rounds, fn, timeout_s)   forks `rounds` children one after
 *                         the other, each running fn(round) under the alarm;
 *                         stops at the first that hangs or fails, and
 *                         returns 1 then (after saying so), else 0.
 */
#ifndef MXKV_CTESTS_FORK_UTIL_H
#define MXKV_CTESTS_FORK_UTIL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

static inline int under_asan(void) {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return 1;
#else
  return 0;
#endif
#else
  return 0;
#endif
}

/* (valgrind's preload library names it where valgrind.h was missing) */
static inline int under_valgrind(void) {
  const char *p = getenv("LD_PRELOAD");
  return RUNNING_ON_VALGRIND || (p != NULL && strstr(p, "vgpreload") != NULL);
}

static inline pid_t fork_child(int (*fn)(void *), void *arg, unsigned timeout_s) {
  fflush(NULL);
  pid_t p = fork();
  CHECK(p >= 0);
  if (p == 0) {
    if (timeout_s > 0) alarm(timeout_s);
    _exit(fn(arg));
  }
  return p;
}

static inline int wait_child(pid_t pid) {
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid);
  return st;
}

static inline int child_failed(int st, const char *what) {
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
    fprintf(stderr, "%s: the child hung\n", what);
  else if (WIFSIGNALED(st))
    fprintf(stderr, "%s: the child was killed by signal %d\n", what, WTERMSIG(st));
  else
    fprintf(stderr, "%s: the child exited with %d\n", what, WEXITSTATUS(st));
  return 1;
}

#define CHECK_CHILD(st, what)                                                     \
  do {                                                                            \
    if (child_failed((st), (what))) {                                             \
      fprintf(stderr, "%s:%d: CHECK_CHILD failed\n", __FILE__, __LINE__);         \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

enum { CHURN_MAX = 16 };
static atomic_int churn_stop_;
static pthread_t churn_threads_[CHURN_MAX];
static int churn_count_;

static inline int churning(void) { return !atomic_load(&churn_stop_); }

static inline void churn_arg(void *(*fn)(void *), void *arg) {
  CHECK(churn_count_ < CHURN_MAX);
  CHECK(pthread_create(&churn_threads_[churn_count_++], NULL, fn, arg) == 0);
}

static inline void churn(void *(*fn)(void *)) { churn_arg(fn, NULL); }

static inline void churn_stop(void) {
  atomic_store(&churn_stop_, 1);
  for (int i = 0; i < churn_count_; i++) CHECK(pthread_join(churn_threads_[i], NULL) == 0);
  churn_count_ = 0;
}

/* 32 MiB of float32: the smallest array that is mapped */
static const uint32_t CHURN_BIG = 1u << 23;

static inline void *churn_big(void *arg) {
  (void)arg;
  while (churning()) {
    NDArrayHandle h;
    CHECK_OK(MXNDArrayCreateEx(&CHURN_BIG, 1, DEV_CPU, 0, 0, DT_F32, &h));
    CHECK_OK(MXNDArrayFree(h));
  }
  return NULL;
}

static int (*fork_round_fn_)(int);
static inline int fork_round_child_(void *round) {
  return fork_round_fn_((int)(intptr_t)round);
}

static inline int fork_rounds(int rounds, int (*fn)(int), unsigned timeout_s) {
  fork_round_fn_ = fn;
  for (int i = 0; i < rounds; i++) {
    char what[32];
    snprintf(what, sizeof what, "round %d", i);
    int st = wait_child(fork_child(fork_round_child_, (void *)(intptr_t)i, timeout_s));
    if (child_failed(st, what)) return 1;
  }
  return 0;
}

#endif /* MXKV_CTESTS_FORK_UTIL_H */
