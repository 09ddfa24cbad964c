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
 * one (alarm(): a child that hangs is killed, and the test fails).
 *
 * Built and run by `make ctest` (skipped under ASan and valgrind, as
 * test_fork_threads is).
 */
#include "check.h"
#include "fork_util.h"

enum { THREADS = 8 };

static int child(int round) {
  (void)round;
  NDArrayHandle h;
  if (MXNDArrayCreateEx(&CHURN_BIG, 1, DEV_CPU, 0, 0, DT_F32, &h) != 0) return 2;
  float *p;
  if (MXNDArrayGetData(h, (void **)&p) != 0) return 3;
  p[0] = 1;
  p[CHURN_BIG - 1] = 2;
  NDArrayHandle small = make_f32(2, (float[]){3, 4});
  float v[2];
  if (MXNDArraySyncCopyToCPU(small, v, 2) != 0 || v[0] != 3 || v[1] != 4) return 4;
  if (p[0] != 1 || p[CHURN_BIG - 1] != 2) return 5;
  if (MXNDArrayFree(h) != 0 || MXNDArrayFree(small) != 0) return 6;
  return 0;
}

int main(int argc, char **argv) {
  if (under_asan()) {
    printf("test_fork_big_arrays: skipped under AddressSanitizer (its allocator is not fork-safe)\n");
    return 0;
  }
  if (under_valgrind()) {
    printf("test_fork_big_arrays: skipped under valgrind (children leak what other threads held)\n");
    return 0;
  }
  int rounds = argc > 1 ? atoi(argv[1]) : 300;
  /* read by the library when the first big array is freed */
  CHECK(setenv("MXKV_CPU_MEM_POOL_MB", "0", 1) == 0);
  for (int i = 0; i < THREADS; i++) churn(churn_big);
  int bad = fork_rounds(rounds, child, 10);
  churn_stop();
  CHECK(bad == 0);
  printf("test_fork_big_arrays: OK\n");
  return 0;
}
