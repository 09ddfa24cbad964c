/*
 * Bad input through the C API. Every crash, hang and silent wrong answer of
 * MXNet 1.9.1 that README.md lists as deliberate deviations (and the other
 * bad input a caller can produce: NULL / stale / double-freed / foreign /
 * wrong-kind handles, NULL arrays and out-pointers, bad shapes, dtypes,
 * contexts, files) must give rc -1 and a message naming the function and the
 * argument — and the store must still work afterwards: after each bad call a
 * fresh key is initialised, pushed (three values, summed) and pulled.
 * Every handle made here is freed (checked with mxkv_live_handles).
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind). By hand,
 * after `make build` (which stages build/lib/libmxkv.so.0, the soname):
 *   gcc -std=c11 -Wall -Wextra -Wpedantic -Werror -D_GNU_SOURCE -Iinclude \
 *       ctests/test_bad_input.c -Lbuild/lib -lmxkv -Wl,-rpath,$PWD/build/lib \
 *       -lpthread -o /tmp/test_bad_input && /tmp/test_bad_input
 */
#include "check.h"

#include <limits.h>
#include <stdbool.h>
#include <unistd.h>

/* ------------------------------------------------------ "still works" */

static KVStoreHandle g_kv; /* the store the current case must leave working */
static bool g_kv_str;      /* it is string-keyed */
static int g_serial;       /* fresh key numbers */
static int g_bad_line;     /* the line of the last bad call */

#define SW_OK(call)                                                                      \
  do {                                                                                   \
    if ((call) != 0) {                                                                   \
      fprintf(stderr, "%s:%d: store broken after the bad call at line %d: %s: %s\n",      \
              __FILE__, __LINE__, g_bad_line, #call, MXGetLastError());                  \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Init a fresh key with [1.5, -2], push [1,2]+[10,20]+[100,200], pull 2 outputs. */
static void still_works(void) {
  const float iv[2] = {1.5f, -2}, a[2] = {1, 2}, b[2] = {10, 20}, c[2] = {100, 200};
  NDArrayHandle x = make_f32(2, iv), p0 = make_f32(2, a), p1 = make_f32(2, b),
                p2 = make_f32(2, c), o0 = make_f32(2, NULL), o1 = make_f32(2, NULL);
  NDArrayHandle pv[3] = {p0, p1, p2}, outs[2] = {o0, o1};
  int n = g_serial++;
  if (g_kv_str) {
    char name[32];
    snprintf(name, sizeof name, "ok-%d", n);
    const char *k1[1] = {name}, *k2[2] = {name, name}, *k3[3] = {name, name, name};
    SW_OK(MXKVStoreInitEx(g_kv, 1, k1, &x));
    SW_OK(MXKVStorePullEx(g_kv, 1, k1, &o0, 0));
    CHECK_F32(o0, 2, 1.5f, -2);
    SW_OK(MXKVStorePushEx(g_kv, 3, k3, pv, 0));
    SW_OK(MXKVStorePullEx(g_kv, 2, k2, outs, 0));
  } else {
    int key = 1000000 + n, k2[2] = {key, key}, k3[3] = {key, key, key};
    SW_OK(MXKVStoreInit(g_kv, 1, &key, &x));
    SW_OK(MXKVStorePull(g_kv, 1, &key, &o0, 0));
    CHECK_F32(o0, 2, 1.5f, -2);
    SW_OK(MXKVStorePush(g_kv, 3, k3, pv, 0));
    SW_OK(MXKVStorePull(g_kv, 2, k2, outs, 0));
  }
  CHECK_F32(o0, 2, 111, 222);
  CHECK_F32(o1, 2, 111, 222);
  NDArrayHandle all[6] = {x, p0, p1, p2, o0, o1};
  for (int i = 0; i < 6; i++) CHECK_OK(MXNDArrayFree(all[i]));
}

/* The bad call must fail with the message, then the store must still work. */
#define BAD(call, substr)        \
  do {                           \
    g_bad_line = __LINE__;       \
    CHECK_ERR(call, substr);     \
    still_works();               \
  } while (0)

static KVStoreHandle new_store(const char *type) {
  KVStoreHandle kv = NULL;
  CHECK_OK(MXKVStoreCreate(type, &kv));
  return kv;
}

static void use_store(KVStoreHandle kv, bool str) {
  g_kv = kv;
  g_kv_str = str;
}

static void free_all(NDArrayHandle *hs, size_t n) {
  for (size_t i = 0; i < n; i++) CHECK_OK(MXNDArrayFree(hs[i]));
}

/* ------------------------------------------- bad KVStoreHandle everywhere */

static void noop_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)key, (void)h;
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
}
static void noop_str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)key, (void)h;
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
}

/* Calls every KVStore entry point that takes a handle with `h`; each must
   fail with "<function>: KVStoreHandle <what>". */
static void sweep_kv_handle(KVStoreHandle h, const char *what) {
  char want[256];
#define KVBAD(fn, call)                                              \
  do {                                                               \
    snprintf(want, sizeof want, "%s: KVStoreHandle %s", fn, what);   \
    BAD(call, want);                                                 \
  } while (0)
  const float two[2] = {1, 2};
  NDArrayHandle v = make_f32(2, two), o = make_f32(2, NULL);
  int k = 1, r = 0;
  const char *sk[1] = {"a"}, *t = NULL;
  const char *gk[1] = {"type"}, *gv[1] = {"2bit"};
  KVBAD("MXKVStoreSetGradientCompression", MXKVStoreSetGradientCompression(h, 1, gk, gv));
  if (h != NULL) KVBAD("MXKVStoreFree", MXKVStoreFree(h));
  KVBAD("MXKVStoreInit", MXKVStoreInit(h, 1, &k, &v));
  KVBAD("MXKVStoreInitEx", MXKVStoreInitEx(h, 1, sk, &v));
  KVBAD("MXKVStorePush", MXKVStorePush(h, 1, &k, &v, 0));
  KVBAD("MXKVStorePushEx", MXKVStorePushEx(h, 1, sk, &v, 0));
  KVBAD("MXKVStorePull", MXKVStorePull(h, 1, &k, &o, 0));
  KVBAD("MXKVStorePullEx", MXKVStorePullEx(h, 1, sk, &o, 0));
  KVBAD("MXKVStorePullWithSparse", MXKVStorePullWithSparse(h, 1, &k, &o, 0, true));
  KVBAD("MXKVStorePullWithSparseEx", MXKVStorePullWithSparseEx(h, 1, sk, &o, 0, false));
  KVBAD("MXKVStorePullRowSparse", MXKVStorePullRowSparse(h, 1, &k, &o, &v, 0));
  KVBAD("MXKVStorePullRowSparseEx", MXKVStorePullRowSparseEx(h, 1, sk, &o, &v, 0));
  KVBAD("MXKVStoreBroadcast", MXKVStoreBroadcast(h, 1, &k, 1, &k, &v, &o, 0));
  KVBAD("MXKVStoreBroadcastEx", MXKVStoreBroadcastEx(h, 1, sk, 1, sk, &v, &o, 0));
  KVBAD("MXKVStorePushPull", MXKVStorePushPull(h, 1, &k, 1, &k, &v, &o, 0));
  KVBAD("MXKVStorePushPullEx", MXKVStorePushPullEx(h, 1, sk, 1, sk, &v, &o, 0));
  KVBAD("MXKVStoreSetUpdater", MXKVStoreSetUpdater(h, noop_updater, NULL));
  KVBAD("MXKVStoreSetUpdaterEx", MXKVStoreSetUpdaterEx(h, noop_updater, noop_str_updater, NULL));
  KVBAD("MXKVStoreGetType", MXKVStoreGetType(h, &t));
  KVBAD("MXKVStoreGetRank", MXKVStoreGetRank(h, &r));
  KVBAD("MXKVStoreGetGroupSize", MXKVStoreGetGroupSize(h, &r));
  KVBAD("MXKVStoreBarrier", MXKVStoreBarrier(h));
  KVBAD("MXKVStoreSetBarrierBeforeExit", MXKVStoreSetBarrierBeforeExit(h, 1));
  KVBAD("MXKVStoreRunServer", MXKVStoreRunServer(h, NULL, NULL));
  KVBAD("MXKVStoreSendCommmandToServers", MXKVStoreSendCommmandToServers(h, 0, ""));
  KVBAD("MXKVStoreGetNumDeadNode", MXKVStoreGetNumDeadNode(h, 1, &r, 60));
  CHECK(t == NULL);
  CHECK_F32(o, 2, 0, 0);
  CHECK_F32(v, 2, 1, 2);
  CHECK_OK(MXNDArrayFree(v));
  CHECK_OK(MXNDArrayFree(o));
#undef KVBAD
}

static void test_bad_kv_handles(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  live_t start = live_now();

  sweep_kv_handle(NULL, "is NULL");
  CHECK_OK(MXKVStoreFree(NULL));

  KVStoreHandle dead = new_store("local");
  CHECK_OK(MXKVStoreFree(dead));
  sweep_kv_handle(dead, "is stale (already freed?)");
  BAD(MXKVStoreFree(dead), "MXKVStoreFree: KVStoreHandle is stale"); /* double free */

  /* the freed slot is reused by a new store: the old handle stays stale */
  KVStoreHandle reuse = new_store("device");
  BAD(MXKVStoreFree(dead), "is stale");
  const char *t = NULL;
  CHECK_OK(MXKVStoreGetType(reuse, &t));
  CHECK(strcmp(t, "device") == 0);

  int on_stack = 42;
  sweep_kv_handle(&on_stack, "is not a handle of this kind");
  BAD(MXKVStoreFree(&on_stack), "MXKVStoreFree: KVStoreHandle is not a handle of this kind");
  CHECK(on_stack == 42);

  unsigned char *heap = malloc(64);
  CHECK(heap != NULL);
  memset(heap, 0xAB, 64);
  sweep_kv_handle(heap, "is not a handle of this kind");
  BAD(MXKVStoreFree(heap), "is not a handle of this kind");
  for (int i = 0; i < 64; i++) CHECK(heap[i] == 0xAB);
  free(heap);

  /* an NDArrayHandle where a KVStoreHandle belongs: refused, the array survives */
  const float one = 1;
  NDArrayHandle nd = make_f32(1, &one);
  sweep_kv_handle(nd, "is not a handle of this kind");
  BAD(MXKVStoreFree(nd), "MXKVStoreFree: KVStoreHandle is not a handle of this kind");
  CHECK_F32(nd, 1, 1);

  /* forged values */
  sweep_kv_handle((void *)(uintptr_t)UINTPTR_MAX, "");
  sweep_kv_handle((void *)(uintptr_t)1, "");
  sweep_kv_handle((void *)(uintptr_t)0x4b000001ffffffffull, "");
  sweep_kv_handle((void *)(uintptr_t)0x4b00000000000000ull, "");

  /* a KVStoreHandle where an NDArrayHandle belongs */
  BAD(MXNDArrayFree(kv), "MXNDArrayFree: handle (NDArrayHandle) is not a handle of this kind");
  int k = 5;
  BAD(MXKVStoreInit(kv, 1, &k, &kv), "MXKVStoreInit: vals[0] (NDArrayHandle) is not a handle");

  CHECK_OK(MXNDArrayFree(nd));
  CHECK_OK(MXKVStoreFree(reuse));
  CHECK_OK(MXKVStoreFree(kv));
  start.kvstores--;
  CHECK_LIVE(start);
}

/* ------------------------------------------- bad NDArrayHandle everywhere */

