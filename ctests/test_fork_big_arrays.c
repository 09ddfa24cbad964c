/*
 * fork() while other threads create and free big arrays (32 MiB and more
 * are mapped, through the buffer pool of src/ndarray/pool.rs): the pool's
 * process-wide lock, held by another thread at the fork, stayed held in the
 * child, whose first big array then waited forever (seen in about one round
 * in 700 with two such threads, within 40 rounds with eight). The C API's
 * pthread_atfork handlers hold it across fork() now, as the handle
 * registries' locks (src/capi/boundary.rs).
 *
 * Eight threads create and free 32 MiB arrays (with MXKV_CPU_MEM_POOL_MB=0,
 * so that each round is mmap and munmap of untouched memory, and the
 * threads spend their time near the lock); the main thread forks 300 times
 * and each child creates, writes, reads and frees a big array and a small
 * one (alarm(): a child that hangs is killed and counted).
 *
 * Built and run by `make ctest` (skipped under ASan and valgrind, as
 * test_fork_threads is).
 */
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

enum { THREADS = 8 };
/* 32 MiB of float32: the smallest array that is mapped */
static const uint32_t BIG = 1u << 23;
static atomic_int stop_;

static void *churn_big(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_)) {
    NDArrayHandle h;
    CHECK_OK(MXNDArrayCreateEx(&BIG, 1, DEV_CPU, 0, 0, DT_F32, &h));
    CHECK_OK(MXNDArrayFree(h));
  }
  return NULL;
}

static int child(void) {
  alarm(10);
  NDArrayHandle h;
  if (MXNDArrayCreateEx(&BIG, 1, DEV_CPU, 0, 0, DT_F32, &h) != 0) return 2;
  float *p;
  if (MXNDArrayGetData(h, (void **)&p) != 0) return 3;
  p[0] = 1;
  p[BIG - 1] = 2;
  NDArrayHandle small = make_f32(2, (float[]){3, 4});
  float v[2];
  if (MXNDArraySyncCopyToCPU(small, v, 2) != 0 || v[0] != 3 || v[1] != 4) return 4;
  if (p[0] != 1 || p[BIG - 1] != 2) return 5;
  if (MXNDArrayFree(h) != 0 || MXNDArrayFree(small) != 0) return 6;
  return 0;
}

int main(int argc, char **argv) {
#ifdef UNDER_ASAN
  printf("test_fork_big_arrays: skipped under AddressSanitizer (its allocator is not fork-safe)\n");
  return 0;
#endif
  if (RUNNING_ON_VALGRIND) {
    printf("test_fork_big_arrays: skipped under valgrind (children leak what other threads held)\n");
    return 0;
  }
  int rounds = argc > 1 ? atoi(argv[1]) : 300;
  /* read by the library when the first big array is freed */
  CHECK(setenv("MXKV_CPU_MEM_POOL_MB", "0", 1) == 0);
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, churn_big, NULL) == 0);
  int hung = 0, failed = 0;
  for (int i = 0; i < rounds && hung == 0 && failed == 0; i++) {
    pid_t p = fork();
    CHECK(p >= 0);
    if (p == 0) _exit(child());
    int st;
    CHECK(waitpid(p, &st, 0) == p);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
      hung++;
      fprintf(stderr, "round %d: the child hung\n", i);
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      failed++;
      fprintf(stderr, "round %d: the child ended with status 0x%x\n", i, st);
    }
  }
  atomic_store(&stop_, 1);
  for (int i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
  CHECK(hung == 0);
  CHECK(failed == 0);
  printf("test_fork_big_arrays: OK\n");
  return 0;
}
