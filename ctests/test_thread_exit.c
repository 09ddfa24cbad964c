/*
 * An updater that ends its thread: pthread_exit, or a cancellation acted on
 * inside it (CPython 3.11 calls pthread_exit when a daemon thread takes the
 * GIL during interpreter exit, which happens inside a Python updater). In
 * MXNet 1.9.1 the thread's forced unwind passes through the library's C++
 * frames (its API_BEGIN/API_END catch only dmlc::Error and std::exception):
 * the thread ends with its exit value, its cleanup handlers run, and the
 * store stays usable. libmxkv runs such calls on a second stack so that the
 * unwind meets no Rust frame (csrc/callbacks.cc); it aborted the process with
 * "FATAL: exception not rethrown" before.
 *
 * Each case: a thread pushes (Push, PushEx with a string updater, PushPull);
 * the updater adds, then ends the thread; the joiner checks the exit value,
 * that the thread's cleanup handler ran, that the update took place, and
 * that the key is free again (the next push runs: a lock kept by the gone
 * thread would make it wait forever; alarm() turns that into a failure).
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"
#include "fork_util.h"

#include <sys/resource.h>

static KVStoreHandle kv;
static int exit_mode; /* 0: return, 1: pthread_exit, 2: cancel */
static int cleanups;
static int updates;

static void add_into(NDArrayHandle recv, NDArrayHandle local) {
  float r[2], l[2];
  CHECK_OK(MXNDArraySyncCopyToCPU(recv, r, 2));
  CHECK_OK(MXNDArraySyncCopyToCPU(local, l, 2));
  l[0] += r[0];
  l[1] += r[1];
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, l, 2));
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
  updates++;
}

static void end_thread(void) {
  if (exit_mode == 1) pthread_exit((void *)(intptr_t)42);
  if (exit_mode == 2) {
    pthread_cancel(pthread_self());
    pthread_testcancel();
    fprintf(stderr, "pthread_testcancel returned\n");
    exit(1);
  }
}

static void int_upd(int key, NDArrayHandle recv, NDArrayHandle local, void *u) {
  (void)key;
  (void)u;
  add_into(recv, local);
  end_thread();
}

static void str_upd(const char *key, NDArrayHandle recv, NDArrayHandle local, void *u) {
  (void)key;
  (void)u;
  add_into(recv, local);
  end_thread();
}

static void on_cleanup(void *arg) {
  (void)arg;
  cleanups++;
}

enum { OP_PUSH, OP_PUSH_EX, OP_PUSHPULL };
static int op;

static void *pusher(void *arg) {
  (void)arg;
  NDArrayHandle v = make_f32(2, (float[]){1, 2});
  NDArrayHandle out = make_f32(2, (float[]){0, 0});
  int k = 3;
  const char *sk = "w";
  int rc = -1;
  pthread_cleanup_push(on_cleanup, NULL);
  switch (op) {
    case OP_PUSH: rc = MXKVStorePush(kv, 1, &k, &v, 0); break;
    case OP_PUSH_EX: rc = MXKVStorePushEx(kv, 1, &sk, &v, 0); break;
    default: rc = MXKVStorePushPull(kv, 1, &k, 1, &k, &v, &out, 0); break;
  }
  pthread_cleanup_pop(0);
  /* only when the updater returned */
  CHECK_OK(rc);
  MXNDArrayFree(v);
  MXNDArrayFree(out);
  return (void *)(intptr_t)7;
}

static void run(int which, int mode, void *want) {
  op = which;
  exit_mode = mode;
  cleanups = 0;
  updates = 0;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, pusher, NULL) == 0);
  void *ret = NULL;
  CHECK(pthread_join(t, &ret) == 0);
  if (ret != want) {
    fprintf(stderr, "op %d mode %d: thread value %p, expected %p\n", which, mode, ret, want);
    exit(1);
  }
  CHECK(updates == 1);
  CHECK(cleanups == (mode == 0 ? 0 : 1));
}