static void sweep_nd_handle(NDArrayHandle h, const char *what) {
  char want[256];
#define NDBAD(fn, arg, call)                                                   \
  do {                                                                         \
    snprintf(want, sizeof want, "%s: %s (NDArrayHandle) %s", fn, arg, what);   \
    BAD(call, want);                                                           \
  } while (0)
  const float two[2] = {1, 2};
  NDArrayHandle good = make_f32(2, two), out = NULL;
  float buf[2] = {7, 7};
  uint32_t ndim = 9;
  const uint32_t *pd = NULL;
  int indim = 9, dt = 9, dev = 9, id = 9, st = 9;
  const int *ipd = NULL;
  const int64_t *lpd = NULL;
  void *p = NULL;
  NDBAD("MXNDArraySyncCopyFromCPU", "handle", MXNDArraySyncCopyFromCPU(h, buf, 2));
  NDBAD("MXNDArraySyncCopyToCPU", "handle", MXNDArraySyncCopyToCPU(h, buf, 2));
  NDBAD("MXNDArraySyncCopyFromNDArray", "handle_dst", MXNDArraySyncCopyFromNDArray(h, good, -1));
  NDBAD("MXNDArraySyncCopyFromNDArray", "handle_src", MXNDArraySyncCopyFromNDArray(good, h, -1));
  NDBAD("MXNDArrayGetShape", "handle", MXNDArrayGetShape(h, &ndim, &pd));
  NDBAD("MXNDArrayGetShapeEx", "handle", MXNDArrayGetShapeEx(h, &indim, &ipd));
  NDBAD("MXNDArrayGetShapeEx64", "handle", MXNDArrayGetShapeEx64(h, &indim, &lpd));
  NDBAD("MXNDArrayGetDType", "handle", MXNDArrayGetDType(h, &dt));
  NDBAD("MXNDArrayGetContext", "handle", MXNDArrayGetContext(h, &dev, &id));
  NDBAD("MXNDArrayGetStorageType", "handle", MXNDArrayGetStorageType(h, &st));
  NDBAD("MXNDArrayGetData", "handle", MXNDArrayGetData(h, &p));
  NDBAD("MXNDArrayWaitToRead", "handle", MXNDArrayWaitToRead(h));
  NDBAD("MXNDArrayWaitToWrite", "handle", MXNDArrayWaitToWrite(h));
  NDBAD("MXNDArrayGetAuxType", "handle", MXNDArrayGetAuxType(h, 0, &dt));
  NDBAD("MXNDArrayGetAuxNDArray", "handle", MXNDArrayGetAuxNDArray(h, 0, &out));
  NDBAD("MXNDArrayGetDataNDArray", "handle", MXNDArrayGetDataNDArray(h, &out));
  if (h != NULL) NDBAD("MXNDArrayFree", "handle", MXNDArrayFree(h));
  {
    char path[] = "/tmp/mxkv_bad_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    NDBAD("MXNDArraySave", "args[1]", MXNDArraySave(path, 2, (NDArrayHandle[]){good, h}, NULL));
    unlink(path);
  }
  /* ... and inside the arrays of the KVStore calls */
  int k2[2] = {77, 77};
  const char *s2[2] = {"x", "x"};
  NDArrayHandle vals[2] = {good, h};
  if (g_kv_str) {
    NDBAD("MXKVStoreInitEx", "vals[1]", MXKVStoreInitEx(g_kv, 2, (const char *[]){"x", "y"}, vals));
    NDBAD("MXKVStorePushEx", "vals[1]", MXKVStorePushEx(g_kv, 2, s2, vals, 0));
    NDBAD("MXKVStorePullEx", "vals[1]", MXKVStorePullEx(g_kv, 2, s2, vals, 0));
    NDBAD("MXKVStorePullWithSparseEx", "vals[1]", MXKVStorePullWithSparseEx(g_kv, 2, s2, vals, 0, 0));
    NDBAD("MXKVStorePullRowSparseEx", "row_ids[1]",
          MXKVStorePullRowSparseEx(g_kv, 2, s2, (NDArrayHandle[]){good, good}, vals, 0));
    NDBAD("MXKVStoreBroadcastEx", "vals[1]",
          MXKVStoreBroadcastEx(g_kv, 2, (const char *[]){"x", "y"}, 0, NULL, vals, NULL, 0));
    NDBAD("MXKVStoreBroadcastEx", "outs[1]",
          MXKVStoreBroadcastEx(g_kv, 1, s2, 2, s2, &good, vals, 0));
    NDBAD("MXKVStorePushPullEx", "vals[1]", MXKVStorePushPullEx(g_kv, 2, s2, 0, NULL, vals, NULL, 0));
    NDBAD("MXKVStorePushPullEx", "outs[1]", MXKVStorePushPullEx(g_kv, 0, NULL, 2, s2, NULL, vals, 0));
  } else {
    NDBAD("MXKVStoreInit", "vals[1]", MXKVStoreInit(g_kv, 2, (int[]){77, 78}, vals));
    NDBAD("MXKVStorePush", "vals[1]", MXKVStorePush(g_kv, 2, k2, vals, 0));
    NDBAD("MXKVStorePull", "vals[1]", MXKVStorePull(g_kv, 2, k2, vals, 0));
    NDBAD("MXKVStorePullWithSparse", "vals[1]", MXKVStorePullWithSparse(g_kv, 2, k2, vals, 0, 1));
    NDBAD("MXKVStorePullRowSparse", "vals[1]",
          MXKVStorePullRowSparse(g_kv, 2, k2, vals, (NDArrayHandle[]){good, good}, 0));
    NDBAD("MXKVStoreBroadcast", "vals[1]",
          MXKVStoreBroadcast(g_kv, 2, (int[]){77, 78}, 0, NULL, vals, NULL, 0));
    NDBAD("MXKVStoreBroadcast", "outs[1]", MXKVStoreBroadcast(g_kv, 1, k2, 2, k2, &good, vals, 0));
    NDBAD("MXKVStorePushPull", "vals[1]", MXKVStorePushPull(g_kv, 2, k2, 0, NULL, vals, NULL, 0));
    NDBAD("MXKVStorePushPull", "outs[1]", MXKVStorePushPull(g_kv, 0, NULL, 2, k2, NULL, vals, 0));
  }
  /* nothing was written, nothing was made */
  CHECK(buf[0] == 7 && ndim == 9 && indim == 9 && dt == 9 && dev == 9 && st == 9);
  CHECK(pd == NULL && ipd == NULL && lpd == NULL && p == NULL && out == NULL);
  CHECK_F32(good, 2, 1, 2);
  CHECK_OK(MXNDArrayFree(good));
#undef NDBAD
}

static void test_bad_nd_handles(void) {
  for (int str = 0; str < 2; str++) {
    KVStoreHandle kv = new_store("local");
    use_store(kv, str);
    live_t start = live_now();
    sweep_nd_handle(NULL, "is NULL");
    CHECK_OK(MXNDArrayFree(NULL));

    const float one = 1;
    NDArrayHandle dead = make_f32(1, &one);
    CHECK_OK(MXNDArrayFree(dead));
    sweep_nd_handle(dead, "is stale (already freed?)");
    BAD(MXNDArrayFree(dead), "MXNDArrayFree: handle (NDArrayHandle) is stale"); /* double free */
    /* the slot is reused: the old handle stays stale, the new one works */
    NDArrayHandle fresh = make_f32(1, &one);
    BAD(MXNDArrayFree(dead), "is stale");
    CHECK_F32(fresh, 1, 1);
    CHECK_OK(MXNDArrayFree(fresh));

    double on_stack = 3.5;
    sweep_nd_handle(&on_stack, "is not a handle of this kind");
    CHECK(on_stack == 3.5);
    void *heap = calloc(1, 128);
    CHECK(heap != NULL);
    sweep_nd_handle(heap, "is not a handle of this kind");
    BAD(MXNDArrayFree(heap), "is not a handle of this kind");
    free(heap);
    KVStoreHandle other = new_store("local");
    sweep_nd_handle(other, "is not a handle of this kind");
    const char *t = NULL;
    CHECK_OK(MXKVStoreGetType(other, &t)); /* survived MXNDArrayFree(other) */
    CHECK_OK(MXKVStoreFree(other));
    sweep_nd_handle((void *)(uintptr_t)UINTPTR_MAX, "");
    sweep_nd_handle((void *)(uintptr_t)0x4e000001ffffffffull, "");
    sweep_nd_handle((void *)(uintptr_t)0x4e00000000000000ull, "");
    CHECK_OK(MXKVStoreFree(kv));
    start.kvstores--;
    CHECK_LIVE(start);
  }
}

/* ---------------------------------------- NULL arrays, elements, outputs */

