/*
 * Calls through the C API after the library's thread-locals are gone: from a
 * thread-specific-data destructor (run at thread exit after the C++ and Rust
 * thread-local destructors, as a C++ `thread_local` object constructed before
 * the thread's first library call would be) and from an atexit handler (run at
 * exit() after the main thread's thread-locals are destroyed, like a C++
 * static object's destructor). MXNet answers such calls normally; they must
 * not panic or abort. Each place runs the shape getters (three thread-local
 * result buffers), a load (another one), a failing call and MXGetLastError
 * (the error text's buffer), and frees its arrays.
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"

#include <pthread.h>
#include <unistd.h>

/* CHECK-like, but ending with _exit: exit() must not be called again from
   an atexit handler. */
#define EXPECT(cond)                                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond,          \
              MXGetLastError());                                                    \
      _exit(1);                                                                     \
    }                                                                               \
  } while (0)

static char g_file[64];

/* What a destructor would do with its handle once the library's per-thread
   state is gone. */
static void use_after_thread_locals(NDArrayHandle h, const char *where) {
  uint32_t nd = 0;
  const uint32_t *pd = NULL;
  EXPECT(MXNDArrayGetShape(h, &nd, &pd) == 0);
  EXPECT(nd == 2 && pd[0] == 3 && pd[1] == 4);
  int nd32 = 0;
  const int *pd32 = NULL;
  EXPECT(MXNDArrayGetShapeEx(h, &nd32, &pd32) == 0);
  EXPECT(nd32 == 2 && pd32[0] == 3 && pd32[1] == 4);
  const int64_t *pd64 = NULL;
  EXPECT(MXNDArrayGetShapeEx64(h, &nd32, &pd64) == 0);
  EXPECT(nd32 == 2 && pd64[0] == 3 && pd64[1] == 4);
  /* the first buffer still holds its answer after the other calls */
  EXPECT(pd[0] == 3 && pd[1] == 4);

  uint32_t n = 0, nn = 0;
  NDArrayHandle *arrs = NULL;
  const char **names = NULL;
  EXPECT(MXNDArrayLoad(g_file, &n, &arrs, &nn, &names) == 0);
  EXPECT(n == 1 && nn == 1 && strcmp(names[0], "w") == 0);
  EXPECT(MXNDArrayGetShape(arrs[0], &nd, &pd) == 0 && nd == 2 && pd[0] == 3);
  EXPECT(MXNDArrayFree(arrs[0]) == 0);

  float buf[20];
  EXPECT(MXNDArraySyncCopyToCPU(h, buf, 20) == -1);
  const char *msg = MXGetLastError();
  EXPECT(msg != NULL && strstr(msg, "MXNDArraySyncCopyToCPU") != NULL);
  EXPECT(MXNDArrayFree(h) == 0);
  EXPECT(MXNDArrayFree(h) == -1);
  msg = MXGetLastError();
  EXPECT(strstr(msg, "MXNDArrayFree") != NULL && strstr(msg, "stale") != NULL);
  fprintf(stderr, "%s: calls after the thread-locals are gone OK\n", where);
}

/* The thread's body fills every per-thread buffer while it is alive. */
static NDArrayHandle touch_thread_locals(void) {
  uint32_t shape[2] = {3, 4}, nd = 0;
  const uint32_t *pd = NULL;
  NDArrayHandle h = make_f32_shape(shape, 2, NULL);
  CHECK_OK(MXNDArrayGetShape(h, &nd, &pd));
  int nd32 = 0;
  const int *pd32 = NULL;
  const int64_t *pd64 = NULL;
  CHECK_OK(MXNDArrayGetShapeEx(h, &nd32, &pd32));
  CHECK_OK(MXNDArrayGetShapeEx64(h, &nd32, &pd64));
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arrs = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(g_file, &n, &arrs, &nn, &names));
  CHECK_OK(MXNDArrayFree(arrs[0]));
  CHECK_ERR(MXNDArrayFree((NDArrayHandle)(uintptr_t)0x4e00000000001234ULL), "MXNDArrayFree");
  return h;
}

static pthread_key_t g_key;
static volatile int g_dtor_done;

static void key_dtor(void *h) {
  use_after_thread_locals(h, "thread exit");
  g_dtor_done = 1;
}

static void *thread_body(void *arg) {
  (void)arg;
  CHECK(pthread_setspecific(g_key, touch_thread_locals()) == 0);
  return NULL;
}

static NDArrayHandle g_main_handle;
static void at_exit(void) {
  use_after_thread_locals(g_main_handle, "exit()");
  unlink(g_file);
}

int main(void) {
  snprintf(g_file, sizeof g_file, "/tmp/mxkv_exit_calls_%d.params", (int)getpid());
  uint32_t shape[2] = {3, 4};
  NDArrayHandle w = make_f32_shape(shape, 2, NULL);
  const char *key = "w";
  CHECK_OK(MXNDArraySave(g_file, 1, &w, &key));
  CHECK_OK(MXNDArrayFree(w));

  CHECK(pthread_key_create(&g_key, key_dtor) == 0);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_body, NULL) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(g_dtor_done == 1);

  CHECK(atexit(at_exit) == 0);
  g_main_handle = touch_thread_locals();
  printf("test_exit_calls: thread part OK; the exit() part reports on stderr\n");
  return 0;
}
