/*
 * fork() while another thread calls the library after its thread-locals are
 * gone (from a thread-specific-data destructor at thread exit, or an atexit
 * handler: see test_exit_calls.c). Such calls keep the thread's error text
 * and the buffers the shape getters and MXNDArrayLoad return in process-wide
 * tables keyed by the thread id (src/capi/boundary.rs `per_thread`), each
 * behind a lock; a fork while another thread held one left it held forever
 * in the child, whose own calls of that kind (a destructor of one of its
 * threads, an atexit handler) then waited forever. The C API's
 * pthread_atfork handlers hold these locks across fork() too now, as the
 * registries', the buffer pool's and the others of test_fork_threads.
 *
 * Four threads each end into a destructor that makes such calls in a loop
 * (a failing call and MXGetLastError, the three shape getters, a load); the
 * main thread forks 200 times and each child starts a thread whose
 * destructor makes each of those calls once, and joins it (alarm(): a child
 * that hangs is killed, and the test fails).
 *
 * Built and run by `make ctest` (skipped under ASan and valgrind, as
 * test_fork_threads is).
 */
#include "check.h"
#include "fork_util.h"

enum { THREADS = 4 };

static char g_file[64];
static pthread_key_t g_key, g_child_key;
static NDArrayHandle g_array; /* 3 x 4 float32, shared by every caller */

/* One round of each per-thread table's calls; 0 when every call answers. */
static int orphan_calls(void) {
  uint32_t nd = 0;
  const uint32_t *pd = NULL;
  int nd32 = 0;
  const int *pd32 = NULL;
  const int64_t *pd64 = NULL;
  if (MXNDArrayGetShape(g_array, &nd, &pd) != 0 || nd != 2 || pd[1] != 4) return 1;
  if (MXNDArrayGetShapeEx(g_array, &nd32, &pd32) != 0 || nd32 != 2 || pd32[1] != 4) return 2;
  if (MXNDArrayGetShapeEx64(g_array, &nd32, &pd64) != 0 || nd32 != 2 || pd64[1] != 4) return 3;
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arrs = NULL;
  const char **names = NULL;
  if (MXNDArrayLoad(g_file, &n, &arrs, &nn, &names) != 0 || n != 1) return 4;
  if (MXNDArrayFree(arrs[0]) != 0) return 5;
  if (MXNDArrayFree((NDArrayHandle)(uintptr_t)0x4e00000000001234ULL) != -1) return 6;
  if (strstr(MXGetLastError(), "MXNDArrayFree") == NULL) return 7;
  return 0;
}

/* the parent's threads: calls from the destructor until the test ends */
static void churn_dtor(void *arg) {
  (void)arg;
  while (churning()) CHECK(orphan_calls() == 0);
}

/* a child's thread: the calls once, from the destructor */
static int child_rc;
static void child_dtor(void *arg) {
  (void)arg;
  child_rc = orphan_calls();
}

/* a thread that ends into the destructor of `key` (a pthread_key_t *) */
static void *end_into_destructor(void *key) {
  /* the library's thread-locals exist (and are destroyed before the key's
     destructor runs) */
  CHECK(MXGetLastError() != NULL);
  CHECK(pthread_setspecific(*(pthread_key_t *)key, g_file) == 0);
  return NULL;
}

static int child(int round) {
  (void)round;
  child_rc = -1;
  pthread_t t;
  if (pthread_create(&t, NULL, end_into_destructor, &g_child_key) != 0) return 21;
  if (pthread_join(t, NULL) != 0) return 22;
  return child_rc == 0 ? 0 : 10 + child_rc;
}

int main(int argc, char **argv) {
  if (under_asan()) {
    printf("test_fork_orphans: skipped under AddressSanitizer (its allocator is not fork-safe)\n");
    return 0;
  }
  if (under_valgrind()) {
    printf("test_fork_orphans: skipped under valgrind (children leak what other threads held)\n");
    return 0;
  }
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  snprintf(g_file, sizeof g_file, "/tmp/mxkv_fork_orphans_%d.params", (int)getpid());
  uint32_t shape[2] = {3, 4};
  g_array = make_f32_shape(shape, 2, NULL);
  const char *key = "w";
  CHECK_OK(MXNDArraySave(g_file, 1, &g_array, &key));
  CHECK(pthread_key_create(&g_key, churn_dtor) == 0);
  CHECK(pthread_key_create(&g_child_key, child_dtor) == 0);
  for (int i = 0; i < THREADS; i++) churn_arg(end_into_destructor, &g_key);
  int bad = fork_rounds(rounds, child, 10);
  churn_stop();
  unlink(g_file);
  CHECK_OK(MXNDArrayFree(g_array));
  CHECK(bad == 0);
  printf("test_fork_orphans: OK\n");
  return 0;
}