static void test_null_arrays(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  const float two[2] = {1, 2};
  NDArrayHandle v = make_f32(2, two), o = make_f32(2, NULL);
  NDArrayHandle v2[2] = {v, v}, o2[2] = {o, o};
  int k2[2] = {1, 1};
  live_t start = live_now();

  BAD(MXKVStoreInit(kv, 2, NULL, v2), "MXKVStoreInit: keys is NULL but 2 items were announced");
  BAD(MXKVStoreInit(kv, 2, k2, NULL), "MXKVStoreInit: vals is NULL but 2 items were announced");
  BAD(MXKVStorePush(kv, 2, NULL, v2, 0), "MXKVStorePush: keys is NULL but 2 items were announced");
  BAD(MXKVStorePush(kv, 2, k2, NULL, 0), "MXKVStorePush: vals is NULL but 2 items were announced");
  BAD(MXKVStorePull(kv, 2, NULL, o2, 0), "MXKVStorePull: keys is NULL but 2 items");
  BAD(MXKVStorePull(kv, 2, k2, NULL, 0), "MXKVStorePull: vals is NULL but 2 items");
  BAD(MXKVStorePullWithSparse(kv, 1, NULL, o2, 0, 0), "MXKVStorePullWithSparse: keys is NULL");
  BAD(MXKVStorePullRowSparse(kv, 1, k2, o2, NULL, 0), "MXKVStorePullRowSparse: row_ids is NULL");
  BAD(MXKVStorePullRowSparse(kv, 1, k2, NULL, v2, 0), "MXKVStorePullRowSparse: vals is NULL");
  BAD(MXKVStoreBroadcast(kv, 1, NULL, 0, NULL, v2, NULL, 0), "MXKVStoreBroadcast: vkeys is NULL");
  BAD(MXKVStoreBroadcast(kv, 1, (int[]){50}, 1, NULL, v2, o2, 0), "MXKVStoreBroadcast: okeys is NULL");
  BAD(MXKVStoreBroadcast(kv, 1, (int[]){50}, 1, (int[]){50}, NULL, o2, 0),
      "MXKVStoreBroadcast: vals is NULL");
  BAD(MXKVStoreBroadcast(kv, 1, (int[]){50}, 1, (int[]){50}, v2, NULL, 0),
      "MXKVStoreBroadcast: outs is NULL");
  BAD(MXKVStorePushPull(kv, 2, NULL, 0, NULL, v2, NULL, 0), "MXKVStorePushPull: vkeys is NULL but 2");
  BAD(MXKVStorePushPull(kv, 0, NULL, 2, NULL, NULL, o2, 0), "MXKVStorePushPull: okeys is NULL but 2");
  BAD(MXKVStorePushPull(kv, 2, k2, 0, NULL, NULL, NULL, 0), "MXKVStorePushPull: vals is NULL");
  BAD(MXKVStorePushPull(kv, 0, NULL, 2, k2, NULL, NULL, 0), "MXKVStorePushPull: outs is NULL");
  BAD(MXKVStoreInit(kv, 2, k2, (NDArrayHandle[]){v, NULL}),
      "MXKVStoreInit: vals[1] (NDArrayHandle) is NULL");
  BAD(MXKVStorePush(kv, 2, k2, (NDArrayHandle[]){v, NULL}, 0),
      "MXKVStorePush: vals[1] (NDArrayHandle) is NULL");
  BAD(MXKVStorePull(kv, 2, k2, (NDArrayHandle[]){NULL, o}, 0),
      "MXKVStorePull: vals[0] (NDArrayHandle) is NULL");
  BAD(MXKVStoreSetGradientCompression(kv, 1, NULL, (const char *[]){"2bit"}),
      "MXKVStoreSetGradientCompression: keys is NULL but 1 items");
  BAD(MXKVStoreSetGradientCompression(kv, 1, (const char *[]){"type"}, (const char *[]){NULL}),
      "MXKVStoreSetGradientCompression: vals[0] is NULL");
  BAD(MXKVStoreSendCommmandToServers(kv, 0, NULL), "MXKVStoreSendCommmandToServers: cmd_body is NULL");

  /* out-pointers */
  int r = 0;
  BAD(MXKVStoreGetType(kv, NULL), "MXKVStoreGetType: type (output pointer) is NULL");
  BAD(MXKVStoreGetRank(kv, NULL), "MXKVStoreGetRank: ret (output pointer) is NULL");
  BAD(MXKVStoreGetGroupSize(kv, NULL), "MXKVStoreGetGroupSize: ret (output pointer) is NULL");
  BAD(MXKVStoreGetNumDeadNode(kv, 1, NULL, 60), "MXKVStoreGetNumDeadNode: number (output pointer) is NULL");
  BAD(MXKVStoreIsWorkerNode(NULL), "MXKVStoreIsWorkerNode: ret (output pointer) is NULL");
  BAD(MXKVStoreIsServerNode(NULL), "MXKVStoreIsServerNode: ret (output pointer) is NULL");
  BAD(MXKVStoreIsSchedulerNode(NULL), "MXKVStoreIsSchedulerNode: ret (output pointer) is NULL");
  BAD(MXGetVersion(NULL), "MXGetVersion: out (output pointer) is NULL");
  BAD(MXKVStoreCreate("local", NULL), "MXKVStoreCreate: out (output pointer) is NULL");
  BAD(MXKVStoreCreate(NULL, &g_kv), "MXKVStoreCreate: type is NULL");
  CHECK(g_kv == kv);
  CHECK_OK(mxkv_live_handles(NULL, NULL));
  CHECK_OK(mxkv_live_handles(&r, NULL));

  uint32_t s2 = 2;
  int64_t s2l = 2;
  BAD(MXNDArrayCreateNone(NULL), "MXNDArrayCreateNone: out (output pointer) is NULL");
  BAD(MXNDArrayCreate(&s2, 1, DEV_CPU, 0, 0, NULL), "MXNDArrayCreate: out (output pointer) is NULL");
  BAD(MXNDArrayCreateEx(&s2, 1, DEV_CPU, 0, 0, DT_F32, NULL), "MXNDArrayCreateEx: out (output pointer) is NULL");
  BAD(MXNDArrayCreateEx64(&s2l, 1, DEV_CPU, 0, 0, DT_F32, NULL),
      "MXNDArrayCreateEx64: out (output pointer) is NULL");
  NDArrayHandle h = NULL;
  BAD(MXNDArrayCreate(NULL, 2, DEV_CPU, 0, 0, &h), "MXNDArrayCreate: shape is NULL but 2 items");
  BAD(MXNDArrayCreateEx(NULL, 1, DEV_CPU, 0, 0, DT_F32, &h), "MXNDArrayCreateEx: shape is NULL");
  BAD(MXNDArrayCreateEx64(NULL, 1, DEV_CPU, 0, 0, DT_F32, &h), "MXNDArrayCreateEx64: shape is NULL");
  CHECK(h == NULL);
  uint32_t ndim = 0;
  const uint32_t *pd = NULL;
  int indim = 0;
  const int *ipd = NULL;
  const int64_t *lpd = NULL;
  BAD(MXNDArrayGetShape(v, NULL, &pd), "MXNDArrayGetShape: out_dim or out_pdata (output pointer) is NULL");
  BAD(MXNDArrayGetShape(v, &ndim, NULL), "MXNDArrayGetShape: out_dim or out_pdata");
  BAD(MXNDArrayGetShapeEx(v, NULL, &ipd), "MXNDArrayGetShapeEx: out_dim or out_pdata");
  BAD(MXNDArrayGetShapeEx(v, &indim, NULL), "MXNDArrayGetShapeEx: out_dim or out_pdata");
  BAD(MXNDArrayGetShapeEx64(v, NULL, &lpd), "MXNDArrayGetShapeEx64: out_dim or out_pdata");
  BAD(MXNDArrayGetShapeEx64(v, &indim, NULL), "MXNDArrayGetShapeEx64: out_dim or out_pdata");
  BAD(MXNDArrayGetDType(v, NULL), "MXNDArrayGetDType: out_dtype (output pointer) is NULL");
  BAD(MXNDArrayGetContext(v, NULL, &r), "MXNDArrayGetContext: out_dev_type or out_dev_id");
  BAD(MXNDArrayGetContext(v, &r, NULL), "MXNDArrayGetContext: out_dev_type or out_dev_id");
  BAD(MXNDArrayGetStorageType(v, NULL), "MXNDArrayGetStorageType: out_storage_type (output pointer)");
  BAD(MXNDArrayGetData(v, NULL), "MXNDArrayGetData: out_pdata (output pointer) is NULL");
  BAD(MXNDArrayGetDataNDArray(v, NULL), "MXNDArrayGetDataNDArray: out (output pointer) is NULL");
  BAD(MXNDArraySyncCopyFromCPU(v, NULL, 2), "MXNDArraySyncCopyFromCPU: data is NULL");
  BAD(MXNDArraySyncCopyToCPU(v, NULL, 2), "MXNDArraySyncCopyToCPU: data is NULL");
  BAD(MXInitPSEnv(1, NULL, (const char *[]){"x"}), "MXInitPSEnv: keys is NULL but 1 items");
  BAD(MXInitPSEnv(1, (const char *[]){"DMLC_ROLE"}, NULL), "MXInitPSEnv: vals is NULL but 1 items");
  BAD(MXInitPSEnv(1, (const char *[]){"DMLC_ROLE"}, (const char *[]){NULL}), "MXInitPSEnv: vals[0] is NULL");
  CHECK_OK(MXKVStoreIsWorkerNode(&r)); /* the failed calls recorded nothing */
  CHECK(r == 1);

  /* Save/Load arguments */
  char path[] = "/tmp/mxkv_bad_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  BAD(MXNDArraySave(NULL, 1, &v, NULL), "MXNDArraySave: fname is NULL");
  BAD(MXNDArraySave(path, 2, NULL, NULL), "MXNDArraySave: args is NULL but 2 items");
  BAD(MXNDArraySave(path, 2, v2, (const char *[]){"a", NULL}), "MXNDArraySave: keys[1] is NULL");
  CHECK_OK(MXNDArraySave(path, 1, &v, (const char *[]){"v"}));
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  BAD(MXNDArrayLoad(NULL, &n, &arr, &nn, &names), "MXNDArrayLoad: fname is NULL");
  BAD(MXNDArrayLoad(path, NULL, &arr, &nn, &names), "MXNDArrayLoad: an output pointer is NULL");
  BAD(MXNDArrayLoad(path, &n, NULL, &nn, &names), "MXNDArrayLoad: an output pointer is NULL");
  BAD(MXNDArrayLoad(path, &n, &arr, NULL, &names), "MXNDArrayLoad: an output pointer is NULL");
  BAD(MXNDArrayLoad(path, &n, &arr, &nn, NULL), "MXNDArrayLoad: an output pointer is NULL");
  CHECK(arr == NULL && n == 0);
  unlink(path);

  /* string keys: NULL array, NULL element */
  KVStoreHandle skv = new_store("local");
  use_store(skv, true);
  const char *sk[2] = {"a", NULL};
  BAD(MXKVStoreInitEx(skv, 2, NULL, v2), "MXKVStoreInitEx: keys is NULL but 2 items were announced");
  BAD(MXKVStoreInitEx(skv, 2, sk, v2), "MXKVStoreInitEx: keys[1] is NULL");
  BAD(MXKVStorePushEx(skv, 2, sk, v2, 0), "MXKVStorePushEx: keys[1] is NULL");
  BAD(MXKVStorePullEx(skv, 2, sk, o2, 0), "MXKVStorePullEx: keys[1] is NULL");
  BAD(MXKVStorePullWithSparseEx(skv, 2, sk, o2, 0, 1), "MXKVStorePullWithSparseEx: keys[1] is NULL");
  BAD(MXKVStorePullRowSparseEx(skv, 2, sk, o2, v2, 0), "MXKVStorePullRowSparseEx: keys[1] is NULL");
  BAD(MXKVStoreBroadcastEx(skv, 2, sk, 0, NULL, v2, NULL, 0), "MXKVStoreBroadcastEx: vkeys[1] is NULL");
  BAD(MXKVStoreBroadcastEx(skv, 1, sk, 2, sk, v2, o2, 0), "MXKVStoreBroadcastEx: okeys[1] is NULL");
  BAD(MXKVStorePushPullEx(skv, 2, sk, 0, NULL, v2, NULL, 0), "MXKVStorePushPullEx: vkeys[1] is NULL");
  BAD(MXKVStorePushPullEx(skv, 0, NULL, 2, sk, NULL, o2, 0), "MXKVStorePushPullEx: okeys[1] is NULL");
  BAD(MXKVStorePushPullEx(skv, 0, NULL, 2, NULL, NULL, o2, 0), "MXKVStorePushPullEx: okeys is NULL");
  /* "a" was never initialised by the failing calls */
  BAD(MXKVStorePullEx(skv, 1, sk, &o, 0), "key a doesn't exist. Did you init?");
  CHECK_OK(MXKVStoreInitEx(skv, 1, sk, &v));
  CHECK_PULL_EX(skv, "a", 2, 1, 2);

  CHECK_F32(o, 2, 0, 0);
  CHECK_OK(MXKVStoreFree(skv));
  CHECK_OK(MXKVStoreFree(kv));
  start.kvstores--;
  CHECK_LIVE(start);
  CHECK_OK(MXNDArrayFree(v));
  CHECK_OK(MXNDArrayFree(o));
}

/* ----------------------------------------------------- §14.2, §14.9 */

static int g_upd_calls;
static void assign_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)key, (void)h;
  g_upd_calls++;
  CHECK_OK(MXNDArraySyncCopyFromNDArray(local, recv, -1));
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void test_uninitialised_keys(const char *type) {
  KVStoreHandle kv = new_store(type);
  use_store(kv, false);
  const float a[2] = {1, 2}, b[2] = {3, 4};
  NDArrayHandle x = make_f32(2, a), y = make_f32(2, b), o = make_f32(2, NULL);
  int k1 = 1, k99 = 99;
  CHECK_OK(MXKVStoreInit(kv, 1, &k1, &x));

  /* ≥2 values on an uninitialised key: MXNet segfaults (local) */
  BAD(MXKVStorePush(kv, 2, (int[]){99, 99}, (NDArrayHandle[]){x, y}, 0),
      "MXKVStorePush: key 99 has not been inited");
  BAD(MXKVStorePush(kv, 5, (int[]){99, 99, 99, 99, 99}, (NDArrayHandle[]){x, y, x, y, x}, 0),
      "key 99 has not been inited");
  BAD(MXKVStorePushPull(kv, 2, (int[]){99, 99}, 1, &k1, (NDArrayHandle[]){x, y}, &o, 0),
      "MXKVStorePushPull: key 99 has not been inited");
  /* one value: MXNet says "Check failed: !is_none(): " and leaves a placeholder */
  BAD(MXKVStorePush(kv, 1, &k99, &x, 0), "MXKVStorePush: key 99 has not been inited");
  BAD(MXKVStorePull(kv, 1, &k99, &o, 0), "MXKVStorePull: key 99 has not been inited");
  BAD(MXKVStorePushPull(kv, 1, &k1, 1, &k99, &y, &o, 0), "key 99 has not been inited");
  /* a mixed call changes nothing: key 1 keeps its value */
  BAD(MXKVStorePush(kv, 3, (int[]){1, 99, 1}, (NDArrayHandle[]){y, y, y}, 0), "key 99 has not been inited");
  CHECK_PULL(kv, 1, 2, 1, 2);
  /* and a failing pull writes no output */
  const float sentinel[2] = {-5, -5};
  NDArrayHandle s = make_f32(2, sentinel);
  BAD(MXKVStorePull(kv, 2, (int[]){1, 99}, (NDArrayHandle[]){s, o}, 0), "key 99 has not been inited");
  CHECK_F32(s, 2, -5, -5);
  CHECK_F32(o, 2, 0, 0);

  /* with an updater set */
  g_upd_calls = 0;
  CHECK_OK(MXKVStoreSetUpdater(kv, assign_updater, NULL));
  BAD(MXKVStorePush(kv, 1, &k99, &x, 0), "key 99 has not been inited");
  BAD(MXKVStorePush(kv, 2, (int[]){99, 99}, (NDArrayHandle[]){x, y}, 0), "key 99 has not been inited");
  CHECK(g_upd_calls == 2); /* only the two pushes of still_works() reached it */
  /* no placeholder was left: 99 can be initialised now */
  CHECK_OK(MXKVStoreInit(kv, 1, &k99, &y));
  CHECK_PULL(kv, 99, 2, 3, 4);
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){99, 99}, (NDArrayHandle[]){x, y}, 0));
  CHECK_PULL(kv, 99, 2, 4, 6);

  NDArrayHandle hs[4] = {x, y, o, s};
  free_all(hs, 4);
  CHECK_OK(MXKVStoreFree(kv));
}

