/*
 * The cost of the second stack that pushes run on while a C updater exists
 * (csrc/callbacks.cc: the updater runs on the thread's own stack, so that an
 * updater ending its thread meets no Rust frame). The switches between the
 * two stacks must make no system call: with swapcontext, each switch set the
 * signal mask (rt_sigprocmask), four per push with an updater, which made
 * such a push four times as slow (1.25 us instead of 0.3 us for one float).
 *
 * A forked child pushes once (the second stack is made and started then),
 * installs a seccomp filter that kills the process on rt_sigprocmask, and
 * pushes 100 times more, nested pushes from the updater included; the parent
 * checks that the child ended normally and that every update landed.
 * Skipped where seccomp filters cannot be installed, and under valgrind
 * (whose own system calls the filter would meet).
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"
#include "fork_util.h"

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

static KVStoreHandle kv;
static int updates;

/* adds recv into local; the update of key 3 also pushes key 4 (a nested
   push from the updater, on a second second stack) */
static void upd(int key, NDArrayHandle recv, NDArrayHandle local, void *u) {
  (void)u;
  float r, l;
  if (MXNDArraySyncCopyToCPU(recv, &r, 1) != 0 || MXNDArraySyncCopyToCPU(local, &l, 1) != 0)
    _exit(10);
  l += r;
  if (MXNDArraySyncCopyFromCPU(local, &l, 1) != 0) _exit(11);
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
  updates++;
  if (key == 3) {
    int k4 = 4;
    if (MXKVStorePush(kv, 1, &k4, &recv, 0) == 0) _exit(12); /* recv is freed: -1 */
    NDArrayHandle one = make_f32(1, (float[]){1});
    if (MXKVStorePush(kv, 1, &k4, &one, 0) != 0) _exit(13);
    MXNDArrayFree(one);
  }
}

static int no_sigprocmask(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigprocmask, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static int child(void *arg) {
  (void)arg;
  int k = 3;
  NDArrayHandle v = make_f32(1, (float[]){2});
  if (MXKVStorePush(kv, 1, &k, &v, 0) != 0) return 2; /* makes the second stacks */
  if (no_sigprocmask() != 0) return 100 + errno;
  for (int i = 0; i < 100; i++)
    if (MXKVStorePush(kv, 1, &k, &v, 0) != 0) return 3;
  NDArrayHandle out = make_f32(1, (float[]){0});
  int k4 = 4;
  float got3 = 0, got4 = 0;
  if (MXKVStorePull(kv, 1, &k, &out, 0) != 0 || MXNDArraySyncCopyToCPU(out, &got3, 1) != 0)
    return 4;
  if (MXKVStorePull(kv, 1, &k4, &out, 0) != 0 || MXNDArraySyncCopyToCPU(out, &got4, 1) != 0)
    return 5;
  /* 101 pushes of 2 into key 3, each update pushing 1 into key 4 */
  if (got3 != 202 || got4 != 101 || updates != 202) return 6;
  return 0;
}

int main(void) {
  if (under_valgrind()) {
    printf("test_callback_switch: skipped under valgrind (the filter would meet its system calls)\n");
    return 0;
  }
  CHECK_OK(MXKVStoreCreate("local", &kv));
  int keys[2] = {3, 4};
  NDArrayHandle z[2] = {make_f32(1, (float[]){0}), make_f32(1, (float[]){0})};
  CHECK_OK(MXKVStoreInit(kv, 2, keys, z));
  CHECK_OK(MXKVStoreSetUpdater(kv, upd, NULL));
  int st = wait_child(fork_child(child, NULL, 20));
  if (WIFEXITED(st) && WEXITSTATUS(st) >= 100) {
    printf("test_callback_switch: skipped (no seccomp filter: %s)\n",
           strerror(WEXITSTATUS(st) - 100));
    return 0;
  }
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS) {
    fprintf(stderr, "a push with an updater called rt_sigprocmask (a system call per stack switch)\n");
    exit(1);
  }
  CHECK_CHILD(st, "pushes with an updater");
  CHECK_OK(MXKVStoreFree(kv));
  MXNDArrayFree(z[0]);
  MXNDArrayFree(z[1]);
  printf("test_callback_switch: OK\n");
  return 0;
}