/* No second stack can be mapped (the address space is capped): the push
   runs on the thread's own stack, where the updater's pthread_exit would
   unwind the library's Rust frames; the process must abort saying so (it
   aborted with Rust's "cannot catch foreign exceptions" before, after an
   unwind the Rust reference leaves undefined). Forked before this thread
   ever pushed with an updater, so that it has no second stack cached. */
static int no_second_stack_child(void *pipe_fds) {
  int *fds = pipe_fds;
  dup2(fds[1], 2);
  close(fds[0]);
  long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL || fscanf(f, "%ld", &pages) != 1) return 2;
  fclose(f);
  struct rlimit rl = {.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (2 << 20)};
  rl.rlim_max = rl.rlim_cur;
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 3;
  exit_mode = 1;
  NDArrayHandle v = make_f32(2, (float[]){1, 2});
  int k = 3;
  MXKVStorePush(kv, 1, &k, &v, 0);
  return 4; /* the updater did not end the thread */
}

static void no_second_stack(void) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t p = fork_child(no_second_stack_child, fds, 0);
  close(fds[1]);
  char err[4096] = {0};
  size_t n = 0;
  ssize_t r;
  while (n < sizeof err - 1 && (r = read(fds[0], err + n, sizeof err - 1 - n)) > 0) n += (size_t)r;
  close(fds[0]);
  int st = wait_child(p);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT ||
      strstr(err, "libmxkv: a callback ended its thread") == NULL) {
    fprintf(stderr, "no second stack: status 0x%x, stderr:\n%s\n", st, err);
    exit(1);
  }
}

int main(void) {
  alarm(60); /* a lock left held by a gone thread would hang the next push */
  CHECK_OK(MXKVStoreCreate("local", &kv));
  NDArrayHandle z = make_f32(2, (float[]){0, 0});
  int k = 3;
  const char *sk = "w";
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &z));
  CHECK_OK(MXKVStoreSetUpdaterEx(kv, int_upd, str_upd, NULL));
  /* (ASan and valgrind reserve address space as they go) */
  if (!under_asan() && !under_valgrind()) no_second_stack();

  float want = 0;
  for (int which = OP_PUSH; which <= OP_PUSHPULL; which++) {
    if (which == OP_PUSH_EX) {
      /* a string-keyed store for PushEx */
      CHECK_OK(MXKVStoreFree(kv));
      CHECK_OK(MXKVStoreCreate("local", &kv));
      CHECK_OK(MXKVStoreInitEx(kv, 1, &sk, &z));
      CHECK_OK(MXKVStoreSetUpdaterEx(kv, int_upd, str_upd, NULL));
      want = 0;
    }
    if (which == OP_PUSHPULL) {
      CHECK_OK(MXKVStoreFree(kv));
      CHECK_OK(MXKVStoreCreate("local", &kv));
      CHECK_OK(MXKVStoreInit(kv, 1, &k, &z));
      CHECK_OK(MXKVStoreSetUpdaterEx(kv, int_upd, str_upd, NULL));
      want = 0;
    }
    run(which, 1, (void *)(intptr_t)42);
    run(which, 2, PTHREAD_CANCELED);
    run(which, 0, (void *)(intptr_t)7);
    want += 3;
    /* every update landed, and this thread can push and pull the key */
    NDArrayHandle out = make_f32(2, (float[]){0, 0});
    if (which == OP_PUSH_EX)
      CHECK_OK(MXKVStorePullEx(kv, 1, &sk, &out, 0));
    else
      CHECK_OK(MXKVStorePull(kv, 1, &k, &out, 0));
    CHECK_F32(out, 2, 3 * 1.0f, 3 * 2.0f);
    MXNDArrayFree(out);
  }
  (void)want;
  CHECK_OK(MXKVStoreFree(kv));
  MXNDArrayFree(z);
  printf("test_thread_exit: OK\n");
  return 0;
}