/* ----------------------------------------------------------- §14.3 */

static int g_upd_a, g_upd_b;
static void updater_a(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  g_upd_a++;
  assign_updater(key, recv, local, h);
  g_upd_calls--;
}
static void updater_b(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  g_upd_b++;
  assign_updater(key, recv, local, h);
  g_upd_calls--;
}

static void test_null_updaters(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  BAD(MXKVStoreSetUpdater(kv, NULL, NULL), "MXKVStoreSetUpdater: updater is NULL");
  BAD(MXKVStoreSetUpdaterEx(kv, NULL, noop_str_updater, NULL), "MXKVStoreSetUpdaterEx: updater is NULL");
  BAD(MXKVStoreSetUpdaterEx(kv, NULL, NULL, NULL), "MXKVStoreSetUpdaterEx: updater is NULL");
  /* a failing SetUpdater keeps the earlier updater */
  g_upd_a = g_upd_b = 0;
  CHECK_OK(MXKVStoreSetUpdater(kv, updater_a, NULL));
  BAD(MXKVStoreSetUpdater(kv, NULL, (void *)1), "updater is NULL");
  CHECK(g_upd_a == 1); /* still_works pushed once, through updater_a */
  BAD(MXKVStoreSetUpdaterEx(kv, NULL, noop_str_updater, NULL), "updater is NULL");
  CHECK(g_upd_a == 2);
  CHECK_OK(MXKVStoreSetUpdater(kv, updater_b, NULL));
  still_works();
  CHECK(g_upd_a == 2 && g_upd_b == 1);
  CHECK_OK(MXKVStoreFree(kv));

  /* SetUpdaterEx with a NULL string updater on a string store: ids reach the int updater */
  kv = new_store("local");
  use_store(kv, true);
  g_upd_a = 0;
  CHECK_OK(MXKVStoreSetUpdaterEx(kv, updater_a, NULL, NULL));
  still_works();
  CHECK(g_upd_a == 1);
  CHECK_OK(MXKVStoreFree(kv));
}

/* ------------------------------------------ §14.5, §14.6, §14.7: push checks */

static void test_push_checks(const char *type) {
  KVStoreHandle kv = new_store(type);
  use_store(kv, false);
  const float a3[3] = {1, 2, 3}, b3[3] = {10, 20, 30}, b2[2] = {7, 8};
  uint32_t s13[2] = {1, 3};
  NDArrayHandle x = make_f32(3, a3), y = make_f32(3, b3), w2 = make_f32(2, b2);
  NDArrayHandle row = make_f32_shape(s13, 2, b3);
  NDArrayHandle o = make_f32(3, NULL), o2 = make_f32(2, NULL);
  const double d3[3] = {1, 2, 3};
  NDArrayHandle dx = make_typed(3, DT_F64, d3);
  int k = 3, kk[2] = {3, 3};
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &x));

  /* §14.5: one value of another shape or dtype: MXNet silently replaces the key */
  BAD(MXKVStorePush(kv, 1, &k, &w2, 0), "MXKVStorePush: operands shape mismatch");
  BAD(MXKVStorePush(kv, 1, &k, &row, 0), "shape mismatch");
  BAD(MXKVStorePush(kv, 1, &k, &dx, 0), "MXKVStorePush: dtype mismatch");
  CHECK_PULL(kv, 3, 3, 1, 2, 3);
  BAD(MXKVStorePull(kv, 1, &k, &o2, 0), "MXKVStorePull: operands shape mismatch");
  BAD(MXKVStorePull(kv, 1, &k, &row, 0), "shape mismatch");
  CHECK_F32(row, 3, 10, 20, 30);
  /* ≥2 values */
  BAD(MXKVStorePush(kv, 2, kk, (NDArrayHandle[]){y, w2}, 0), "shape mismatch");
  BAD(MXKVStorePush(kv, 2, kk, (NDArrayHandle[]){w2, y}, 0), "shape mismatch");
  /* §14.6: the first of several values has another dtype: MXNet loses the sum */
  BAD(MXKVStorePush(kv, 2, kk, (NDArrayHandle[]){dx, y}, 0), "dtype mismatch");
  BAD(MXKVStorePushPull(kv, 2, kk, 1, &k, (NDArrayHandle[]){dx, y}, &o, 0), "dtype mismatch");
  CHECK_PULL(kv, 3, 3, 1, 2, 3);
  /* a later value of another dtype is converted and summed */
  CHECK_OK(MXKVStorePush(kv, 2, kk, (NDArrayHandle[]){y, dx}, 0));
  CHECK_PULL(kv, 3, 3, 11, 22, 33);
  /* a bad group in a multi-key push changes no key */
  int k4 = 4;
  CHECK_OK(MXKVStoreInit(kv, 1, &k4, &y));
  BAD(MXKVStorePush(kv, 3, (int[]){3, 4, 4}, (NDArrayHandle[]){x, y, w2}, 0), "shape mismatch");
  CHECK_PULL(kv, 3, 3, 11, 22, 33);
  CHECK_PULL(kv, 4, 3, 10, 20, 30);

  /* §14.5: a single-value push copies: later writes to the caller's array do not leak in */
  CHECK_OK(MXKVStorePush(kv, 1, &k, &y, 0));
  CHECK_OK(MXNDArraySyncCopyFromCPU(y, a3, 3));
  CHECK_PULL(kv, 3, 3, 10, 20, 30);
  void *p = NULL;
  CHECK_OK(MXNDArrayGetData(y, &p));
  ((float *)p)[0] = 555;
  CHECK_PULL(kv, 3, 3, 10, 20, 30);

  /* a later push with MORE values than the key's first multi-value push (MXNet
     segfaults: its copy buffers were sized by the first push) */
  int k5 = 5;
  const float z3[3] = {0, 0, 0};
  NDArrayHandle z = make_f32(3, z3);
  CHECK_OK(MXKVStoreInit(kv, 1, &k5, &z));
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){5, 5}, (NDArrayHandle[]){x, x}, 0));
  CHECK_PULL(kv, 5, 3, 2, 4, 6);
  NDArrayHandle many[9];
  int mk[9];
  for (int i = 0; i < 9; i++) {
    many[i] = x;
    mk[i] = 5;
  }
  CHECK_OK(MXKVStorePush(kv, 9, mk, many, 0));
  CHECK_PULL(kv, 5, 3, 9, 18, 27);
  still_works();

  /* §14.7: bool values cannot be summed (MXNet: async "Unknown type enum 7", sum lost) */
  const uint8_t t3[3] = {1, 0, 1}, f3[3] = {0, 0, 0};
  NDArrayHandle bt = make_typed(3, DT_BOOL, t3), bf = make_typed(3, DT_BOOL, f3);
  int k6 = 6;
  CHECK_OK(MXKVStoreInit(kv, 1, &k6, &bf));
  BAD(MXKVStorePush(kv, 2, (int[]){6, 6}, (NDArrayHandle[]){bt, bt}, 0), "MXKVStorePush: ");
  CHECK_ERR(MXKVStorePush(kv, 2, (int[]){6, 6}, (NDArrayHandle[]){bt, bt}, 0), "7");
  CHECK_ERR(MXKVStorePush(kv, 3, (int[]){6, 6, 6}, (NDArrayHandle[]){bt, bf, bt}, 0), "bool");
  uint8_t g[3] = {9, 9, 9};
  NDArrayHandle bo = make_typed(3, DT_BOOL, NULL);
  CHECK_OK(MXKVStorePull(kv, 1, &k6, &bo, 0));
  CHECK_OK(MXNDArraySyncCopyToCPU(bo, g, 3));
  CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0);
  CHECK_OK(MXKVStorePush(kv, 1, &k6, &bt, 0)); /* one value: fine */
  CHECK_OK(MXKVStorePull(kv, 1, &k6, &bo, 0));
  CHECK_OK(MXNDArraySyncCopyToCPU(bo, g, 3));
  CHECK(g[0] == 1 && g[1] == 0 && g[2] == 1);

  /* empty (CreateNone) arrays as values and outputs */
  NDArrayHandle none = NULL;
  CHECK_OK(MXNDArrayCreateNone(&none));
  BAD(MXKVStorePush(kv, 1, &k, &none, 0), "MXKVStorePush: ");
  BAD(MXKVStorePush(kv, 2, kk, (NDArrayHandle[]){x, none}, 0), "MXKVStorePush: ");
  BAD(MXKVStorePull(kv, 1, &k, &none, 0), "MXKVStorePull: ");
  int k7 = 7;
  BAD(MXKVStoreInit(kv, 1, &k7, &none), "MXKVStoreInit: ");
  BAD(MXKVStorePull(kv, 1, &k7, &o, 0), "key 7 has not been inited");
  CHECK_PULL(kv, 3, 3, 10, 20, 30);

  NDArrayHandle hs[12] = {x, y, w2, row, o, o2, dx, z, bt, bf, bo, none};
  free_all(hs, 12);
  CHECK_OK(MXKVStoreFree(kv));
}

/* ------------------------------------------------ §14.8: all or nothing */

