/*
 * The thread's cancellation state around C API calls, and what it costs.
 * The library keeps cancellation off while it works (test_cancel.c) and
 * runs callbacks with the state its caller had (test_thread_exit.c cancels
 * inside an updater). Here, with pthread_setcancelstate interposed by this
 * program (the library's calls bind to it) to count the calls:
 *
 * - an updater sees its caller's state (enabled, or disabled), also after
 *   a C API call of its own, and the caller gets its state back after the
 *   push, also when the updater left cancellation on against its caller's
 *   "disabled";
 * - a push with an updater that frees its two handles makes at most 4 calls
 *   (off and back for the push, on and off around the updater; 8 before:
 *   each MXNDArrayFree inside made two more), at most 2 when the caller has
 *   cancellation disabled; the array getters and MXNDArrayFree make none (2
 *   each before), since their work reaches no cancellation point.
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"

#include <dlfcn.h>
#include <pthread.h>

static int (*real_setcancelstate)(int, int *);
static long calls;

int pthread_setcancelstate(int state, int *old) {
  calls++;
  return real_setcancelstate(state, old);
}

/* the calling thread's state, not counted */
static int cancel_state(void) {
  int old, off;
  CHECK(real_setcancelstate(PTHREAD_CANCEL_DISABLE, &old) == 0);
  CHECK(real_setcancelstate(old, &off) == 0);
  return old;
}

static int seen = -1, seen_after_call = -1, leave_enabled = 0;

static void upd(int key, NDArrayHandle recv, NDArrayHandle local, void *u) {
  (void)key;
  (void)u;
  seen = cancel_state();
  int dtype = -1;
  CHECK_OK(MXNDArrayGetDType(local, &dtype));
  float r[2];
  CHECK_OK(MXNDArraySyncCopyToCPU(recv, r, 2));
  seen_after_call = cancel_state();
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
  if (leave_enabled) {
    int old;
    CHECK(real_setcancelstate(PTHREAD_CANCEL_ENABLE, &old) == 0);
  }
}

static void free_only(int key, NDArrayHandle recv, NDArrayHandle local, void *u) {
  (void)key;
  (void)u;
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
}

int main(void) {
  /* (POSIX: dlsym gives functions through a void *) */
  *(void **)&real_setcancelstate = dlsym(RTLD_NEXT, "pthread_setcancelstate");
  CHECK(real_setcancelstate != NULL);
  CHECK(cancel_state() == PTHREAD_CANCEL_ENABLE);

  KVStoreHandle kv;
  CHECK_OK(MXKVStoreCreate("local", &kv));
  NDArrayHandle v = make_f32(2, (float[]){1, 2});
  int k = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &v));
  calls = 0;
  CHECK_OK(MXKVStorePush(kv, 1, &k, &v, 0));
  CHECK(calls > 0); /* the interposition works: the library's calls come here */

  /* the states */
  CHECK_OK(MXKVStoreSetUpdater(kv, upd, NULL));
  for (int caller = PTHREAD_CANCEL_ENABLE;; caller = PTHREAD_CANCEL_DISABLE) {
    int old;
    CHECK(real_setcancelstate(caller, &old) == 0);
    for (leave_enabled = 0; leave_enabled < 2; leave_enabled++) {
      seen = seen_after_call = -1;
      CHECK_OK(MXKVStorePush(kv, 1, &k, &v, 0));
      CHECK(seen == caller);
      CHECK(seen_after_call == caller);
      CHECK(cancel_state() == caller);
    }
    if (caller == PTHREAD_CANCEL_DISABLE) break;
  }
  int old;
  CHECK(real_setcancelstate(PTHREAD_CANCEL_ENABLE, &old) == 0);

  /* the calls */
  CHECK_OK(MXKVStoreSetUpdater(kv, free_only, NULL));
  enum { N = 100 };
  calls = 0;
  for (int i = 0; i < N; i++) CHECK_OK(MXKVStorePush(kv, 1, &k, &v, 0));
  printf("test_cancel_state: %.1f pthread_setcancelstate calls per push with an updater\n",
         (double)calls / N);
  CHECK(calls <= 4 * N);
  CHECK(real_setcancelstate(PTHREAD_CANCEL_DISABLE, &old) == 0);
  calls = 0;
  for (int i = 0; i < N; i++) CHECK_OK(MXKVStorePush(kv, 1, &k, &v, 0));
  CHECK(real_setcancelstate(PTHREAD_CANCEL_ENABLE, &old) == 0);
  CHECK(calls <= 2 * N);

  calls = 0;
  for (int i = 0; i < N; i++) {
    int dtype, dev_type, dev_id, stype;
    uint32_t ndim;
    const uint32_t *dims;
    CHECK_OK(MXNDArrayGetDType(v, &dtype));
    CHECK_OK(MXNDArrayGetShape(v, &ndim, &dims));
    CHECK_OK(MXNDArrayGetContext(v, &dev_type, &dev_id));
    CHECK_OK(MXNDArrayGetStorageType(v, &stype));
    CHECK(dtype == DT_F32 && ndim == 1 && dims[0] == 2 && dev_type == DEV_CPU && stype == 0);
    NDArrayHandle h;
    CHECK_OK(MXNDArrayCreateNone(&h));
    CHECK_OK(MXNDArrayFree(h));
  }
  CHECK(calls == 0);
  CHECK(cancel_state() == PTHREAD_CANCEL_ENABLE);

  CHECK_OK(MXNDArrayFree(v));
  CHECK_OK(MXKVStoreFree(kv));
  printf("test_cancel_state: OK\n");
  return 0;
}