static int g_ids[16], g_nids;
static void id_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)h;
  if (g_nids < 16) g_ids[g_nids++] = key;
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void test_all_or_nothing(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  const float a[1] = {1}, b[1] = {2}, c[1] = {3};
  NDArrayHandle x = make_f32(1, a), y = make_f32(1, b), z = make_f32(1, c), o = make_f32(1, NULL);
  NDArrayHandle o2 = make_f32(2, NULL);
  NDArrayHandle xyz[3] = {x, y, z};

  BAD(MXKVStoreInit(kv, 3, (int[]){1, 2, 1}, xyz), "MXKVStoreInit: duplicate init of key 1");
  BAD(MXKVStorePull(kv, 1, (int[]){1}, &o, 0), "key 1 has not been inited");
  BAD(MXKVStorePull(kv, 1, (int[]){2}, &o, 0), "key 2 has not been inited");
  BAD(MXKVStoreInit(kv, 2, (int[]){5, 5}, xyz), "duplicate init of key 5");
  BAD(MXKVStorePull(kv, 1, (int[]){5}, &o, 0), "key 5 has not been inited");
  CHECK_OK(MXKVStoreInit(kv, 2, (int[]){1, 2}, xyz));
  CHECK_PULL(kv, 1, 1, 1);
  CHECK_PULL(kv, 2, 1, 2);
  /* an existing key among new ones */
  BAD(MXKVStoreInit(kv, 3, (int[]){8, 9, 2}, xyz), "duplicate init of key 2");
  BAD(MXKVStorePull(kv, 1, (int[]){8}, &o, 0), "key 8 has not been inited");
  CHECK_PULL(kv, 2, 1, 2);
  /* a bad value later in the list */
  BAD(MXKVStoreInit(kv, 2, (int[]){8, 9}, (NDArrayHandle[]){x, NULL}), "vals[1] (NDArrayHandle) is NULL");
  NDArrayHandle none = NULL;
  CHECK_OK(MXNDArrayCreateNone(&none));
  BAD(MXKVStoreInit(kv, 2, (int[]){8, 9}, (NDArrayHandle[]){x, none}), "MXKVStoreInit: ");
  BAD(MXKVStorePull(kv, 1, (int[]){8}, &o, 0), "key 8 has not been inited");
  CHECK_OK(MXKVStoreInit(kv, 2, (int[]){8, 9}, (NDArrayHandle[]){x, z}));
  CHECK_PULL(kv, 9, 1, 3);

  /* Broadcast: bad output shape, duplicate vkeys, unknown okey: nothing initialised */
  BAD(MXKVStoreBroadcast(kv, 1, (int[]){20}, 1, (int[]){20}, &x, &o2, 0),
      "MXKVStoreBroadcast: operands shape mismatch");
  BAD(MXKVStoreBroadcast(kv, 2, (int[]){20, 20}, 1, (int[]){20}, xyz, &o, 0), "duplicate init of key 20");
  BAD(MXKVStoreBroadcast(kv, 1, (int[]){20}, 1, (int[]){21}, &x, &o, 0), "key 21 has not been inited");
  BAD(MXKVStoreBroadcast(kv, 2, (int[]){20, 1}, 1, (int[]){20}, xyz, &o, 0), "duplicate init of key 1");
  BAD(MXKVStorePull(kv, 1, (int[]){20}, &o, 0), "key 20 has not been inited");
  CHECK_F32(o, 1, 0);
  CHECK_OK(MXKVStoreBroadcast(kv, 1, (int[]){20}, 2, (int[]){20, 9}, &y, (NDArrayHandle[]){o, x}, 0));
  CHECK_F32(o, 1, 2);
  CHECK_F32(x, 1, 3);
  CHECK_OK(MXNDArraySyncCopyFromCPU(x, a, 1));

  /* PushPull checks its outputs before pushing */
  BAD(MXKVStorePushPull(kv, 1, (int[]){1}, 1, (int[]){1}, &z, &o2, 0), "MXKVStorePushPull: operands shape mismatch");
  BAD(MXKVStorePushPull(kv, 1, (int[]){1}, 1, (int[]){77}, &z, &o, 0), "key 77 has not been inited");
  BAD(MXKVStorePushPull(kv, 1, (int[]){1}, 2, (int[]){1, 1}, &z, (NDArrayHandle[]){o, NULL}, 0),
      "outs[1] (NDArrayHandle) is NULL");
  BAD(MXKVStorePushPull(kv, 1, (int[]){1}, 1, (int[]){1}, &z, &none, 0), "MXKVStorePushPull: ");
  CHECK_PULL(kv, 1, 1, 1);

  /* InitEx: names of a failing call are not registered (MXNet keeps them forever) */
  KVStoreHandle skv = new_store("local");
  use_store(skv, true);
  const char *pqp[3] = {"p", "q", "p"}, *qp[2] = {"q", "p"}, *p1[1] = {"p"};
  BAD(MXKVStoreInitEx(skv, 3, pqp, xyz), "MXKVStoreInitEx: duplicate init of key p");
  BAD(MXKVStorePullEx(skv, 1, p1, &o, 0), "key p doesn't exist. Did you init?");
  BAD(MXKVStorePullEx(skv, 1, (const char *[]){"q"}, &o, 0), "key q doesn't exist");
  /* BroadcastEx: unknown okey, bad output, duplicate */
  const char *rs[2] = {"r", "s"};
  BAD(MXKVStoreBroadcastEx(skv, 2, rs, 1, (const char *[]){"missing"}, xyz, &o, 0),
      "MXKVStoreBroadcastEx: key missing doesn't exist. Did you init?");
  BAD(MXKVStoreBroadcastEx(skv, 2, rs, 1, rs, xyz, &o2, 0), "shape mismatch");
  BAD(MXKVStoreBroadcastEx(skv, 2, (const char *[]){"r", "r"}, 0, NULL, xyz, NULL, 0),
      "duplicate init of key r");
  BAD(MXKVStorePullEx(skv, 1, rs, &o, 0), "key r doesn't exist");
  /* the same names can be initialised now; ids follow successful registrations only */
  KVStoreHandle fresh = new_store("local");
  use_store(fresh, true);
  CHECK_ERR(MXKVStoreInitEx(fresh, 3, pqp, xyz), "duplicate init of key p");
  CHECK_ERR(MXKVStoreBroadcastEx(fresh, 2, rs, 1, (const char *[]){"missing"}, xyz, &o, 0),
            "doesn't exist");
  CHECK_OK(MXKVStoreInitEx(fresh, 2, qp, xyz));
  CHECK_OK(MXKVStoreBroadcastEx(fresh, 2, rs, 1, p1, (NDArrayHandle[]){z, x}, &o, 0));
  CHECK_F32(o, 1, 2);
  CHECK_PULL_EX(fresh, "q", 1, 1);
  CHECK_PULL_EX(fresh, "s", 1, 1);
  g_nids = 0;
  CHECK_OK(MXKVStoreSetUpdater(fresh, id_updater, NULL));
  const char *order[4] = {"s", "r", "p", "q"};
  CHECK_OK(MXKVStorePushEx(fresh, 4, order, (NDArrayHandle[]){x, x, x, x}, 0));
  CHECK(g_nids == 4 && g_ids[0] == 0 && g_ids[1] == 1 && g_ids[2] == 2 && g_ids[3] == 3);
  CHECK_OK(MXKVStoreSetUpdater(fresh, assign_updater, NULL));
  still_works();
  CHECK_OK(MXKVStoreFree(fresh));
  use_store(skv, true);
  CHECK_OK(MXKVStoreInitEx(skv, 3, (const char *[]){"p", "q", "r"}, xyz));
  CHECK_PULL_EX(skv, "r", 1, 3);

  NDArrayHandle hs[6] = {x, y, z, o, o2, none};
  free_all(hs, 6);
  CHECK_OK(MXKVStoreFree(skv));
  CHECK_OK(MXKVStoreFree(kv));
}

/* ------------------------------------- §14.10, §14.11, §14.13, sparse */

static void test_keys_and_sparse(void) {
  const float a[2] = {1, 2};
  NDArrayHandle x = make_f32(2, a), o = make_f32(2, NULL);
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  still_works(); /* the first keyed call fixes the key type: int */
  /* §14.11: mixed key types */
  const char *w[1] = {"w"};
  BAD(MXKVStoreInitEx(kv, 1, w, &x), "MXKVStoreInitEx: Mixed key types are not allowed");
  BAD(MXKVStorePushEx(kv, 1, w, &x, 0), "Mixed key types are not allowed");
  BAD(MXKVStorePullEx(kv, 1, w, &o, 0), "Mixed key types are not allowed");
  BAD(MXKVStoreBroadcastEx(kv, 1, w, 1, w, &x, &o, 0), "Mixed key types are not allowed");
  BAD(MXKVStorePushPullEx(kv, 1, w, 1, w, &x, &o, 0), "Mixed key types are not allowed");
  /* §14.10: row_sparse pull into dense outputs */
  int k = 1;
  BAD(MXKVStorePullRowSparse(kv, 1, &k, &o, &x, 0), "MXKVStorePullRowSparse: ");
  BAD(MXKVStorePullRowSparse(kv, 1, (int[]){1000000}, &o, &x, 0), "MXKVStorePullRowSparse: ");
  /* sparse arrays and aux arrays of dense arrays */
  uint32_t shape[2] = {4, 2}, aux_shape[1] = {0}, aux_ndims[1] = {1};
  int aux_type[1] = {DT_I64}, t = -1;
  NDArrayHandle sp = NULL;
  int rc = MXNDArrayCreateSparseEx(1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims,
                                   aux_shape, &sp);
  if (rc == 0) {
    CHECK_OK(MXNDArrayFree(sp));
  } else {
    CHECK(strstr(MXGetLastError(), "MXNDArrayCreateSparseEx: ") != NULL);
  }
  still_works();
  BAD(MXNDArrayCreateSparseEx(9, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &sp),
      "MXNDArrayCreateSparseEx: ");
  NDArrayHandle aux = NULL;
  BAD(MXNDArrayGetAuxType(x, 0, &t), "MXNDArrayGetAuxType: ");
  BAD(MXNDArrayGetAuxNDArray(x, 1, &aux), "MXNDArrayGetAuxNDArray: ");
  CHECK(aux == NULL && t == -1);
  CHECK_OK(MXKVStoreFree(kv));

  /* string-keyed store: int calls refused; messages name the string */
  kv = new_store("device");
  use_store(kv, true);
  CHECK_OK(MXKVStoreInitEx(kv, 1, w, &x));
  BAD(MXKVStoreInit(kv, 1, &k, &x), "MXKVStoreInit: Mixed key types are not allowed");
  BAD(MXKVStorePush(kv, 1, &k, &x, 0), "Mixed key types are not allowed");
  BAD(MXKVStorePull(kv, 1, &k, &o, 0), "Mixed key types are not allowed");
  BAD(MXKVStorePushEx(kv, 1, (const char *[]){"nope"}, &x, 0), "MXKVStorePushEx: key nope doesn't exist. Did you init?");
  BAD(MXKVStorePushPullEx(kv, 1, w, 1, (const char *[]){"nope"}, &x, &o, 0), "key nope doesn't exist");
  NDArrayHandle x3 = make_f32(3, NULL);
  BAD(MXKVStorePushEx(kv, 1, w, &x3, 0), "key w");
  BAD(MXKVStoreInitEx(kv, 1, w, &x), "duplicate init of key w");
  CHECK_PULL_EX(kv, "w", 2, 1, 2);
  CHECK_OK(MXKVStoreFree(kv));

  /* invalid UTF-8 and odd bytes as string keys: compared byte for byte */
  kv = new_store("local");
  use_store(kv, true);
  const char *odd[4] = {"\xff\xfe", "\xff\xfd", "\xc3", "\xc3\xa9"};
  const float v1 = 1, v2 = 2, v3 = 3, v4 = 4;
  NDArrayHandle e1 = make_f32(1, &v1), e2 = make_f32(1, &v2), e3 = make_f32(1, &v3), e4 = make_f32(1, &v4);
  CHECK_OK(MXKVStoreInitEx(kv, 4, odd, (NDArrayHandle[]){e1, e2, e3, e4}));
  CHECK_PULL_EX(kv, "\xff\xfe", 1, 1);
  CHECK_PULL_EX(kv, "\xff\xfd", 1, 2);
  CHECK_PULL_EX(kv, "\xc3", 1, 3);
  CHECK_PULL_EX(kv, "\xc3\xa9", 1, 4);
  CHECK_OK(MXKVStorePushEx(kv, 3, (const char *[]){"\xff\xfd", "\xc3", "\xff\xfd"},
                           (NDArrayHandle[]){e4, e1, e4}, 0));
  CHECK_PULL_EX(kv, "\xff\xfd", 1, 8);
  CHECK_PULL_EX(kv, "\xc3", 1, 1);
  BAD(MXKVStorePullEx(kv, 1, (const char *[]){"\xff\xfc"}, &e1, 0), "doesn't exist. Did you init?");
  BAD(MXKVStoreInitEx(kv, 1, (const char *[]){"\xff\xfe"}, &e1), "duplicate init of key");
  /* a long key */
  static char longkey[10001];
  memset(longkey, 'k', sizeof longkey - 1);
  const char *lk[1] = {longkey};
  CHECK_OK(MXKVStoreInitEx(kv, 1, lk, &e2));
  CHECK_PULL_EX(kv, longkey, 1, 2);
  NDArrayHandle hs[7] = {x, o, x3, e1, e2, e3, e4};
  free_all(hs, 7);
  CHECK_OK(MXKVStoreFree(kv));
}

/* The string updater gets the exact bytes of odd keys. */
static char g_seen_key[64];
static void bytes_str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)h;
  snprintf(g_seen_key, sizeof g_seen_key, "%s", key);
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}
static void test_odd_key_updater(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, true);
  const float v1 = 1;
  NDArrayHandle e = make_f32(1, &v1);
  const char *k[1] = {"\xff\xfe\x01"};
  CHECK_OK(MXKVStoreInitEx(kv, 1, k, &e));
  CHECK_OK(MXKVStoreSetUpdaterEx(kv, noop_updater, bytes_str_updater, NULL));
  CHECK_OK(MXKVStorePushEx(kv, 1, k, &e, 0));
  CHECK(strcmp(g_seen_key, "\xff\xfe\x01") == 0);
  CHECK_OK(MXNDArrayFree(e));
  CHECK_OK(MXKVStoreFree(kv));
}

/* ---------------------------------------- row_sparse values, compression */

static void test_sparse_and_compression(const char *type) {
  KVStoreHandle kv = new_store(type);
  use_store(kv, false);
  const int64_t i02[2] = {0, 2};
  const float d02[4] = {1, 1, 2, 2};
  NDArrayHandle w = make_rsp(4, 2, i02, 2, d02), out = make_rsp(4, 2, i02, 0, NULL);
  uint32_t s42[2] = {4, 2};
  const float d8[8] = {1, 1, 2, 2, 0, 0, 0, 0};
  NDArrayHandle dense = make_f32_shape(s42, 2, d8);
  int k = 1, kd = 2;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &w));
  CHECK_OK(MXKVStoreInit(kv, 1, &kd, &dense));

  /* §14.10: row ids out of range (MXNet: rc 0 and zeros) */
  NDArrayHandle r7 = make_typed(2, DT_I64, (int64_t[]){1, 7}), rneg = make_typed(1, DT_I64, (int64_t[]){-1});
  NDArrayHandle r0 = make_typed(1, DT_I64, (int64_t[]){0});
  BAD(MXKVStorePullRowSparse(kv, 1, &k, &out, &r7, 0), "MXKVStorePullRowSparse: row id 7 is out of range");
  BAD(MXKVStorePullRowSparse(kv, 1, &k, &out, &rneg, 0), "row id -1 is out of range");
  /* wrong kinds of outputs, row ids and keys */
  BAD(MXKVStorePullRowSparse(kv, 1, &k, &dense, &r0, 0), "Expected row_sparse storage type for row_sparse_pull values");
  BAD(MXKVStorePullRowSparse(kv, 1, &k, &out, &w, 0), "Expected default storage type for row_sparse_pull rowids");
  BAD(MXKVStorePullRowSparse(kv, 1, &kd, &out, &r0, 0), "PullRowSparse expects row_sparse src NDArray");
  BAD(MXKVStorePullRowSparse(kv, 1, (int[]){99}, &out, &r0, 0), "key 99 has not been inited");
  NDArrayHandle wide = make_rsp(4, 3, i02, 0, NULL);
  BAD(MXKVStorePullRowSparse(kv, 1, &k, &wide, &r0, 0), "MXKVStorePullRowSparse: ");
  int st = -9;
  CHECK_OK(MXNDArrayGetStorageType(out, &st));
  CHECK(st == 1);

  /* inconsistent row_sparse values (MXNet drops rows or reads out of bounds) */
  const float d4[4] = {5, 5, 6, 6};
  NDArrayHandle oob = make_rsp(4, 2, (int64_t[]){0, 9}, 2, d4);
  NDArrayHandle unsorted = make_rsp(4, 2, (int64_t[]){2, 0}, 2, d4);
  NDArrayHandle dup = make_rsp(4, 2, (int64_t[]){1, 1}, 2, d4);
  NDArrayHandle neg = make_rsp(4, 2, (int64_t[]){-1, 0}, 2, d4);
  NDArrayHandle bads[4] = {oob, unsorted, dup, neg};
  const char *why[4] = {"row index 9 is out of range", "must be sorted", "without duplicates",
                        "row index -1 is out of range"};
  for (int i = 0; i < 4; i++) {
    BAD(MXKVStoreInit(kv, 1, (int[]){50 + i}, &bads[i]), why[i]);
    BAD(MXKVStorePull(kv, 1, (int[]){50 + i}, &out, 0), "has not been inited");
    BAD(MXKVStorePush(kv, 1, &k, &bads[i], 0), why[i]);
    BAD(MXKVStorePush(kv, 2, (int[]){1, 1}, (NDArrayHandle[]){w, bads[i]}, 0), why[i]);
    BAD(MXKVStorePush(kv, 1, &kd, &bads[i], 0), why[i]);
    BAD(MXNDArraySyncCheckFormat(bads[i], true), "MXNDArraySyncCheckFormat: ");
  }
  /* three indices for two rows of data */
  NDArrayHandle three = make_typed(3, DT_I64, (int64_t[]){0, 1, 2});
  NDArrayHandle mism = make_rsp(4, 2, i02, 2, d4);
  CHECK_OK(MXNDArraySyncCopyFromNDArray(mism, three, 0));
  BAD(MXKVStorePush(kv, 1, &k, &mism, 0), "MXKVStorePush: ");
  BAD(MXKVStoreInit(kv, 1, (int[]){60}, &mism), "MXKVStoreInit: ");
  BAD(MXNDArraySyncCheckFormat(mism, true), "MXNDArraySyncCheckFormat: ");
  /* the keys kept their values */
  NDArrayHandle check = make_f32_shape(s42, 2, NULL);
  CHECK_OK(MXKVStorePull(kv, 1, &k, &check, 0));
  CHECK_F32(check, 8, 1, 1, 0, 0, 2, 2, 0, 0);
  CHECK_OK(MXKVStorePull(kv, 1, &kd, &check, 0));
  CHECK_F32(check, 8, 1, 1, 2, 2, 0, 0, 0, 0);

  /* sparse arrays: bad creation arguments, aux indices, dense-only calls */
  uint32_t aux_shape[2] = {0, 0}, aux_ndims[2] = {1, 1};
  int aux_type[2] = {DT_I64, DT_I64};
  NDArrayHandle h = NULL;
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 0, NULL, NULL, NULL, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 2, aux_type, aux_ndims, aux_shape, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(2, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, (int[]){DT_F32}, aux_ndims, aux_shape, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, (int[]){99}, aux_ndims, aux_shape, &h), "Unknown type enum 99");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, 99, 1, aux_type, aux_ndims, aux_shape, &h), "Unknown type enum 99");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_GPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h), "USE_CUDA");
  BAD(MXNDArrayCreateSparseEx(1, s42, 0, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(7, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(-1, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(1, (uint32_t[]){UINT32_MAX, UINT32_MAX}, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, (uint32_t[]){UINT32_MAX}, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, (uint32_t[]){9}, &h), "MXNDArrayCreateSparseEx: ");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, NULL, aux_ndims, aux_shape, &h), "aux_type is NULL");
  BAD(MXNDArrayCreateSparseEx(1, s42, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, NULL), "out (output pointer) is NULL");
  BAD(MXNDArrayCreateSparseEx64(1, (int64_t[]){4, -2}, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, (int[]){1}, (int64_t[]){0}, &h), "MXNDArrayCreateSparseEx64: ");
  BAD(MXNDArrayCreateSparseEx64(1, (int64_t[]){4, 2}, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, (int[]){-1}, (int64_t[]){0}, &h), "MXNDArrayCreateSparseEx64: ");
  CHECK(h == NULL);
  int t = -1;
  NDArrayHandle a = NULL;
  BAD(MXNDArrayGetAuxType(w, 1, &t), "MXNDArrayGetAuxType: ");
  BAD(MXNDArrayGetAuxType64(w, -1, &t), "MXNDArrayGetAuxType64: ");
  BAD(MXNDArrayGetAuxNDArray(w, 5, &a), "MXNDArrayGetAuxNDArray: ");
  BAD(MXNDArrayGetAuxNDArray64(w, INT64_MIN, &a), "MXNDArrayGetAuxNDArray64: ");
  BAD(MXNDArrayGetAuxType(w, 0, NULL), "(output pointer) is NULL");
  BAD(MXNDArrayGetAuxNDArray(w, 0, NULL), "(output pointer) is NULL");
  CHECK(t == -1 && a == NULL);
  float buf[8];
  BAD(MXNDArraySyncCopyToCPU(w, buf, 8), "MXNDArraySyncCopyToCPU: ");
  BAD(MXNDArraySyncCopyFromCPU(w, buf, 8), "MXNDArraySyncCopyFromCPU: ");
  BAD(MXNDArraySyncCopyFromNDArray(w, r0, 1), "MXNDArraySyncCopyFromNDArray: ");
  BAD(MXNDArraySyncCopyFromNDArray(w, r0, -2), "MXNDArraySyncCopyFromNDArray: ");
  BAD(MXNDArraySyncCheckFormat(NULL, true), "MXNDArraySyncCheckFormat: handle (NDArrayHandle) is NULL");
  CHECK_OK(MXNDArraySyncCheckFormat(w, true));

  /* gradient compression parameters (on a second store; after each bad call
     both stores must work, the compressing one as a compressing one) */
  KVStoreHandle kvc = new_store(type);
  const char *gk[2] = {"type", "threshold"};
  const float g[4] = {0.3f, 0.6f, -0.7f, 1.2f};
  NDArrayHandle gv = make_f32(4, g), gz = make_f32(4, NULL);
  int kc = 0;
  CHECK_OK(MXKVStoreInit(kvc, 1, &kc, &gz));
  BAD(MXKVStoreSetGradientCompression(kvc, 1, (const char *[]){"threshold"}, (const char *[]){"0.5"}),
      "MXKVStoreSetGradientCompression: Required parameter type of string is not presented");
  BAD(MXKVStoreSetGradientCompression(kvc, 1, gk, (const char *[]){"3bit"}),
      "Unknown type for gradient compression 3bit");
  BAD(MXKVStoreSetGradientCompression(kvc, 2, gk, (const char *[]){"2bit", "0"}),
      "threshold must be greater than 0");
  BAD(MXKVStoreSetGradientCompression(kvc, 2, gk, (const char *[]){"2bit", "-1"}),
      "threshold must be greater than 0");
  BAD(MXKVStoreSetGradientCompression(kvc, 2, gk, (const char *[]){"2bit", "abc"}),
      "Invalid Parameter format for threshold expect float but value='abc'");
  CHECK_OK(MXKVStorePush(kvc, 1, &kc, &gv, 0)); /* the failed calls set nothing */
  CHECK_PULL(kvc, 0, 4, 0.3f, 0.6f, -0.7f, 1.2f);
  CHECK_OK(MXKVStoreSetGradientCompression(kvc, 2, gk, (const char *[]){"2bit", "0.5"}));
  bool device = strstr(type, "device") != NULL;
  if (device) {
    /* with compression on, a device store refuses values it cannot compress */
    const double dv[2] = {1, 2};
    NDArrayHandle d64 = make_typed(2, DT_F64, dv);
    NDArrayHandle rz = make_rsp(4, 2, i02, 0, NULL);
    int k70 = 70, k71 = 71;
    CHECK_OK(MXKVStoreInit(kvc, 1, &k70, &d64));
    CHECK_OK(MXKVStoreInit(kvc, 1, &k71, &rz));
    BAD(MXKVStorePush(kvc, 1, &k70, &d64, 0), "MXKVStorePush: ");
    BAD(MXKVStorePush(kvc, 1, &k71, &w, 0), "MXKVStorePush: ");
    BAD(MXKVStorePush(kvc, 2, (int[]){0, 70}, (NDArrayHandle[]){gv, d64}, 0), "MXKVStorePush: ");
    CHECK_OK(MXNDArrayFree(d64));
    CHECK_OK(MXNDArrayFree(rz));
  }
  CHECK_OK(MXKVStoreSetGradientCompression(kvc, 2, gk, (const char *[]){"2bit", "0.5"}));
  CHECK_OK(MXKVStoreInit(kvc, 1, (int[]){1}, &gz));
  CHECK_OK(MXKVStorePush(kvc, 1, (int[]){1}, &gv, 0));
  if (device)
    CHECK_PULL(kvc, 1, 4, 0, 0.5f, -0.5f, 0.5f); /* quantised */
  else
    CHECK_PULL(kvc, 1, 4, 0.3f, 0.6f, -0.7f, 1.2f); /* local: no effect */
  CHECK_OK(MXNDArrayFree(gv));
  CHECK_OK(MXNDArrayFree(gz));
  CHECK_OK(MXKVStoreFree(kvc));

  NDArrayHandle hs[15] = {w, out, dense, r7, rneg, r0, wide, oob, unsorted, dup, neg, three, mism, check, NULL};
  free_all(hs, 14);
  CHECK_OK(MXKVStoreFree(kv));
}

/* --------------------------------- store types, contexts, dtypes, shapes */

static void test_create_args(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  KVStoreHandle out = NULL;
  static const char *dist[] = {"dist_sync", "dist_async", "DIST_SYNC", "dist_device_sync",
                               "dist_sync_device", "nccl_dist", "dist"};
  for (size_t i = 0; i < sizeof dist / sizeof dist[0]; i++)
    BAD(MXKVStoreCreate(dist[i], &out), "DMLC_NUM_WORKER");
  BAD(MXKVStoreCreate("dist_sync", &out), "MXKVStoreCreate: ");
  BAD(MXKVStoreCreate("nccl", &out), "NCCL");
  BAD(MXKVStoreCreate("NCCL", &out), "MXKVStoreCreate: ");
  BAD(MXKVStoreCreate("device_nccl", &out), "NCCL");
  CHECK(out == NULL);

  uint32_t s2 = 2;
  int64_t s2l = 2;
  NDArrayHandle h = NULL;
  BAD(MXNDArrayCreate(&s2, 1, DEV_GPU, 0, 0, &h), "MXNDArrayCreate: Compile with USE_CUDA=1");
  BAD(MXNDArrayCreateEx(&s2, 1, DEV_GPU, 1, 0, DT_F32, &h), "USE_CUDA");
  BAD(MXNDArrayCreateEx64(&s2l, 1, DEV_GPU, 0, 0, DT_I64, &h), "USE_CUDA");
  BAD(MXNDArrayCreateEx(&s2, 1, 0, 0, 0, DT_F32, &h), "MXNDArrayCreateEx: ");
  BAD(MXNDArrayCreateEx(&s2, 1, 4, 0, 0, DT_F32, &h), "MXNDArrayCreateEx: ");
  BAD(MXNDArrayCreateEx(&s2, 1, -1, 0, 0, DT_F32, &h), "MXNDArrayCreateEx: ");
  BAD(MXNDArrayCreateEx(&s2, 1, DEV_CPU_PINNED, -1, 0, DT_F32, &h), "MXNDArrayCreateEx: "); /* cpu(-1) is cpu(0) */
  BAD(MXNDArrayCreateEx(&s2, 1, DEV_CPU, 0, 0, 13, &h), "Unknown type enum 13");
  BAD(MXNDArrayCreateEx(&s2, 1, DEV_CPU, 0, 0, 99, &h), "MXNDArrayCreateEx: Unknown type enum 99");
  BAD(MXNDArrayCreateEx(&s2, 1, DEV_CPU, 0, 0, -1, &h), "Unknown type enum -1");
  BAD(MXNDArrayCreateEx64(&s2l, 1, DEV_CPU, 0, 0, INT_MIN, &h), "Unknown type enum");
  BAD(MXNDArrayCreateEx64(&s2l, -1, DEV_CPU, 0, 0, DT_F32, &h), "MXNDArrayCreateEx64: ");
  int64_t neg[2] = {2, -3};
  BAD(MXNDArrayCreateEx64(neg, 2, DEV_CPU, 0, 0, DT_F32, &h), "MXNDArrayCreateEx64: ");
  /* sizes that overflow: refused before allocating anything */
  int64_t huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 2};
  BAD(MXNDArrayCreateEx64(huge, 3, DEV_CPU, 0, 0, DT_F32, &h), "MXNDArrayCreateEx64: ");
  int64_t huge2[2] = {INT64_C(1) << 31, INT64_C(1) << 31}; /* 2^62 elements, 2^64 bytes */
  BAD(MXNDArrayCreateEx64(huge2, 2, DEV_CPU, 0, 0, DT_F32, &h), "MXNDArrayCreateEx64: ");
  int64_t huge3[1] = {INT64_MAX};
  BAD(MXNDArrayCreateEx64(huge3, 1, DEV_CPU, 0, 0, DT_U8, &h), "MXNDArrayCreateEx64: ");
  uint32_t big32[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
  BAD(MXNDArrayCreateEx(big32, 3, DEV_CPU, 0, 0, DT_F64, &h), "MXNDArrayCreateEx: ");
  BAD(MXNDArrayCreate(big32, 3, DEV_CPU, 0, 0, &h), "MXNDArrayCreate: ");
  CHECK(h == NULL);

  /* a dimension that int/uint32 cannot show (an empty array, so no memory) */
  int64_t wide[2] = {INT64_C(1) << 32, 0};
  CHECK_OK(MXNDArrayCreateEx64(wide, 2, DEV_CPU, 0, 0, DT_F32, &h));
  uint32_t ndim = 0;
  const uint32_t *pd = NULL;
  int indim = 0;
  const int *ipd = NULL;
  const int64_t *lpd = NULL;
  BAD(MXNDArrayGetShape(h, &ndim, &pd), "MXNDArrayGetShape: ");
  BAD(MXNDArrayGetShapeEx(h, &indim, &ipd), "MXNDArrayGetShapeEx: ");
  CHECK_OK(MXNDArrayGetShapeEx64(h, &indim, &lpd));
  CHECK(indim == 2 && lpd[0] == (INT64_C(1) << 32) && lpd[1] == 0);
  CHECK_OK(MXNDArrayFree(h));
  CHECK_OK(MXKVStoreFree(kv));
}

/* --------------------------------------------------------- copies */

static void test_copies(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  const float a[6] = {1, 2, 3, 4, 5, 6};
  float buf[8] = {0};
  uint32_t s23[2] = {2, 3};
  NDArrayHandle x = make_f32_shape(s23, 2, a), y = make_f32(6, NULL), z = make_f32(5, NULL);
  BAD(MXNDArraySyncCopyFromCPU(x, a, 5), "MXNDArraySyncCopyFromCPU: Check failed: dshape.Size() == size (6 vs. 5) : Memory size do not match");
  BAD(MXNDArraySyncCopyFromCPU(x, a, 7), "Memory size do not match");
  BAD(MXNDArraySyncCopyFromCPU(x, a, 0), "Memory size do not match");
  BAD(MXNDArraySyncCopyFromCPU(x, a, SIZE_MAX), "Memory size do not match");
  BAD(MXNDArraySyncCopyToCPU(x, buf, 5), "MXNDArraySyncCopyToCPU: ");
  BAD(MXNDArraySyncCopyToCPU(x, buf, 7), "Memory size do not match");
  BAD(MXNDArraySyncCopyToCPU(x, buf, SIZE_MAX), "Memory size do not match");
  CHECK(buf[0] == 0);
  CHECK_F32(x, 6, 1, 2, 3, 4, 5, 6);
  /* (2,3) vs (6,): shapes must be equal */
  BAD(MXNDArraySyncCopyFromNDArray(y, x, -1), "MXNDArraySyncCopyFromNDArray: operands shape mismatch");
  BAD(MXNDArraySyncCopyFromNDArray(z, y, -1), "shape mismatch");
  BAD(MXNDArraySyncCopyFromNDArray(x, x, 0), "MXNDArraySyncCopyFromNDArray: ");
  BAD(MXNDArraySyncCopyFromNDArray(x, x, 5), "MXNDArraySyncCopyFromNDArray: ");
  BAD(MXNDArraySyncCopyFromNDArray(x, x, -2), "MXNDArraySyncCopyFromNDArray: ");
  CHECK_OK(MXNDArraySyncCopyFromNDArray(x, x, -1)); /* onto itself: a no-op */
  CHECK_F32(x, 6, 1, 2, 3, 4, 5, 6);

  /* CreateNone arrays: no data to copy, read, save */
  NDArrayHandle none = NULL, d = NULL;
  void *p = NULL;
  CHECK_OK(MXNDArrayCreateNone(&none));
  {
    /* as MXNet: dtype -1 and context (0, 0) for an empty array */
    int dt = 0, dev_type = -7, dev_id = -7;
    CHECK_OK(MXNDArrayGetDType(none, &dt));
    CHECK(dt == -1);
    CHECK_OK(MXNDArrayGetContext(none, &dev_type, &dev_id));
    CHECK(dev_type == 0 && dev_id == 0);
  }
  BAD(MXNDArraySyncCopyFromCPU(none, a, 1), "MXNDArraySyncCopyFromCPU: ");
  BAD(MXNDArraySyncCopyToCPU(none, buf, 1), "MXNDArraySyncCopyToCPU: ");
  BAD(MXNDArraySyncCopyFromNDArray(none, x, -1), "MXNDArraySyncCopyFromNDArray: ");
  BAD(MXNDArraySyncCopyFromNDArray(x, none, -1), "MXNDArraySyncCopyFromNDArray: ");
  BAD(MXNDArrayGetData(none, &p), "MXNDArrayGetData: ");
  BAD(MXNDArrayGetDataNDArray(none, &d), "MXNDArrayGetDataNDArray: ");
  CHECK(p == NULL && d == NULL);
  CHECK_OK(MXNDArrayWaitToRead(none));
  CHECK_F32(x, 6, 1, 2, 3, 4, 5, 6);
  NDArrayHandle hs[4] = {x, y, z, none};
  free_all(hs, 4);
  CHECK_OK(MXKVStoreFree(kv));
}

/* ------------------------------------------------------- .params files */

static void write_bytes(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(b, 1, n, f) == n);
  CHECK(fclose(f) == 0);
}

static size_t read_bytes(const char *path, unsigned char *b, size_t cap) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  size_t n = fread(b, 1, cap, f);
  CHECK(fgetc(f) == EOF);
  fclose(f);
  return n;
}

/* Load must fail with `want` (if not NULL) or succeed; a success's arrays are freed. */
static int try_load(const char *path, const char *want) {
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  int rc = MXNDArrayLoad(path, &n, &arr, &nn, &names);
  if (rc == 0) {
    CHECK(want == NULL);
    NDArrayHandle copy[64];
    CHECK(n <= 64);
    memcpy(copy, arr, n * sizeof *arr);
    for (uint32_t i = 0; i < n; i++) CHECK_OK(MXNDArrayFree(copy[i]));
  } else {
    CHECK(rc == -1);
    const char *m = MXGetLastError();
    CHECK(strncmp(m, "MXNDArrayLoad: ", 15) == 0);
    if (check_verbose()) fprintf(stderr, "  [load] %s\n", m);
    if (want != NULL && strstr(m, want) == NULL) {
      fprintf(stderr, "load of %s: \"%s\" lacks \"%s\"\n", path, m, want);
      exit(1);
    }
  }
  return rc;
}

static void put_u64(unsigned char *b, uint64_t v) { memcpy(b, &v, 8); }
static void put_i32(unsigned char *b, int32_t v) { memcpy(b, &v, 4); }

static void test_params_files(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  char good[] = "/tmp/mxkv_good_XXXXXX", bad[] = "/tmp/mxkv_bad_XXXXXX";
  int fd = mkstemp(good);
  CHECK(fd >= 0);
  close(fd);
  fd = mkstemp(bad);
  CHECK(fd >= 0);
  close(fd);
  live_t start = live_now();

  const float wv[6] = {1, 2, 3, 4, 5, 6};
  uint32_t s23[2] = {2, 3};
  NDArrayHandle w = make_f32_shape(s23, 2, wv);
  const int64_t bv = 7;
  NDArrayHandle b = make_typed(1, DT_I64, &bv);
  CHECK_OK(MXNDArraySave(good, 2, (NDArrayHandle[]){w, b}, (const char *[]){"w", "bias"}));
  unsigned char file[512], mut[512];
  size_t len = read_bytes(good, file, sizeof file);
  CHECK(len == 157);
  CHECK(try_load(good, NULL) == 0);

  /* every truncation */
  for (size_t cut = 0; cut < len; cut++) {
    write_bytes(bad, file, cut);
    g_bad_line = __LINE__;
    CHECK(try_load(bad, "Invalid NDArray file format") == -1);
  }
  still_works();
  /* garbage */
  for (size_t i = 0; i < sizeof mut; i++) mut[i] = (unsigned char)(i * 131 + 7);
  write_bytes(bad, mut, sizeof mut);
  CHECK(try_load(bad, "Invalid NDArray file format") == -1);
  write_bytes(bad, (const unsigned char *)"hello world, not a params file\n", 31);
  BAD(MXNDArrayLoad(bad, &(uint32_t){0}, &(NDArrayHandle *){NULL}, &(uint32_t){0}, &(const char **){NULL}),
      "MXNDArrayLoad: Check failed: header == kMXAPINDArrayListMagic: Invalid NDArray file format");
  /* a missing file, a directory */
  BAD(MXNDArrayLoad("/nonexistent/dir/x.params", &(uint32_t){0}, &(NDArrayHandle *){NULL}, &(uint32_t){0},
                    &(const char **){NULL}),
      "MXNDArrayLoad: ");
  CHECK(try_load("/tmp", NULL) == -1);

  /* crafted fields: counts, ndim, dims, dtype, storage type, magic, names */
  struct {
    size_t at;
    int bytes; /* 4 or 8 */
    uint64_t value;
  } crafted[] = {
      {16, 8, UINT64_MAX},           /* array count */
      {16, 8, UINT64_C(1) << 62},    /* array count */
      {16, 8, 3},                    /* one array too many */
      {16, 8, 1},                    /* one array too few: names then mismatch */
      {24, 4, 0xF993FAC8},           /* V1 magic */
      {24, 4, 0xDEADBEEF},           /* unknown magic */
      {28, 4, 1},                    /* row_sparse */
      {28, 4, 2},                    /* csr */
      {28, 4, 7},                    /* unknown storage type */
      {28, 4, (uint32_t)-2},         /* unknown storage type */
      {32, 4, 1u << 30},             /* ndim */
      {32, 4, (uint32_t)-5},         /* ndim */
      {32, 4, 33},                   /* ndim */
      {36, 8, UINT64_C(1) << 62},    /* dim */
      {36, 8, (uint64_t)-2},         /* negative dim */
      {44, 8, INT64_MAX},            /* dim */
      {60, 4, 99},                   /* dtype */
      {60, 4, (uint32_t)-1},         /* dtype */
      {128, 8, UINT64_MAX},          /* name count */
      {128, 8, 3},                   /* name count */
      {136, 8, UINT64_MAX},          /* name length */
      {136, 8, 1000},                /* name length */
  };
  for (size_t i = 0; i < sizeof crafted / sizeof crafted[0]; i++) {
    memcpy(mut, file, len);
    if (crafted[i].bytes == 8) put_u64(mut + crafted[i].at, crafted[i].value);
    else put_i32(mut + crafted[i].at, (int32_t)(uint32_t)crafted[i].value);
    write_bytes(bad, mut, len);
    g_bad_line = __LINE__;
    if (try_load(bad, NULL) != -1) {
      fprintf(stderr, "crafted file %zu (offset %zu) loaded without error\n", i, crafted[i].at);
      exit(1);
    }
  }
  still_works();
  /* a NUL byte inside a name: the name ends there, as in MXNet */
  memcpy(mut, file, len);
  mut[154] = 0; /* "bias" -> "b\0as" */
  write_bytes(bad, mut, len);
  CHECK(try_load(bad, NULL) == 0);

  /* flip every byte four ways: never a crash, never a leak */
  static const unsigned char flips[4] = {0x01, 0x80, 0xFF, 0x7F};
  for (size_t pos = 0; pos < len; pos++) {
    for (int f = 0; f < 4; f++) {
      memcpy(mut, file, len);
      mut[pos] ^= flips[f];
      write_bytes(bad, mut, len);
      try_load(bad, NULL);
    }
  }
  /* extra bytes at the end (MXNet ignores them) */
  memcpy(mut, file, len);
  memset(mut + len, 0, 16);
  write_bytes(bad, mut, len + 16);
  try_load(bad, NULL);
  still_works();

  /* Save: a CreateNone array, an unwritable path, a directory */
  NDArrayHandle none = NULL;
  CHECK_OK(MXNDArrayCreateNone(&none));
  BAD(MXNDArraySave(bad, 1, &none, NULL), "MXNDArraySave: ");
  BAD(MXNDArraySave(bad, 2, (NDArrayHandle[]){w, none}, (const char *[]){"w", "n"}), "MXNDArraySave: ");
  BAD(MXNDArraySave("/nonexistent/dir/x.params", 1, &w, NULL), "MXNDArraySave: ");
  BAD(MXNDArraySave("/tmp", 1, &w, NULL), "MXNDArraySave: ");
  /* the good file is untouched by the failed saves */
  CHECK(read_bytes(good, mut, sizeof mut) == len && memcmp(mut, file, len) == 0);

  NDArrayHandle hs[3] = {w, b, none};
  free_all(hs, 3);
  CHECK_LIVE(start);
  unlink(good);
  unlink(bad);
  CHECK_OK(MXKVStoreFree(kv));
}

/* ------------------------------------------------ hostile updaters */

static KVStoreHandle g_hostile_kv;
static int g_hostile_mode;
static void hostile_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)h;
  float big[8] = {0};
  switch (g_hostile_mode) {
    case 0: /* double free of its handles */
      CHECK_OK(MXNDArrayFree(recv));
      CHECK_ERR(MXNDArrayFree(recv), "MXNDArrayFree: handle (NDArrayHandle) is stale");
      CHECK_OK(MXNDArrayFree(local));
      CHECK_ERR(MXNDArrayFree(local), "is stale");
      return;
    case 1: /* use after free */
      CHECK_OK(MXNDArrayFree(recv));
      CHECK_ERR(MXNDArraySyncCopyToCPU(recv, big, 1), "is stale");
      CHECK_ERR(MXNDArraySyncCopyFromNDArray(local, recv, -1), "handle_src (NDArrayHandle) is stale");
      CHECK_OK(MXNDArrayFree(local));
      return;
    case 2: /* wrong sizes when writing local */
      CHECK_ERR(MXNDArraySyncCopyFromCPU(local, big, 8), "Memory size do not match");
      break;
    case 3: /* frees the store during its own push */
      if (key == 1) CHECK_OK(MXKVStoreFree(g_hostile_kv));
      CHECK_ERR(MXKVStoreFree(g_hostile_kv), "is stale");
      CHECK_ERR(MXKVStorePull(g_hostile_kv, 1, &key, &local, 0), "MXKVStorePull: KVStoreHandle is stale");
      break;
    case 4: /* replaces the updater during a push, initialises a new key */
      CHECK_OK(MXKVStoreSetUpdater(g_hostile_kv, assign_updater, NULL));
      CHECK_OK(MXKVStoreInit(g_hostile_kv, 1, (int[]){500 + key}, &recv));
      break;
    case 5: /* pushes to its own key, once */
      g_hostile_mode = 6;
      CHECK_OK(MXKVStorePush(g_hostile_kv, 1, &key, &recv, 0));
      CHECK_OK(MXKVStorePull(g_hostile_kv, 1, &key, &local, 0));
      break;
    default:
      break;
  }
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void test_hostile_updaters(void) {
  const float one[2] = {1, 1}, two[2] = {2, 2};
  NDArrayHandle x = make_f32(2, one), y = make_f32(2, two);
  live_t start = live_now();
  for (int mode = 0; mode <= 5; mode++) {
    KVStoreHandle kv = new_store(mode % 2 ? "device" : "local");
    use_store(kv, false);
    g_hostile_kv = kv;
    g_hostile_mode = mode;
    int keys[2] = {1, 2};
    CHECK_OK(MXKVStoreInit(kv, 2, keys, (NDArrayHandle[]){x, x}));
    CHECK_OK(MXKVStoreSetUpdater(kv, hostile_updater, NULL));
    int rc = MXKVStorePush(kv, 2, keys, (NDArrayHandle[]){y, y}, 0);
    if (mode == 3) {
      /* the store went away under the push: it finished, the handle is stale */
      CHECK(rc == 0);
      CHECK_ERR(MXKVStoreGetType(kv, &(const char *){NULL}), "KVStoreHandle is stale");
      continue;
    }
    CHECK_OK(rc);
    if (mode == 4) {
      CHECK_PULL(kv, 501, 2, 2, 2); /* the new keys */
      CHECK_PULL(kv, 502, 2, 2, 2);
    } else if (mode <= 2) {
      CHECK_PULL(kv, 1, 2, 1, 1);
    }
    CHECK_OK(MXKVStoreSetUpdater(kv, assign_updater, NULL));
    still_works();
    CHECK_OK(MXKVStoreFree(kv));
  }
  CHECK_LIVE(start);
  CHECK_OK(MXNDArrayFree(x));
  CHECK_OK(MXNDArrayFree(y));
}

/* ------------------------------------------- aliasing the store's value */

/* An updater that keeps the handle on the stored value (the callee owns it). */
static NDArrayHandle g_kept_local;
static void keep_local_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *h) {
  (void)key, (void)h;
  float r[2], l[2];
  read_f32(recv, r, 2);
  read_f32(local, l, 2);
  l[0] += r[0];
  l[1] += r[1];
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, l, 2));
  CHECK_OK(MXNDArrayFree(recv));
  if (g_kept_local == NULL)
    g_kept_local = local;
  else
    CHECK_OK(MXNDArrayFree(local));
}

/* The stored value itself (through a kept `local` handle) used as a pushed
   value, a pull output and an init value. */
static void test_aliasing(const char *type) {
  KVStoreHandle kv = new_store(type);
  use_store(kv, false);
  const float one[2] = {1, 1}, two[2] = {2, 2};
  NDArrayHandle x = make_f32(2, one), y = make_f32(2, two);
  int k1 = 1, k2 = 2;
  CHECK_OK(MXKVStoreInit(kv, 1, &k1, &x));
  g_kept_local = NULL;
  CHECK_OK(MXKVStoreSetUpdater(kv, keep_local_updater, NULL));
  CHECK_OK(MXKVStorePush(kv, 1, &k1, &y, 0));
  NDArrayHandle L = g_kept_local;
  CHECK(L != NULL);
  CHECK_F32(L, 2, 3, 3);
  CHECK_OK(MXKVStoreSetUpdater(kv, assign_updater, NULL));
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){1, 1}, (NDArrayHandle[]){L, L}, 0)); /* 3 + 3 */
  CHECK_PULL(kv, 1, 2, 6, 6);
  CHECK_F32(L, 2, 6, 6);
  CHECK_OK(MXKVStorePush(kv, 3, (int[]){1, 1, 1}, (NDArrayHandle[]){x, L, L}, 0)); /* 1 + 6 + 6 */
  CHECK_PULL(kv, 1, 2, 13, 13);
  CHECK_OK(MXKVStorePush(kv, 1, &k1, &L, 0)); /* onto itself */
  CHECK_PULL(kv, 1, 2, 13, 13);
  CHECK_OK(MXKVStorePull(kv, 1, &k1, &L, 0)); /* into itself */
  CHECK_OK(MXKVStorePushPull(kv, 1, &k1, 1, &k1, &L, &L, 0));
  CHECK_F32(L, 2, 13, 13);
  CHECK_OK(MXKVStoreInit(kv, 1, &k2, &L)); /* a copy */
  CHECK_OK(MXKVStorePush(kv, 1, &k1, &x, 0));
  CHECK_PULL(kv, 2, 2, 13, 13);
  CHECK_F32(L, 2, 1, 1);
  still_works();
  /* the kept handle outlives the store */
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_F32(L, 2, 1, 1);
  NDArrayHandle hs[3] = {x, y, L};
  free_all(hs, 3);
}

/* MXNDArraySyncCheckFormat without full_check still compares the number of
   indices with the rows of data (MXNet: kRSPShapeErr, "Shape mismatch of this
   row_sparse NDArray"). */
static void test_check_format_shape(void) {
  KVStoreHandle kv = new_store("local");
  use_store(kv, false);
  const float d4[4] = {5, 5, 6, 6};
  NDArrayHandle mism = make_rsp(4, 2, (int64_t[]){0, 2}, 2, d4);
  NDArrayHandle three = make_typed(3, DT_I64, (int64_t[]){0, 1, 2});
  CHECK_OK(MXNDArraySyncCopyFromNDArray(mism, three, 0));
  BAD(MXNDArraySyncCheckFormat(mism, false), "MXNDArraySyncCheckFormat: ");
  BAD(MXNDArraySyncCheckFormat(mism, false), "Shape mismatch of this row_sparse NDArray");
  BAD(MXNDArraySyncCheckFormat(mism, true), "Shape mismatch of this row_sparse NDArray");
  CHECK_OK(MXNDArrayFree(mism));
  CHECK_OK(MXNDArrayFree(three));
  CHECK_OK(MXKVStoreFree(kv));
}

/* ------------------------------------------------------------------- main */

int main(void) {
  static const char *dmlc[] = {"DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                               "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_PS_VAN_TYPE"};
  for (size_t i = 0; i < sizeof dmlc / sizeof dmlc[0]; i++) unsetenv(dmlc[i]);
  live_t start = live_now();

  test_bad_kv_handles();
  CHECK_LIVE(start);
  test_bad_nd_handles();
  CHECK_LIVE(start);
  test_null_arrays();
  CHECK_LIVE(start);
  test_uninitialised_keys("local");
  test_uninitialised_keys("device");
  CHECK_LIVE(start);
  test_null_updaters();
  CHECK_LIVE(start);
  test_push_checks("local");
  test_push_checks("device");
  CHECK_LIVE(start);
  test_all_or_nothing();
  CHECK_LIVE(start);
  test_keys_and_sparse();
  test_odd_key_updater();
  CHECK_LIVE(start);
  test_sparse_and_compression("local");
  test_sparse_and_compression("device");
  CHECK_LIVE(start);
  test_create_args();
  CHECK_LIVE(start);
  test_copies();
  CHECK_LIVE(start);
  test_params_files();
  CHECK_LIVE(start);
  test_hostile_updaters();
  CHECK_LIVE(start);
  test_aliasing("local");
  test_aliasing("device");
  CHECK_LIVE(start);
  test_check_format_shape();
  CHECK_LIVE(start);
  printf("test_bad_input: OK\n");
  return 0;
}
