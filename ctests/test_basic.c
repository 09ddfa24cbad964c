/*
 * Happy paths through the C API: every KVStore and NDArray entry point at
 * least once, with the behaviour README.md describes (MXNet 1.9.1's, or a
 * listed deviation), and the NDArray table. Every handle made here is freed; the live-handle
 * counts (mxkv_live_handles) are back at their starting values at the end.
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind). By hand,
 * after `make build` (which stages build/lib/libmxkv.so.0, the soname):
 *   gcc -std=c11 -Wall -Wextra -Wpedantic -Werror -D_GNU_SOURCE -Iinclude \
 *       ctests/test_basic.c -Lbuild/lib -lmxkv -Wl,-rpath,$PWD/build/lib \
 *       -lpthread -o /tmp/test_basic && /tmp/test_basic
 */
#include "check.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

static live_t g_start;

/* ---------------------------------------------------------------- helpers */

static size_t nd_size(NDArrayHandle h) {
  int ndim = 0;
  const int64_t *dims = NULL;
  CHECK_OK(MXNDArrayGetShapeEx64(h, &ndim, &dims));
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)dims[i];
  return n;
}

static void free_all(NDArrayHandle *hs, size_t n) {
  for (size_t i = 0; i < n; i++) CHECK_OK(MXNDArrayFree(hs[i]));
}

/* An updater log: what the callbacks saw. */
#define MAX_CALLS 64
typedef struct {
  int calls;
  int keys[MAX_CALLS];
  char skeys[MAX_CALLS][16];
  float recv0[MAX_CALLS]; /* first element of recv at the call */
  NDArrayHandle recv[MAX_CALLS], local[MAX_CALLS];
  void *user[MAX_CALLS];
  bool other_thread;
  float scale; /* local += scale * recv */
  bool noop;   /* leave local alone */
  bool keep;   /* keep the handles (the test frees them later) */
} upd_log;

static upd_log *g_log;
static pthread_t g_main_thread;

static void apply_update(NDArrayHandle recv, NDArrayHandle local, float scale) {
  size_t n = nd_size(local);
  CHECK(n == nd_size(recv) && n <= 64);
  float r[64], l[64];
  read_f32(recv, r, n);
  read_f32(local, l, n);
  for (size_t i = 0; i < n; i++) l[i] += scale * r[i];
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, l, n));
}

static void log_call(upd_log *lg, int key, const char *skey, NDArrayHandle recv,
                     NDArrayHandle local, void *user) {
  CHECK(lg->calls < MAX_CALLS);
  int i = lg->calls++;
  lg->keys[i] = key;
  snprintf(lg->skeys[i], sizeof lg->skeys[i], "%s", skey ? skey : "");
  lg->recv[i] = recv;
  lg->local[i] = local;
  lg->user[i] = user;
  if (!pthread_equal(pthread_self(), g_main_thread)) lg->other_thread = true;
  float r[64];
  size_t n = nd_size(recv);
  CHECK(n >= 1 && n <= 64);
  read_f32(recv, r, n);
  lg->recv0[i] = r[0];
  if (!lg->noop) apply_update(recv, local, lg->scale);
  if (!lg->keep) {
    CHECK_OK(MXNDArrayFree(recv));
    CHECK_OK(MXNDArrayFree(local));
  }
}

static void int_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  log_call(g_log, key, NULL, recv, local, user);
}

static void str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  log_call(g_log, INT_MIN, key, recv, local, user);
}

static KVStoreHandle new_store(const char *type) {
  KVStoreHandle kv = NULL;
  CHECK_OK(MXKVStoreCreate(type, &kv));
  CHECK(kv != NULL);
  return kv;
}

/* ------------------------------------------------------------------ tests */

static void test_version_and_errors(void) {
  const char *e = MXGetLastError();
  CHECK(e != NULL);
  int v = 0;
  CHECK_OK(MXGetVersion(&v));
  CHECK(v == 10901);
  /* A failing call sets the message; a later success does not clear it. */
  KVStoreHandle kv = NULL;
  CHECK_ERR(MXKVStoreCreate("nccl", &kv), "NCCL");
  CHECK_OK(MXGetVersion(&v));
  CHECK(strstr(MXGetLastError(), "NCCL") != NULL);
}

/* The KVStore tutorial sequence (README / examples/tutorial.c). */
static void test_tutorial(void) {
  KVStoreHandle kv = new_store("local");
  const uint32_t shape[] = {2, 3};
  const float twos[6] = {2, 2, 2, 2, 2, 2}, eights[6] = {8, 8, 8, 8, 8, 8};
  const float ones[6] = {1, 1, 1, 1, 1, 1};
  NDArrayHandle a = make_f32_shape(shape, 2, twos);
  int k3 = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &k3, &a));
  NDArrayHandle out = make_f32_shape(shape, 2, NULL);
  CHECK_OK(MXKVStorePull(kv, 1, &k3, &out, 0));
  CHECK_F32(out, 6, 2, 2, 2, 2, 2, 2);

  NDArrayHandle e8 = make_f32_shape(shape, 2, eights);
  CHECK_OK(MXKVStorePush(kv, 1, &k3, &e8, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &k3, &out, 0));
  CHECK_F32(out, 6, 8, 8, 8, 8, 8, 8);

  NDArrayHandle four[4];
  int k3x4[4] = {3, 3, 3, 3};
  for (int i = 0; i < 4; i++) four[i] = make_f32_shape(shape, 2, ones);
  CHECK_OK(MXKVStorePush(kv, 4, k3x4, four, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &k3, &out, 0));
  CHECK_F32(out, 6, 4, 4, 4, 4, 4, 4);

  /* updater: stored += 2 * input */
  upd_log lg = {.scale = 2};
  g_log = &lg;
  CHECK_OK(MXKVStoreSetUpdater(kv, int_updater, NULL));
  CHECK_OK(MXKVStorePush(kv, 1, &k3, &four[0], 0));
  CHECK(lg.calls == 1 && lg.keys[0] == 3);
  NDArrayHandle outs[4];
  for (int i = 0; i < 4; i++) outs[i] = make_f32_shape(shape, 2, NULL);
  CHECK_OK(MXKVStorePull(kv, 4, k3x4, outs, 0));
  for (int i = 0; i < 4; i++) CHECK_F32(outs[i], 6, 6, 6, 6, 6, 6, 6);

  /* keys 5, 7, 9, each pushed four ones: 1 + 2*4 = 9 */
  int keys[3] = {5, 7, 9};
  NDArrayHandle init3[3] = {four[0], four[1], four[2]};
  CHECK_OK(MXKVStoreInit(kv, 3, keys, init3));
  int pkeys[12];
  NDArrayHandle pvals[12];
  for (int i = 0; i < 12; i++) {
    pkeys[i] = keys[i / 4];
    pvals[i] = four[i % 4];
  }
  lg.calls = 0;
  CHECK_OK(MXKVStorePush(kv, 12, pkeys, pvals, 0));
  CHECK(lg.calls == 3 && lg.keys[0] == 5 && lg.keys[1] == 7 && lg.keys[2] == 9);
  CHECK(lg.recv0[0] == 4 && lg.recv0[1] == 4 && lg.recv0[2] == 4);
  NDArrayHandle outs3[3] = {outs[0], outs[1], outs[2]};
  CHECK_OK(MXKVStorePull(kv, 3, keys, outs3, 0));
  for (int i = 0; i < 3; i++) CHECK_F32(outs3[i], 6, 9, 9, 9, 9, 9, 9);

  free_all(four, 4);
  free_all(outs, 4);
  CHECK_OK(MXNDArrayFree(a));
  CHECK_OK(MXNDArrayFree(e8));
  CHECK_OK(MXNDArrayFree(out));
  CHECK_OK(MXKVStoreFree(kv));
  g_log = NULL;
}

/* §1: type strings, GetType, and which communicator (seen in sum order). */
static void test_types(void) {
  static const struct {
    const char *type, *shown;
    bool device;
  } cases[] = {
      {"local", "local", false},
      {"LOCAL", "local", false},
      {"local_update_cpu", "local_update_cpu", false},
      {"Local_AllReduce_CPU", "local_allreduce_cpu", false},
      {"foo", "foo", false},
      {"", "", false},
      {"device", "device", true},
      {"Device_Sync", "device_sync", true},
      {"local_allreduce_device", "local_allreduce_device", true},
      {"xDEVICEx", "xdevicex", true},
      {"\xff" "LOCAL" "\xfe", "\xff" "local" "\xfe", false}, /* bytes, not UTF-8 */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    KVStoreHandle kv = new_store(cases[c].type);
    const char *t = NULL;
    CHECK_OK(MXKVStoreGetType(kv, &t));
    if (t == NULL || strcmp(t, cases[c].shown) != 0) {
      fprintf(stderr, "GetType of \"%s\": \"%s\", want \"%s\"\n", cases[c].type, t ? t : "(NULL)",
              cases[c].shown);
      exit(1);
    }
    /* [1, 1e8, -1e8]: local gives 1 (v0 + group of four), device 0 (left to right).
       [1e8, 1, 1, -1e8, 1]: local 0, device 1. */
    const float z = 0, v1 = 1, big = 1e8f, nbig = -1e8f;
    NDArrayHandle init = make_f32(1, &z);
    int k = 0;
    CHECK_OK(MXKVStoreInit(kv, 1, &k, &init));
    NDArrayHandle a = make_f32(1, &v1), b = make_f32(1, &big), n = make_f32(1, &nbig);
    NDArrayHandle three[3] = {a, b, n};
    int kk[5] = {0, 0, 0, 0, 0};
    CHECK_OK(MXKVStorePush(kv, 3, kk, three, 0));
    CHECK_PULL(kv, 0, 1, cases[c].device ? 0.0f : 1.0f);
    NDArrayHandle five[5] = {b, a, a, n, a};
    CHECK_OK(MXKVStorePush(kv, 5, kk, five, 0));
    CHECK_PULL(kv, 0, 1, cases[c].device ? 1.0f : 0.0f);
    /* the type string stays valid until Free */
    CHECK(strcmp(t, cases[c].shown) == 0);
    NDArrayHandle hs[4] = {init, a, b, n};
    free_all(hs, 4);
    CHECK_OK(MXKVStoreFree(kv));
  }
}

/* §2–§4: int keys (negative too), many values per key, sums of 2–16 values,
   num == 0 calls, priorities, init copies. */
static void test_int_keys_and_sums(const char *type) {
  KVStoreHandle kv = new_store(type);
  CHECK_OK(MXKVStoreInit(kv, 0, NULL, NULL));
  CHECK_OK(MXKVStorePush(kv, 0, NULL, NULL, 0));
  CHECK_OK(MXKVStorePull(kv, 0, NULL, NULL, 0));
  CHECK_OK(MXKVStorePushPull(kv, 0, NULL, 0, NULL, NULL, NULL, 0));
  CHECK_OK(MXKVStoreBroadcast(kv, 0, NULL, 0, NULL, NULL, NULL, 0));

  const float v0[3] = {1, 2, 3};
  NDArrayHandle a = make_f32(3, v0);
  int keys[3] = {-7, INT_MIN, INT_MAX};
  NDArrayHandle vals[3] = {a, a, a};
  CHECK_OK(MXKVStoreInit(kv, 3, keys, vals));
  /* init copied: changing a changes nothing */
  const float junk[3] = {9, 9, 9};
  CHECK_OK(MXNDArraySyncCopyFromCPU(a, junk, 3));
  CHECK_PULL(kv, -7, 3, 1, 2, 3);
  CHECK_PULL(kv, INT_MIN, 3, 1, 2, 3);
  CHECK_PULL(kv, INT_MAX, 3, 1, 2, 3);

  /* sums of 2..16 values: i-th value holds i+1 (exact in float32) */
  NDArrayHandle pv[16];
  int pk[16];
  for (int i = 0; i < 16; i++) {
    const float x[3] = {(float)(i + 1), 0.5f, -1.0f};
    pv[i] = make_f32(3, x);
    pk[i] = -7;
  }
  for (uint32_t n = 2; n <= 16; n++) {
    CHECK_OK(MXKVStorePush(kv, n, pk, pv, n % 2 ? INT_MIN : INT_MAX));
    float s = (float)(n * (n + 1) / 2);
    CHECK_PULL(kv, -7, 3, s, 0.5f * (float)n, -(float)n);
  }
  /* a later push with fewer, then more values than before */
  CHECK_OK(MXKVStorePush(kv, 2, pk, pv, 0));
  CHECK_PULL(kv, -7, 3, 3, 1, -2);
  CHECK_OK(MXKVStorePush(kv, 16, pk, pv, 0));
  CHECK_PULL(kv, -7, 3, 136, 8, -16);

  /* keys interleaved in one call: each key gets its own values, in list order */
  int mixed[6] = {INT_MAX, INT_MIN, INT_MAX, -7, INT_MIN, INT_MAX};
  CHECK_OK(MXKVStorePush(kv, 6, mixed, pv, 0));
  CHECK_PULL(kv, INT_MAX, 3, 1 + 3 + 6, 1.5f, -3);
  CHECK_PULL(kv, INT_MIN, 3, 2 + 5, 1, -2);
  CHECK_PULL(kv, -7, 3, 4, 0.5f, -1);

  /* single-value push copies: changing the pushed array later changes nothing */
  CHECK_OK(MXKVStorePush(kv, 1, &keys[0], &pv[4], 0));
  CHECK_OK(MXNDArraySyncCopyFromCPU(pv[4], junk, 3));
  CHECK_PULL(kv, -7, 3, 5, 0.5f, -1);

  free_all(pv, 16);
  CHECK_OK(MXNDArrayFree(a));
  CHECK_OK(MXKVStoreFree(kv));
}

/* Every dtype: init, pull (same dtype, float32), sums (ints wrap), bool single push. */
static void test_dtypes(void) {
  KVStoreHandle kv = new_store("local");
  /* one, two and three in each dtype's bits */
  static const struct {
    int dtype;
    uint64_t one, two, three;
  } d[] = {
      {DT_F32, 0x3f800000, 0x40000000, 0x40400000},
      {DT_F64, 0x3ff0000000000000ull, 0x4000000000000000ull, 0x4008000000000000ull},
      {DT_F16, 0x3c00, 0x4000, 0x4200},
      {DT_U8, 1, 2, 3},
      {DT_I32, 1, 2, 3},
      {DT_I8, 1, 2, 3},
      {DT_I64, 1, 2, 3},
      {DT_I16, 1, 2, 3},
      {DT_U16, 1, 2, 3},
      {DT_U32, 1, 2, 3},
      {DT_U64, 1, 2, 3},
      {DT_BF16, 0x3f80, 0x4000, 0x4040},
  };
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
    int dt = d[i].dtype, key = 100 + dt;
    size_t sz = dtype_size(dt);
    unsigned char b1[8], b2[8], b3[8], got[8];
    memcpy(b1, &d[i].one, sz); /* little-endian */
    memcpy(b2, &d[i].two, sz);
    memcpy(b3, &d[i].three, sz);
    NDArrayHandle x1 = make_typed(1, dt, b1), x2 = make_typed(1, dt, b2);
    int gdt = -1;
    CHECK_OK(MXNDArrayGetDType(x1, &gdt));
    CHECK(gdt == dt);
    CHECK_OK(MXKVStoreInit(kv, 1, &key, &x1));
    NDArrayHandle out = make_typed(1, dt, NULL);
    CHECK_OK(MXKVStorePull(kv, 1, &key, &out, 0));
    CHECK_OK(MXNDArraySyncCopyToCPU(out, got, 1));
    CHECK(memcmp(got, b1, sz) == 0);
    NDArrayHandle two[2] = {x1, x2};
    int kk[2] = {key, key};
    CHECK_OK(MXKVStorePush(kv, 2, kk, two, 0));
    CHECK_OK(MXKVStorePull(kv, 1, &key, &out, 0));
    CHECK_OK(MXNDArraySyncCopyToCPU(out, got, 1));
    if (memcmp(got, b3, sz) != 0) {
      fprintf(stderr, "dtype %d: 1 + 2 != 3\n", dt);
      exit(1);
    }
    CHECK_PULL(kv, key, 1, 3.0f); /* converted into a float32 output */
    NDArrayHandle hs[3] = {x1, x2, out};
    free_all(hs, 3);
  }
  /* integer sums wrap */
  {
    const uint8_t u[2] = {200, 100};
    const int8_t s[2] = {100, 100};
    NDArrayHandle a = make_typed(1, DT_U8, &u[0]), b = make_typed(1, DT_U8, &u[1]);
    NDArrayHandle c = make_typed(1, DT_I8, &s[0]), e = make_typed(1, DT_I8, &s[1]);
    int keys[2] = {200, 201};
    NDArrayHandle iv[2] = {a, c};
    CHECK_OK(MXKVStoreInit(kv, 2, keys, iv));
    int pk[4] = {200, 201, 200, 201};
    NDArrayHandle pv[4] = {a, c, b, e};
    CHECK_OK(MXKVStorePush(kv, 4, pk, pv, 0));
    uint8_t gu = 0;
    int8_t gs = 0;
    CHECK_OK(MXKVStorePull(kv, 2, keys, (NDArrayHandle[]){a, c}, 0));
    CHECK_OK(MXNDArraySyncCopyToCPU(a, &gu, 1));
    CHECK_OK(MXNDArraySyncCopyToCPU(c, &gs, 1));
    CHECK(gu == 44 && gs == -56);
    NDArrayHandle hs[4] = {a, b, c, e};
    free_all(hs, 4);
  }
  /* bool: init, pull and single-value pushes work */
  {
    const uint8_t t = 1, f = 0;
    NDArrayHandle bt = make_typed(1, DT_BOOL, &t), bf = make_typed(1, DT_BOOL, &f);
    int key = 300;
    CHECK_OK(MXKVStoreInit(kv, 1, &key, &bf));
    CHECK_OK(MXKVStorePush(kv, 1, &key, &bt, 0));
    uint8_t g = 0;
    CHECK_OK(MXKVStorePull(kv, 1, &key, &bf, 0));
    CHECK_OK(MXNDArraySyncCopyToCPU(bf, &g, 1));
    CHECK(g == 1);
    CHECK_PULL(kv, 300, 1, 1.0f);
    NDArrayHandle hs[2] = {bt, bf};
    free_all(hs, 2);
  }
  /* later values of another dtype are converted; pull converts (truncation toward 0) */
  {
    const double d0 = 0, d1 = 1.5;
    const float f1 = 2.25f;
    NDArrayHandle a = make_typed(1, DT_F64, &d0), b = make_typed(1, DT_F64, &d1);
    NDArrayHandle c = make_typed(1, DT_F32, &f1);
    int key = 400;
    CHECK_OK(MXKVStoreInit(kv, 1, &key, &a));
    int kk[2] = {key, key};
    CHECK_OK(MXKVStorePush(kv, 2, kk, (NDArrayHandle[]){b, c}, 0));
    double g = 0;
    CHECK_OK(MXKVStorePull(kv, 1, &key, &a, 0));
    CHECK_OK(MXNDArraySyncCopyToCPU(a, &g, 1));
    CHECK(g == 3.75);

    const float fv[3] = {1.7f, -2.7f, 3.5f};
    NDArrayHandle f = make_f32(3, fv);
    int key2 = 401;
    CHECK_OK(MXKVStoreInit(kv, 1, &key2, &f));
    NDArrayHandle o32 = make_typed(3, DT_I32, NULL), o64 = make_typed(3, DT_F64, NULL);
    int k2x2[2] = {key2, key2};
    CHECK_OK(MXKVStorePull(kv, 2, k2x2, (NDArrayHandle[]){o32, o64}, 0));
    int32_t gi[3];
    double gd[3];
    CHECK_OK(MXNDArraySyncCopyToCPU(o32, gi, 3));
    CHECK_OK(MXNDArraySyncCopyToCPU(o64, gd, 3));
    CHECK(gi[0] == 1 && gi[1] == -2 && gi[2] == 3);
    CHECK(gd[0] == (double)1.7f && gd[1] == (double)-2.7f && gd[2] == 3.5);
    NDArrayHandle hs[6] = {a, b, c, f, o32, o64};
    free_all(hs, 6);
  }
  CHECK_OK(MXKVStoreFree(kv));
}

/* §2, §6: string keys, internal ids, updaters (int and string), callback contract. */
static void test_string_keys_and_updaters(void) {
  KVStoreHandle kv = new_store("local");
  const float one = 1, two = 2, three = 3;
  NDArrayHandle a = make_f32(1, &one), b = make_f32(1, &two), c = make_f32(1, &three);
  const char *ba[2] = {"b", "a"};
  CHECK_OK(MXKVStoreInitEx(kv, 2, ba, (NDArrayHandle[]){a, b}));
  const char *ck[1] = {"c"};
  CHECK_OK(MXKVStoreInitEx(kv, 1, ck, &c));
  CHECK_PULL_EX(kv, "b", 1, 1);
  CHECK_PULL_EX(kv, "a", 1, 2);
  CHECK_PULL_EX(kv, "c", 1, 3);

  /* default assign with string keys; two values for "a" are summed */
  const char *push4[4] = {"c", "a", "b", "a"};
  CHECK_OK(MXKVStorePushEx(kv, 4, push4, (NDArrayHandle[]){a, a, b, c}, 0));
  CHECK_PULL_EX(kv, "c", 1, 1);
  CHECK_PULL_EX(kv, "a", 1, 4);
  CHECK_PULL_EX(kv, "b", 1, 2);

  /* int-only updater on a string store: internal ids b=0, a=1, c=2, ascending */
  upd_log lg = {.scale = 10};
  g_log = &lg;
  CHECK_OK(MXKVStoreSetUpdater(kv, int_updater, (void *)0x1234));
  CHECK_OK(MXKVStorePushEx(kv, 4, push4, (NDArrayHandle[]){a, a, b, c}, 0));
  CHECK(lg.calls == 3);
  CHECK(lg.keys[0] == 0 && lg.keys[1] == 1 && lg.keys[2] == 2);
  CHECK(lg.recv0[0] == 2 && lg.recv0[1] == 4 && lg.recv0[2] == 1);
  CHECK(lg.user[0] == (void *)0x1234);
  CHECK(!lg.other_thread);
  CHECK_PULL_EX(kv, "b", 1, 22);
  CHECK_PULL_EX(kv, "a", 1, 44);
  CHECK_PULL_EX(kv, "c", 1, 11);

  /* SetUpdaterEx with a string updater: the strings come back */
  upd_log ls = {.scale = 1};
  g_log = &ls;
  CHECK_OK(MXKVStoreSetUpdaterEx(kv, int_updater, str_updater, (void *)0x99));
  CHECK_OK(MXKVStorePushEx(kv, 4, push4, (NDArrayHandle[]){a, a, b, c}, 0));
  CHECK(ls.calls == 3);
  CHECK(strcmp(ls.skeys[0], "b") == 0 && strcmp(ls.skeys[1], "a") == 0 &&
        strcmp(ls.skeys[2], "c") == 0);
  CHECK(ls.keys[0] == INT_MIN && ls.user[2] == (void *)0x99);
  CHECK_PULL_EX(kv, "b", 1, 24);
  CHECK_PULL_EX(kv, "a", 1, 48);
  CHECK_PULL_EX(kv, "c", 1, 12);

  /* SetUpdaterEx with a NULL string updater: ids reach the int updater */
  upd_log li = {.scale = 0};
  g_log = &li;
  CHECK_OK(MXKVStoreSetUpdaterEx(kv, int_updater, NULL, NULL));
  const char *ck2[1] = {"c"};
  CHECK_OK(MXKVStorePushEx(kv, 1, ck2, &a, 0));
  CHECK(li.calls == 1 && li.keys[0] == 2);
  CHECK_PULL_EX(kv, "c", 1, 12);

  /* PushPullEx, BroadcastEx, PullWithSparseEx, the empty string as a key */
  g_log = &lg;
  lg = (upd_log){.scale = 1};
  NDArrayHandle out = make_f32(1, NULL), out2 = make_f32(1, NULL);
  const char *ak[1] = {"a"};
  CHECK_OK(MXKVStorePushPullEx(kv, 1, ak, 1, ak, &b, &out, 0));
  CHECK_F32(out, 1, 50);
  const char *nk[2] = {"", "new"};
  const char *ok3[3] = {"new", "", "b"};
  CHECK_OK(MXKVStoreBroadcastEx(kv, 2, nk, 3, ok3, (NDArrayHandle[]){c, b},
                                (NDArrayHandle[]){out, out2, a}, 0));
  CHECK_F32(out, 1, 2);
  CHECK_F32(out2, 1, 3);
  CHECK_F32(a, 1, 24);
  CHECK_OK(MXKVStorePullWithSparseEx(kv, 1, ak, &out, 0, false));
  CHECK_F32(out, 1, 50);
  CHECK_OK(MXKVStorePullWithSparseEx(kv, 1, ak, &out, 0, true));
  CHECK_F32(out, 1, 50);

  NDArrayHandle hs[5] = {a, b, c, out, out2};
  free_all(hs, 5);
  CHECK_OK(MXKVStoreFree(kv));
  g_log = NULL;
}

/* §6: updater contract details: once per distinct key per call, fresh
   handles owned by the callee and valid after the call, no-op updater,
   replacement, arithmetic of the spec example. */
static void test_updater_contract(void) {
  KVStoreHandle kv = new_store("local");
  const float two = 2, four = 4, five = 5, three = 3;
  NDArrayHandle v2 = make_f32(1, &two), v4 = make_f32(1, &four), v5 = make_f32(1, &five);
  int k3 = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &k3, &v2));
  upd_log lg = {.scale = 10};
  g_log = &lg;
  CHECK_OK(MXKVStoreSetUpdater(kv, int_updater, NULL));
  int kk[3] = {3, 3, 3};
  CHECK_OK(MXKVStorePush(kv, 3, kk, (NDArrayHandle[]){v2, v4, v5}, 0));
  CHECK(lg.calls == 1 && lg.recv0[0] == 11);
  CHECK_PULL(kv, 3, 1, 112);

  /* handles kept past the push stay valid; they are new and distinct */
  upd_log keep = {.scale = 1, .keep = true};
  g_log = &keep;
  NDArrayHandle four_h = make_f32(1, &four), three_h = make_f32(1, &three);
  int k1 = 1;
  CHECK_OK(MXKVStoreInit(kv, 1, &k1, &four_h));
  live_t before = live_now();
  CHECK_OK(MXKVStorePush(kv, 1, &k1, &three_h, 0));
  live_t after = live_now();
  CHECK(after.ndarrays == before.ndarrays + 2);
  CHECK(keep.calls == 1);
  NDArrayHandle r = keep.recv[0], l = keep.local[0];
  CHECK(r != l && r != three_h && l != four_h && r != four_h && l != three_h);
  CHECK_F32(r, 1, 3);
  CHECK_F32(l, 1, 7);
  /* local shares storage with the stored value */
  CHECK_PULL(kv, 1, 1, 7);
  const float hundred = 100;
  CHECK_OK(MXNDArraySyncCopyFromCPU(l, &hundred, 1));
  CHECK_PULL(kv, 1, 1, 100);
  CHECK_OK(MXNDArrayFree(r));
  CHECK_OK(MXNDArrayFree(l));
  CHECK_LIVE(before);

  /* a no-op updater leaves the value unchanged; replacing the updater works */
  upd_log noop = {.noop = true};
  g_log = &noop;
  CHECK_OK(MXKVStoreSetUpdater(kv, int_updater, NULL));
  CHECK_OK(MXKVStorePush(kv, 1, &k1, &three_h, 0));
  CHECK(noop.calls == 1);
  CHECK_PULL(kv, 1, 1, 100);

  /* PushPull with an updater: updater once, then the pull */
  upd_log pp = {.scale = 1};
  g_log = &pp;
  CHECK_OK(MXKVStoreSetUpdater(kv, int_updater, NULL));
  NDArrayHandle out = make_f32(1, NULL);
  CHECK_OK(MXKVStorePushPull(kv, 2, (int[]){1, 1}, 1, &k1, (NDArrayHandle[]){three_h, three_h},
                             &out, 0));
  CHECK(pp.calls == 1 && pp.recv0[0] == 6);
  CHECK_F32(out, 1, 106);

  NDArrayHandle hs[6] = {v2, v4, v5, four_h, three_h, out};
  free_all(hs, 6);
  CHECK_OK(MXKVStoreFree(kv));
  g_log = NULL;
}

/* An updater that calls back into the API: pulls its own key, pushes another. */
static KVStoreHandle g_reentrant_kv;
static int g_reentrant_calls;
static void reentrant_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  (void)user;
  g_reentrant_calls++;
  float r, cur;
  read_f32(recv, &r, 1);
  NDArrayHandle out = make_f32(1, NULL);
  CHECK_OK(MXKVStorePull(g_reentrant_kv, 1, &key, &out, 0));
  read_f32(out, &cur, 1);
  float l;
  read_f32(local, &l, 1);
  CHECK(cur == l);
  float nv = cur + r;
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, &nv, 1));
  if (key == 10) {
    /* push r to key 11 (whose update assigns old + r) */
    int k11 = 11;
    CHECK_OK(MXKVStorePush(g_reentrant_kv, 1, &k11, &recv, 0));
    /* pull the same key again: sees the new value */
    CHECK_OK(MXKVStorePull(g_reentrant_kv, 1, &key, &out, 0));
    read_f32(out, &cur, 1);
    CHECK(cur == nv);
  }
  CHECK_OK(MXNDArrayFree(out));
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void test_reentrant_updater(const char *type) {
  KVStoreHandle kv = new_store(type);
  g_reentrant_kv = kv;
  g_reentrant_calls = 0;
  const float one = 1, ten = 10;
  NDArrayHandle a = make_f32(1, &one), b = make_f32(1, &ten);
  int keys[2] = {10, 11};
  CHECK_OK(MXKVStoreInit(kv, 2, keys, (NDArrayHandle[]){a, b}));
  CHECK_OK(MXKVStoreSetUpdater(kv, reentrant_updater, NULL));
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){10, 10}, (NDArrayHandle[]){a, a}, 0));
  CHECK(g_reentrant_calls == 2);
  CHECK_PULL(kv, 10, 1, 3);
  CHECK_PULL(kv, 11, 1, 12);
  CHECK_OK(MXKVStorePush(kv, 2, keys, (NDArrayHandle[]){b, b}, 0));
  CHECK(g_reentrant_calls == 5);
  CHECK_PULL(kv, 10, 1, 13);
  CHECK_PULL(kv, 11, 1, 32);
  NDArrayHandle hs[2] = {a, b};
  free_all(hs, 2);
  CHECK_OK(MXKVStoreFree(kv));
}

/* §5, §7, §8: pull into several outputs and contexts, PushPull in place,
   Broadcast, PullWithSparse, empty arrays. */
static void test_pull_pushpull_broadcast(void) {
  KVStoreHandle kv = new_store("local");
  const float z2[2] = {0, 0}, a2[2] = {1, 2}, b2[2] = {10, 20};
  NDArrayHandle zero = make_f32(2, z2);
  int k5 = 5;
  CHECK_OK(MXKVStoreInit(kv, 1, &k5, &zero));
  /* PushPull in place: outs are the very arrays pushed */
  NDArrayHandle a = make_f32(2, a2), b = make_f32(2, b2);
  int kk[2] = {5, 5};
  NDArrayHandle ab[2] = {a, b};
  CHECK_OK(MXKVStorePushPull(kv, 2, kk, 2, kk, ab, ab, 0));
  CHECK_F32(a, 2, 11, 22);
  CHECK_F32(b, 2, 11, 22);
  /* onum == 0: push only */
  CHECK_OK(MXKVStorePushPull(kv, 1, &k5, 0, NULL, &a, NULL, 0));
  CHECK_PULL(kv, 5, 2, 11, 22);

  /* Broadcast new keys, pull them and an older key; outputs on other contexts */
  uint32_t n2 = 2;
  NDArrayHandle o1 = NULL, o2 = NULL, o3 = NULL;
  CHECK_OK(MXNDArrayCreate(&n2, 1, DEV_CPU, 1, 0, &o1));
  CHECK_OK(MXNDArrayCreateEx(&n2, 1, DEV_CPU_PINNED, 0, 0, DT_F64, &o2));
  CHECK_OK(MXNDArrayCreateEx(&n2, 1, DEV_CPU_SHARED, 3, 1, DT_I32, &o3));
  int vk[2] = {20, 21}, okk[3] = {21, 5, 20};
  CHECK_OK(MXKVStoreBroadcast(kv, 2, vk, 3, okk, (NDArrayHandle[]){b, zero},
                              (NDArrayHandle[]){o1, o2, o3}, 0));
  CHECK_F32(o1, 2, 0, 0);
  double gd[2];
  int32_t gi[2];
  CHECK_OK(MXNDArraySyncCopyToCPU(o2, gd, 2));
  CHECK_OK(MXNDArraySyncCopyToCPU(o3, gi, 2));
  CHECK(gd[0] == 11 && gd[1] == 22 && gi[0] == 11 && gi[1] == 22);
  CHECK_PULL(kv, 20, 2, 11, 22);
  int dev_type = 0, dev_id = -1;
  CHECK_OK(MXNDArrayGetContext(o3, &dev_type, &dev_id));
  CHECK(dev_type == DEV_CPU_SHARED && dev_id == 3);

  /* pull one key into several outputs, [5, 5, 20] */
  int pk[3] = {5, 5, 20};
  NDArrayHandle po[3] = {o1, a, b};
  CHECK_OK(MXKVStorePull(kv, 3, pk, po, 0));
  CHECK_F32(o1, 2, 11, 22);
  CHECK_F32(a, 2, 11, 22);
  CHECK_F32(b, 2, 11, 22);
  /* outputs are copies */
  CHECK_OK(MXNDArraySyncCopyFromCPU(a, z2, 2));
  CHECK_PULL(kv, 5, 2, 11, 22);
  CHECK_OK(MXKVStorePullWithSparse(kv, 1, &k5, &a, 0, false));
  CHECK_F32(a, 2, 11, 22);
  CHECK_OK(MXKVStorePullWithSparse(kv, 1, &k5, &b, INT_MIN, true));
  CHECK_F32(b, 2, 11, 22);

  /* empty arrays */
  uint32_t e0 = 0, e2[2] = {2, 0};
  NDArrayHandle em = NULL, em2 = NULL;
  CHECK_OK(MXNDArrayCreateEx(&e0, 1, DEV_CPU, 0, 0, DT_F32, &em));
  CHECK_OK(MXNDArrayCreateEx(e2, 2, DEV_CPU, 0, 0, DT_I64, &em2));
  CHECK_OK(MXNDArraySyncCopyFromCPU(em, NULL, 0));
  CHECK_OK(MXNDArraySyncCopyToCPU(em, NULL, 0));
  int ek[2] = {30, 31};
  CHECK_OK(MXKVStoreInit(kv, 2, ek, (NDArrayHandle[]){em, em2}));
  CHECK_OK(MXKVStorePush(kv, 3, (int[]){30, 30, 31}, (NDArrayHandle[]){em, em, em2}, 0));
  CHECK_OK(MXKVStorePull(kv, 2, ek, (NDArrayHandle[]){em, em2}, 0));

  /* freeing the store leaves the caller's arrays valid */
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_F32(o1, 2, 11, 22);
  CHECK_F32(zero, 2, 0, 0);

  NDArrayHandle hs[8] = {zero, a, b, o1, o2, o3, em, em2};
  free_all(hs, 8);
}

/* The NDArray functions: create variants, shapes, dtypes, contexts,
   storage types, data pointers, copies, waits. */
static void test_ndarray(void) {
  uint32_t s23[2] = {2, 3};
  int64_t s23_64[2] = {2, 3};
  NDArrayHandle a = NULL, b = NULL, c = NULL, none = NULL, d = NULL;
  CHECK_OK(MXNDArrayCreate(s23, 2, DEV_CPU, 0, 1, &a));
  CHECK_OK(MXNDArrayCreateEx(s23, 2, DEV_CPU_PINNED, 0, 0, DT_F64, &b));
  CHECK_OK(MXNDArrayCreateEx64(s23_64, 2, DEV_CPU, 2, 0, DT_F32, &c));
  CHECK_OK(MXNDArrayCreateNone(&none));
  CHECK(a && b && c && none && a != b && b != c);

  /* zero-filled */
  CHECK_F32(a, 6, 0, 0, 0, 0, 0, 0);
  const float v[6] = {1, 2, 3, 4, 5, 6};
  CHECK_OK(MXNDArraySyncCopyFromCPU(a, v, 6));
  CHECK_F32(a, 6, 1, 2, 3, 4, 5, 6);

  /* shapes, three ways */
  uint32_t ndim = 0;
  const uint32_t *pd = NULL;
  CHECK_OK(MXNDArrayGetShape(a, &ndim, &pd));
  CHECK(ndim == 2 && pd[0] == 2 && pd[1] == 3);
  int indim = 0;
  const int *ipd = NULL;
  CHECK_OK(MXNDArrayGetShapeEx(b, &indim, &ipd));
  CHECK(indim == 2 && ipd[0] == 2 && ipd[1] == 3);
  const int64_t *lpd = NULL;
  CHECK_OK(MXNDArrayGetShapeEx64(c, &indim, &lpd));
  CHECK(indim == 2 && lpd[0] == 2 && lpd[1] == 3);

  int dt = -1, st = -9, dev = 0, id = -1;
  CHECK_OK(MXNDArrayGetDType(a, &dt));
  CHECK(dt == DT_F32);
  CHECK_OK(MXNDArrayGetDType(b, &dt));
  CHECK(dt == DT_F64);
  CHECK_OK(MXNDArrayGetContext(b, &dev, &id));
  CHECK(dev == DEV_CPU_PINNED && id == 0);
  CHECK_OK(MXNDArrayGetContext(c, &dev, &id));
  CHECK(dev == DEV_CPU && id == 2);
  CHECK_OK(MXNDArrayGetStorageType(a, &st));
  CHECK(st == 0);
  CHECK_OK(MXNDArrayGetStorageType(none, &st));
  CHECK(st == -1);

  /* all dtype codes */
  for (int code = 0; code <= 12; code++) {
    NDArrayHandle t = NULL;
    CHECK_OK(MXNDArrayCreateEx(s23, 2, DEV_CPU, 0, 0, code, &t));
    CHECK_OK(MXNDArrayGetDType(t, &dt));
    CHECK(dt == code);
    unsigned char buf[6 * 8], zeros[6 * 8] = {0};
    CHECK_OK(MXNDArraySyncCopyToCPU(t, buf, 6));
    CHECK(memcmp(buf, zeros, 6 * dtype_size(code)) == 0);
    CHECK_OK(MXNDArrayFree(t));
  }

  /* GetData: a pointer to the data, readable and writable */
  void *p = NULL;
  CHECK_OK(MXNDArrayGetData(a, &p));
  CHECK(p != NULL);
  const float *fp = p;
  for (int i = 0; i < 6; i++) CHECK(fp[i] == v[i]);
  ((float *)p)[5] = 60;
  CHECK_F32(a, 6, 1, 2, 3, 4, 5, 60);

  /* GetDataNDArray: a new handle sharing memory */
  CHECK_OK(MXNDArrayGetDataNDArray(a, &d));
  CHECK(d != NULL && d != a);
  CHECK_F32(d, 6, 1, 2, 3, 4, 5, 60);
  const float w[6] = {-1, -2, -3, -4, -5, -6};
  CHECK_OK(MXNDArraySyncCopyFromCPU(d, w, 6));
  CHECK_F32(a, 6, -1, -2, -3, -4, -5, -6);
  void *pd2 = NULL;
  CHECK_OK(MXNDArrayGetData(d, &pd2));
  CHECK(pd2 == p);
  CHECK_OK(MXNDArrayFree(a));
  CHECK_F32(d, 6, -1, -2, -3, -4, -5, -6); /* still valid through the other handle */

  /* SyncCopyFromNDArray converts the dtype */
  CHECK_OK(MXNDArraySyncCopyFromNDArray(b, d, -1));
  double gd[6];
  CHECK_OK(MXNDArraySyncCopyToCPU(b, gd, 6));
  for (int i = 0; i < 6; i++) CHECK(gd[i] == -(double)(i + 1));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(c, b, -1));
  CHECK_F32(c, 6, -1, -2, -3, -4, -5, -6);

  /* waits */
  CHECK_OK(MXNDArrayWaitToRead(c));
  CHECK_OK(MXNDArrayWaitToWrite(c));
  CHECK_OK(MXNDArrayWaitAll());

  NDArrayHandle hs[4] = {b, c, none, d};
  free_all(hs, 4);
}

/* .params: byte layout of the spec's 157-byte example, round trips. */
static size_t put(unsigned char *buf, size_t at, const void *x, size_t n) {
  memcpy(buf + at, x, n);
  return at + n;
}

static void read_file(const char *path, unsigned char *buf, size_t cap, size_t *len) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  *len = fread(buf, 1, cap, f);
  CHECK(fgetc(f) == EOF);
  fclose(f);
}

static void make_temp(char *path, size_t cap) {
  const char *dir = getenv("TMPDIR");
  snprintf(path, cap, "%s/mxkv_test_XXXXXX", dir && *dir ? dir : "/tmp");
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
}

static void test_save_load(void) {
  char p1[4096], p2[4096], p3[4096];
  make_temp(p1, sizeof p1);
  make_temp(p2, sizeof p2);
  make_temp(p3, sizeof p3);

  const float wv[6] = {1, 2, 3, 4, 5, 6};
  uint32_t s23[2] = {2, 3};
  NDArrayHandle w = make_f32_shape(s23, 2, wv);
  const int64_t bv = 7;
  NDArrayHandle bias = make_typed(1, DT_I64, &bv);
  NDArrayHandle args[2] = {w, bias};
  const char *names[2] = {"w", "bias"};
  CHECK_OK(MXNDArraySave(p1, 2, args, names));

  /* expected bytes */
  unsigned char want[256];
  size_t n = 0;
  const uint64_t magic = 0x112, zero64 = 0, two64 = 2, one64 = 1, four64 = 4;
  const uint32_t amagic = 0xF993FAC9u;
  const int32_t st0 = 0, nd2 = 2, nd1 = 1, cpu = 1, id0 = 0, f32 = 0, i64 = 6;
  const int64_t d2 = 2, d3 = 3, d1 = 1;
  n = put(want, n, &magic, 8);
  n = put(want, n, &zero64, 8);
  n = put(want, n, &two64, 8);
  n = put(want, n, &amagic, 4);
  n = put(want, n, &st0, 4);
  n = put(want, n, &nd2, 4);
  n = put(want, n, &d2, 8);
  n = put(want, n, &d3, 8);
  n = put(want, n, &cpu, 4);
  n = put(want, n, &id0, 4);
  n = put(want, n, &f32, 4);
  n = put(want, n, wv, 24);
  n = put(want, n, &amagic, 4);
  n = put(want, n, &st0, 4);
  n = put(want, n, &nd1, 4);
  n = put(want, n, &d1, 8);
  n = put(want, n, &cpu, 4);
  n = put(want, n, &id0, 4);
  n = put(want, n, &i64, 4);
  n = put(want, n, &bv, 8);
  n = put(want, n, &two64, 8);
  n = put(want, n, &one64, 8);
  n = put(want, n, "w", 1);
  n = put(want, n, &four64, 8);
  n = put(want, n, "bias", 4);
  CHECK(n == 157);
  unsigned char got[4096], got2[4096];
  size_t glen = 0, glen2 = 0;
  read_file(p1, got, sizeof got, &glen);
  CHECK(glen == 157 && memcmp(got, want, 157) == 0);

  /* load it back */
  uint32_t cnt = 0, ncnt = 0;
  NDArrayHandle *arr = NULL;
  const char **lnames = NULL;
  CHECK_OK(MXNDArrayLoad(p1, &cnt, &arr, &ncnt, &lnames));
  CHECK(cnt == 2 && ncnt == 2);
  CHECK(strcmp(lnames[0], "w") == 0 && strcmp(lnames[1], "bias") == 0);
  NDArrayHandle lw = arr[0], lb = arr[1];
  uint32_t ndim = 0;
  const uint32_t *pd = NULL;
  CHECK_OK(MXNDArrayGetShape(lw, &ndim, &pd));
  CHECK(ndim == 2 && pd[0] == 2 && pd[1] == 3);
  CHECK_F32(lw, 6, 1, 2, 3, 4, 5, 6);
  int dt = -1, dev = 0, id = -1;
  CHECK_OK(MXNDArrayGetDType(lb, &dt));
  CHECK(dt == DT_I64);
  int64_t gb = 0;
  CHECK_OK(MXNDArraySyncCopyToCPU(lb, &gb, 1));
  CHECK(gb == 7);
  CHECK_OK(MXNDArrayGetContext(lw, &dev, &id));
  CHECK(dev == DEV_CPU && id == 0);

  /* saving the loaded arrays gives the same bytes */
  CHECK_OK(MXNDArraySave(p2, 2, (NDArrayHandle[]){lw, lb}, names));
  read_file(p2, got2, sizeof got2, &glen2);
  CHECK(glen2 == glen && memcmp(got, got2, glen) == 0);

  /* without names: count 0 */
  CHECK_OK(MXNDArraySave(p3, 2, args, NULL));
  read_file(p3, got2, sizeof got2, &glen2);
  CHECK(glen2 == 157 - 29 + 8 && memcmp(got2, want, 128) == 0);
  uint64_t nn = 1;
  memcpy(&nn, got2 + 128, 8);
  CHECK(nn == 0);
  NDArrayHandle *arr3 = NULL;
  CHECK_OK(MXNDArrayLoad(p3, &cnt, &arr3, &ncnt, &lnames));
  CHECK(cnt == 2 && ncnt == 0);
  NDArrayHandle l3[2] = {arr3[0], arr3[1]};
  CHECK_F32(l3[0], 6, 1, 2, 3, 4, 5, 6);

  /* every dtype and other contexts round-trip; the context is saved as is */
  {
    NDArrayHandle all[13];
    char nm[13][16];
    const char *nms[13];
    for (int code = 0; code <= 12; code++) {
      unsigned char raw[3 * 8];
      for (size_t i = 0; i < sizeof raw; i++) raw[i] = (unsigned char)(i * 7 + (size_t)code);
      if (code == DT_BOOL) memset(raw, 1, sizeof raw);
      all[code] = make_typed_at(__FILE__, __LINE__, 3, code, code % 2 ? DEV_CPU_PINNED : DEV_CPU,
                                code % 3, raw);
      snprintf(nm[code], sizeof nm[code], "a%d", code);
      nms[code] = nm[code];
    }
    CHECK_OK(MXNDArraySave(p1, 13, all, nms));
    read_file(p1, got, sizeof got, &glen);
    /* context of array 1 (pinned, id 1): after header 24 + array 0 (4+4+4+8+4+4+4+12 = 44) */
    int32_t ctx[2];
    memcpy(ctx, got + 24 + 44 + 4 + 4 + 4 + 8, 8);
    CHECK(ctx[0] == DEV_CPU_PINNED && ctx[1] == 1);
    NDArrayHandle *la = NULL;
    CHECK_OK(MXNDArrayLoad(p1, &cnt, &la, &ncnt, &lnames));
    CHECK(cnt == 13 && ncnt == 13);
    NDArrayHandle loaded[13];
    memcpy(loaded, la, sizeof loaded);
    for (int code = 0; code <= 12; code++) {
      unsigned char x[24], y[24];
      CHECK(strcmp(lnames[code], nms[code]) == 0);
      CHECK_OK(MXNDArrayGetDType(loaded[code], &dt));
      CHECK(dt == code);
      CHECK_OK(MXNDArraySyncCopyToCPU(all[code], x, 3));
      CHECK_OK(MXNDArraySyncCopyToCPU(loaded[code], y, 3));
      CHECK(memcmp(x, y, 3 * dtype_size(code)) == 0);
    }
    CHECK_OK(MXNDArraySave(p2, 13, loaded, nms));
    read_file(p2, got2, sizeof got2, &glen2);
    /* identical except for the contexts (loaded arrays are on cpu(0)) */
    CHECK(glen2 == glen);
    free_all(all, 13);
    free_all(loaded, 13);
  }

  /* an empty file list */
  CHECK_OK(MXNDArraySave(p1, 0, NULL, NULL));
  read_file(p1, got, sizeof got, &glen);
  CHECK(glen == 32);
  NDArrayHandle *none = NULL;
  CHECK_OK(MXNDArrayLoad(p1, &cnt, &none, &ncnt, &lnames));
  CHECK(cnt == 0 && ncnt == 0);

  NDArrayHandle hs[6] = {w, bias, lw, lb, l3[0], l3[1]};
  free_all(hs, 6);
  unlink(p1);
  unlink(p2);
  unlink(p3);
}

/* row_sparse arrays (§4, §5, §9 and the NDArray table): parts, store values,
   row-wise sums, dense pulls, row_sparse_pull, .params round trip. */
static void read_i64(NDArrayHandle h, int64_t *out, size_t n) { CHECK_OK(MXNDArraySyncCopyToCPU(h, out, n)); }

static void check_rsp(NDArrayHandle h, uint32_t nidx, const int64_t *idx, const float *data, uint32_t cols) {
  int st = -9, dt = -1;
  CHECK_OK(MXNDArrayGetStorageType(h, &st));
  CHECK(st == 1);
  CHECK_OK(MXNDArrayGetAuxType(h, 0, &dt));
  CHECK(dt == DT_I64);
  NDArrayHandle ih = NULL, dh = NULL;
  CHECK_OK(MXNDArrayGetAuxNDArray(h, 0, &ih));
  CHECK_OK(MXNDArrayGetDataNDArray(h, &dh));
  int ndim = 0;
  const int64_t *dims = NULL;
  CHECK_OK(MXNDArrayGetShapeEx64(ih, &ndim, &dims));
  CHECK(ndim == 1 && dims[0] == nidx);
  CHECK_OK(MXNDArrayGetShapeEx64(dh, &ndim, &dims));
  CHECK(ndim == 2 && dims[0] == nidx && dims[1] == cols);
  int64_t gi[16];
  float gd[64];
  CHECK(nidx <= 16 && nidx * cols <= 64);
  read_i64(ih, gi, nidx);
  read_f32(dh, gd, (size_t)nidx * cols);
  CHECK(memcmp(gi, idx, nidx * sizeof *idx) == 0);
  CHECK(memcmp(gd, data, nidx * cols * sizeof *data) == 0);
  CHECK_OK(MXNDArrayFree(ih));
  CHECK_OK(MXNDArrayFree(dh));
}

static void test_sparse(const char *type) {
  KVStoreHandle kv = new_store(type);
  const int64_t i02[2] = {0, 2}, i01[2] = {0, 1}, i12[2] = {1, 2};
  const float d02[4] = {1, 1, 2, 2}, ones[4] = {1, 1, 1, 1}, d12[4] = {4, 4, 1, 1};
  NDArrayHandle w = make_rsp(4, 2, i02, 2, d02);
  /* the array and its parts */
  uint32_t ndim = 0;
  const uint32_t *pd = NULL;
  CHECK_OK(MXNDArrayGetShape(w, &ndim, &pd));
  CHECK(ndim == 2 && pd[0] == 4 && pd[1] == 2);
  check_rsp(w, 2, i02, d02, 2);
  CHECK_OK(MXNDArraySyncCheckFormat(w, true));
  int dt = -1;
  CHECK_OK(MXNDArrayGetAuxType64(w, 0, &dt));
  CHECK(dt == DT_I64);
  NDArrayHandle aux = NULL;
  CHECK_OK(MXNDArrayGetAuxNDArray64(w, 0, &aux));
  CHECK_OK(MXNDArrayFree(aux));
  NDArrayHandle e64 = NULL;
  const int64_t s64[2] = {5, 3}, aux64[1] = {0};
  CHECK_OK(MXNDArrayCreateSparseEx64(1, s64, 2, DEV_CPU, 0, 0, DT_F64, 1, (int[]){DT_I64}, (int[]){1},
                                     aux64, &e64));
  CHECK_OK(MXNDArrayGetDType(e64, &dt));
  CHECK(dt == DT_F64);

  /* a row_sparse key: dense pull, row_sparse pull of some rows (sorted, unique) */
  int k = 7;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &w));
  uint32_t s42[2] = {4, 2};
  NDArrayHandle dense = make_f32_shape(s42, 2, NULL);
  CHECK_OK(MXKVStorePull(kv, 1, &k, &dense, 0));
  CHECK_F32(dense, 8, 1, 1, 0, 0, 2, 2, 0, 0);
  NDArrayHandle out = make_rsp(4, 2, i02, 0, NULL);
  NDArrayHandle rows = make_typed(3, DT_I64, (int64_t[]){2, 0, 2});
  CHECK_OK(MXKVStorePullRowSparse(kv, 1, &k, &out, &rows, 0));
  check_rsp(out, 2, i02, d02, 2);
  /* PullWithSparse: written when ignore_sparse is false */
  NDArrayHandle out2 = make_rsp(4, 2, i02, 0, NULL);
  CHECK_OK(MXKVStorePullWithSparse(kv, 1, &k, &out2, 0, false));
  check_rsp(out2, 2, i02, d02, 2);

  /* two row_sparse pushes: row-wise sum, rows 0,1,2 = [1,1],[5,5],[1,1] */
  NDArrayHandle a = make_rsp(4, 2, i01, 2, ones), b = make_rsp(4, 2, i12, 2, d12);
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){7, 7}, (NDArrayHandle[]){a, b}, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &k, &dense, 0));
  CHECK_F32(dense, 8, 1, 1, 5, 5, 1, 1, 0, 0);
  /* one row_sparse value pushed (no updater): the store adopts its rows
     without a copy, yet nothing the caller does with the value afterwards
     reaches them (libmxkv keeps copy semantics; MXNet aliases) */
  NDArrayHandle g = make_rsp(4, 2, i12, 2, d12), gd = NULL;
  CHECK_OK(MXKVStorePush(kv, 1, &k, &g, 0));
  CHECK_OK(MXKVStorePush(kv, 1, &k, &g, 0)); /* the same rows again */
  CHECK_OK(MXKVStorePull(kv, 1, &k, &dense, 0));
  CHECK_F32(dense, 8, 0, 0, 4, 4, 1, 1, 0, 0);
  const float nines[4] = {9, 9, 9, 9};
  CHECK_OK(MXNDArrayGetDataNDArray(g, &gd));
  CHECK_OK(MXNDArraySyncCopyFromCPU(gd, nines, 4));
  check_rsp(g, 2, i12, nines, 2); /* the caller's array changed */
  CHECK_OK(MXKVStorePull(kv, 1, &k, &dense, 0));
  CHECK_F32(dense, 8, 0, 0, 4, 4, 1, 1, 0, 0); /* the store's did not */
  CHECK_OK(MXKVStorePush(kv, 1, &k, &g, 0));  /* pushed again: now it does */
  CHECK_OK(MXNDArraySyncCopyFromCPU(gd, ones, 4));
  CHECK_OK(MXKVStorePull(kv, 1, &k, &dense, 0));
  CHECK_F32(dense, 8, 0, 0, 9, 9, 9, 9, 0, 0);
  CHECK_OK(MXNDArrayFree(gd));
  CHECK_OK(MXKVStorePush(kv, 1, &k, &g, 0));
  CHECK_OK(MXNDArrayFree(g)); /* the store keeps the rows it adopted */
  CHECK_OK(MXKVStorePull(kv, 1, &k, &dense, 0));
  CHECK_F32(dense, 8, 0, 0, 1, 1, 1, 1, 0, 0);
  /* a dense key pushed with one row_sparse value (no updater): assigned */
  int kd = 8;
  CHECK_OK(MXKVStoreInit(kv, 1, &kd, &dense));
  CHECK_OK(MXKVStorePush(kv, 1, &kd, &w, 0));
  NDArrayHandle dense2 = make_f32_shape(s42, 2, NULL);
  CHECK_OK(MXKVStorePull(kv, 1, &kd, &dense2, 0));
  CHECK_F32(dense2, 8, 1, 1, 0, 0, 2, 2, 0, 0);

  /* .params round trip, byte for byte */
  char p1[] = "/tmp/mxkv_rsp_XXXXXX", p2[] = "/tmp/mxkv_rsp_XXXXXX";
  int fd = mkstemp(p1);
  CHECK(fd >= 0);
  close(fd);
  fd = mkstemp(p2);
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(MXNDArraySave(p1, 2, (NDArrayHandle[]){w, dense}, (const char *[]){"w", "d"}));
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(p1, &n, &arr, &nn, &names));
  CHECK(n == 2 && nn == 2);
  NDArrayHandle lw = arr[0], ld = arr[1];
  check_rsp(lw, 2, i02, d02, 2);
  CHECK_OK(MXNDArraySave(p2, 2, (NDArrayHandle[]){lw, ld}, (const char *[]){"w", "d"}));
  FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
  CHECK(f1 && f2);
  int c1, c2;
  do {
    c1 = fgetc(f1);
    c2 = fgetc(f2);
    CHECK(c1 == c2);
  } while (c1 != EOF);
  fclose(f1);
  fclose(f2);
  unlink(p1);
  unlink(p2);

  /* string keys */
  KVStoreHandle skv = new_store(type);
  const char *wk[1] = {"w"};
  CHECK_OK(MXKVStoreInitEx(skv, 1, wk, &w));
  CHECK_OK(MXKVStorePullRowSparseEx(skv, 1, wk, &out, &rows, 0));
  check_rsp(out, 2, i02, d02, 2);
  CHECK_OK(MXKVStoreFree(skv));

  NDArrayHandle hs[11] = {w, e64, dense, out, rows, out2, a, b, dense2, lw, ld};
  free_all(hs, 11);
  CHECK_OK(MXKVStoreFree(kv));
}

/* The parts of a csr array: storage type 2, data (float32), indptr (aux 0)
   and column indices (aux 1), each as expected. */
static void check_csr(NDArrayHandle h, const float *data, size_t nnz, const int64_t *indptr,
                      size_t nptr, const int64_t *indices) {
  int st = -9;
  CHECK_OK(MXNDArrayGetStorageType(h, &st));
  CHECK(st == 2);
  NDArrayHandle dh = NULL, ph = NULL, ih = NULL;
  CHECK_OK(MXNDArrayGetDataNDArray(h, &dh));
  CHECK_OK(MXNDArrayGetAuxNDArray(h, 0, &ph));
  CHECK_OK(MXNDArrayGetAuxNDArray(h, 1, &ih));
  CHECK(nd_size(dh) == nnz && nd_size(ph) == nptr && nd_size(ih) == nnz);
  float gd[8];
  int64_t gp[8], gi[8];
  CHECK(nnz <= 8 && nptr <= 8);
  read_f32(dh, gd, nnz);
  read_i64(ph, gp, nptr);
  read_i64(ih, gi, nnz);
  CHECK(memcmp(gd, data, nnz * sizeof *data) == 0);
  CHECK(memcmp(gp, indptr, nptr * sizeof *indptr) == 0);
  CHECK(memcmp(gi, indices, nnz * sizeof *indices) == 0);
  NDArrayHandle hs[3] = {dh, ph, ih};
  free_all(hs, 3);
}

/* A csr array built through the C API as MXNet 1.9.1's csr_matrix builds it
   (CreateSparseEx, then SyncCopyFromNDArray of data -1, indptr 0, indices 1)
   holds what was copied in, saves it and loads it back (the data part used
   to be refused with the row_sparse rule, so such an array saved zeros).
   csr's own rules: data and column indices 1-d, indptr rows + 1 long. */
static void test_csr_parts(void) {
  const uint32_t shape[2] = {3, 4}, aux_shape[2] = {4, 3};
  uint32_t aux_ndims[2] = {1, 1};
  int aux_type[2] = {DT_I64, DT_I64};
  NDArrayHandle c = NULL;
  CHECK_OK(MXNDArrayCreateSparseEx(2, shape, 2, DEV_CPU, 0, 0, DT_F32, 2, aux_type, aux_ndims,
                                   aux_shape, &c));
  /* [[0, 0, 1, 0], [0, 0, 0, 0], [2, 0, 0, 3]] */
  const float data[3] = {1, 2, 3};
  const int64_t indptr[4] = {0, 1, 1, 3}, indices[3] = {2, 0, 3};
  NDArrayHandle hd = make_f32(3, data);
  NDArrayHandle hp = make_f32(4, (const float[]){0, 1, 1, 3}); /* converted, as in MXNet */
  NDArrayHandle hi = make_typed(3, DT_I64, indices);
  CHECK_OK(MXNDArraySyncCopyFromNDArray(c, hd, -1));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(c, hp, 0));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(c, hi, 1));
  CHECK_OK(MXNDArraySyncCheckFormat(c, true));
  check_csr(c, data, 3, indptr, 4, indices);
  /* refused, changing nothing: 2-d data or indices, an indptr that is not
     rows + 1 long, aux index 2 */
  uint32_t s31[2] = {3, 1};
  NDArrayHandle d2 = make_f32_shape(s31, 2, data);
  NDArrayHandle p3 = make_typed(3, DT_I64, (const int64_t[]){0, 1, 3});
  NDArrayHandle p5 = make_typed(5, DT_I64, (const int64_t[]){0, 1, 1, 3, 3});
  CHECK_ERR(MXNDArraySyncCopyFromNDArray(c, d2, -1), "MXNDArraySyncCopyFromNDArray: the data of a csr array is 1-d");
  CHECK_ERR(MXNDArraySyncCopyFromNDArray(c, d2, 1), "the column indices of a csr array are 1-d");
  CHECK_ERR(MXNDArraySyncCopyFromNDArray(c, p3, 0), "holds rows + 1 = 4 offsets, not [3]");
  CHECK_ERR(MXNDArraySyncCopyFromNDArray(c, p5, 0), "holds rows + 1 = 4 offsets, not [5]");
  CHECK_ERR(MXNDArraySyncCopyFromNDArray(c, p3, 2), "aux index 2 out of range");
  check_csr(c, data, 3, indptr, 4, indices);

  /* save, load, compare; the loaded array saves the same bytes */
  char p1[4096], p2[4096];
  make_temp(p1, sizeof p1);
  make_temp(p2, sizeof p2);
  CHECK_OK(MXNDArraySave(p1, 1, &c, NULL));
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(p1, &n, &arr, &nn, &names));
  CHECK(n == 1 && nn == 0);
  NDArrayHandle lc = arr[0];
  check_csr(lc, data, 3, indptr, 4, indices);
  CHECK_OK(MXNDArraySyncCheckFormat(lc, true));
  CHECK_OK(MXNDArraySave(p2, 1, &lc, NULL));
  unsigned char b1[512], b2[512];
  size_t l1 = 0, l2 = 0;
  read_file(p1, b1, sizeof b1, &l1);
  read_file(p2, b2, sizeof b2, &l2);
  CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
  unlink(p1);
  unlink(p2);

  /* A csr made with no room (aux shapes 0, as sparse.zeros makes it) takes
     parts of any length; data and indices must agree when it is saved. */
  NDArrayHandle z = NULL;
  CHECK_OK(MXNDArrayCreateSparseEx(2, shape, 2, DEV_CPU, 0, 1, DT_F32, 2, aux_type, aux_ndims,
                                   (const uint32_t[]){0, 0}, &z));
  NDArrayHandle two = make_typed(2, DT_I64, (const int64_t[]){1, 3});
  CHECK_OK(MXNDArraySyncCopyFromNDArray(z, hd, -1));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(z, hp, 0));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(z, two, 1));
  make_temp(p1, sizeof p1);
  CHECK_ERR(MXNDArraySave(p1, 1, &z, NULL), "MXNDArraySave: ");
  CHECK_OK(MXNDArraySyncCopyFromNDArray(z, hi, 1));
  CHECK_OK(MXNDArraySave(p1, 1, &z, NULL));
  unlink(p1);

  NDArrayHandle hs[9] = {c, hd, hp, hi, d2, p3, p5, lc, z};
  free_all(hs, 9);
  CHECK_OK(MXNDArrayFree(two));
}

/* MXNDArraySyncCopyFromNDArray(dense, sparse, -1) copies the sparse array's
   stored values when the dense array has their shape (MXNet copies
   src.data()); of the sparse array's own shape, it gets it densified. The
   case of issue 9 (4.1): a handle on an array's own data part refreshed
   from the array returns 0 (it never returned when all rows were stored)
   and leaves the part as it was, as MXNet 1.9.1 does. */
static void test_copy_from_sparse_data(void) {
  const int64_t i13[2] = {1, 3};
  const float d13[4] = {1, 10, 3, 30};
  NDArrayHandle r = make_rsp(4, 2, i13, 2, d13), d = NULL;
  CHECK_OK(MXNDArrayGetDataNDArray(r, &d));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(d, r, -1));
  CHECK_F32(d, 4, 1, 10, 3, 30);
  check_rsp(r, 2, i13, d13, 2);
  uint32_t s22[2] = {2, 2}, s42[2] = {4, 2}, s32[2] = {3, 2};
  NDArrayHandle rows = make_f32_shape(s22, 2, NULL), full = make_f32_shape(s42, 2, NULL);
  NDArrayHandle other = make_f32_shape(s32, 2, NULL);
  CHECK_OK(MXNDArraySyncCopyFromNDArray(rows, r, -1));
  CHECK_F32(rows, 4, 1, 10, 3, 30);
  CHECK_OK(MXNDArraySyncCopyFromNDArray(full, r, -1));
  CHECK_F32(full, 8, 0, 0, 1, 10, 0, 0, 3, 30);
  CHECK_ERR(MXNDArraySyncCopyFromNDArray(other, r, -1), "shape mismatch");
  /* all rows stored: the data part has the array's shape */
  const int64_t i01[2] = {0, 1};
  NDArrayHandle r2 = make_rsp(2, 2, i01, 2, d13), d2 = NULL;
  CHECK_OK(MXNDArrayGetDataNDArray(r2, &d2));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(d2, r2, -1));
  CHECK_F32(d2, 4, 1, 10, 3, 30);
  check_rsp(r2, 2, i01, d13, 2);
  NDArrayHandle hs[7] = {r, d, rows, full, other, r2, d2};
  free_all(hs, 7);
}

/* Arrays of shape (rows, 0) as MXNDArrayCreateEx64 / CreateSparseEx64 make
   them; a row_sparse one stores the rows `ids` (of no elements). */
static NDArrayHandle make_wide0(int64_t rows, bool sparse, const int64_t *ids, int nids) {
  const int64_t shape[2] = {rows, 0};
  NDArrayHandle h = NULL;
  if (!sparse) {
    CHECK_OK(MXNDArrayCreateEx64(shape, 2, DEV_CPU, 0, 0, DT_F32, &h));
    return h;
  }
  CHECK_OK(MXNDArrayCreateSparseEx64(1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, (int[]){DT_I64},
                                     (int[]){1}, (const int64_t[]){nids}, &h));
  if (nids > 0) {
    NDArrayHandle ih = make_typed((uint32_t)nids, DT_I64, ids);
    CHECK_OK(MXNDArraySyncCopyFromNDArray(h, ih, 0));
    CHECK_OK(MXNDArrayFree(ih));
  }
  return h;
}

/* The stored indices of a row_sparse key, through PullWithSparse. */
static void check_key_rows(KVStoreHandle kv, int key, int64_t rows, const int64_t *want, int n) {
  NDArrayHandle out = make_wide0(rows, true, NULL, 0), ih = NULL;
  CHECK_OK(MXKVStorePullWithSparse(kv, 1, &key, &out, 0, false));
  CHECK_OK(MXNDArrayGetAuxNDArray(out, 0, &ih));
  CHECK(nd_size(ih) == (size_t)n);
  int64_t got[8] = {0};
  CHECK(n <= 8);
  if (n > 0) read_i64(ih, got, (size_t)n);
  CHECK(memcmp(got, want, (size_t)n * sizeof *want) == 0);
  NDArrayHandle hs[2] = {out, ih};
  free_all(hs, 2);
}

/* Keys of 2^40 rows of width 0: every call's work scales with the bytes
   and the stored rows, never with the row count (a push of such a dense
   value into a row_sparse key took many minutes; MXNet 1.9.1: 0.01 s).
   Bounded by alarm(): a regression is killed, not waited for. */
static void test_empty_rows(const char *type) {
  alarm(120);
  const int64_t R = (int64_t)1 << 40;
  KVStoreHandle kv = new_store(type);
  int kd = 1, kr = 2;
  NDArrayHandle d0 = make_wide0(R, false, NULL, 0), d1 = make_wide0(R, false, NULL, 0);
  NDArrayHandle r0 = make_wide0(R, true, NULL, 0);
  CHECK_OK(MXKVStoreInit(kv, 2, (int[]){kd, kr}, (NDArrayHandle[]){d0, r0}));
  /* dense key: one value, two, a row_sparse one among them */
  CHECK_OK(MXKVStorePush(kv, 1, &kd, &d1, 0));
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){kd, kd}, (NDArrayHandle[]){d0, d1}, 0));
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){kd, kd}, (NDArrayHandle[]){d0, r0}, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &kd, &d1, 0));
  CHECK(nd_size(d1) == 0);
  /* row_sparse key: rows of no elements are indices only; two values sum
     to the union of their rows */
  NDArrayHandle a = make_wide0(R, true, (const int64_t[]){0, 7}, 2);
  NDArrayHandle b = make_wide0(R, true, (const int64_t[]){7, R / 2}, 2);
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){kr, kr}, (NDArrayHandle[]){a, b}, 0));
  check_key_rows(kv, kr, R, (const int64_t[]){0, 7, R / 2}, 3);
  NDArrayHandle ids = make_typed(3, DT_I64, (const int64_t[]){9, 7, R - 1});
  NDArrayHandle out = make_wide0(R, true, NULL, 0), ih = NULL;
  CHECK_OK(MXKVStorePullRowSparse(kv, 1, &kr, &out, &ids, 0));
  CHECK_OK(MXNDArrayGetAuxNDArray(out, 0, &ih));
  int64_t got[3];
  CHECK(nd_size(ih) == 3);
  read_i64(ih, got, 3);
  CHECK(got[0] == 7 && got[1] == 9 && got[2] == R - 1);
  /* a dense value with a row_sparse one: converted to row_sparse (no rows) */
  NDArrayHandle c = make_wide0(R, true, (const int64_t[]){3}, 1);
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){kr, kr}, (NDArrayHandle[]){c, d0}, 0));
  check_key_rows(kv, kr, R, (const int64_t[]){3}, 1);
  /* and a dense value alone makes the key dense again */
  CHECK_OK(MXKVStorePush(kv, 1, &kr, &d0, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &kr, &d1, 0));
  NDArrayHandle hs[9] = {d0, d1, r0, a, b, ids, out, ih, c};
  free_all(hs, 9);
  CHECK_OK(MXKVStoreFree(kv));
  alarm(0);
}

/* A row_sparse key of shape [6, 2^62] holding no rows (a row of 2^64
   bytes): PullRowSparse and pushes return 0 with no rows, never
   "internal error (panic: ...)" (a row size that wrapped to 0 panicked). */
static void test_rows_too_large_for_memory(const char *type) {
  KVStoreHandle kv = new_store(type);
  const int64_t shape[2] = {6, (int64_t)1 << 62};
  NDArrayHandle v = NULL, out = NULL, ih = NULL;
  CHECK_OK(MXNDArrayCreateSparseEx64(1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, (int[]){DT_I64},
                                     (int[]){1}, (const int64_t[]){0}, &v));
  CHECK_OK(MXNDArrayCreateSparseEx64(1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, (int[]){DT_I64},
                                     (int[]){1}, (const int64_t[]){0}, &out));
  int k = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &v));
  NDArrayHandle ids = make_typed(2, DT_I64, (const int64_t[]){0, 5});
  CHECK_OK(MXKVStorePullRowSparse(kv, 1, &k, &out, &ids, 0));
  CHECK_OK(MXNDArrayGetAuxNDArray(out, 0, &ih));
  CHECK(nd_size(ih) == 0);
  CHECK_OK(MXKVStorePush(kv, 2, (int[]){k, k}, (NDArrayHandle[]){v, out}, 0));
  CHECK_OK(MXKVStorePush(kv, 1, &k, &v, 0));
  CHECK_OK(MXKVStorePullWithSparse(kv, 1, &k, &out, 0, false));
  CHECK_OK(MXNDArraySyncCheckFormat(out, true));
  /* a dense array of that shape cannot be made */
  NDArrayHandle d = NULL;
  CHECK_ERR(MXNDArrayCreateEx64(shape, 2, DEV_CPU, 0, 0, DT_F32, &d), "MXNDArrayCreateEx64: ");
  CHECK(d == NULL);
  NDArrayHandle hs[4] = {v, out, ids, ih};
  free_all(hs, 4);
  CHECK_OK(MXKVStoreFree(kv));
}

/* An updater that breaks local's row_sparse indices through its aux handle
   (or gives local more indices than data rows) makes the push fail at the
   end of that update; the key keeps its indices from before the update. */
static int g_corrupt_mode;
static void corrupting_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  (void)key;
  (void)user;
  static const int64_t bad[4][2] = {{3, 1}, {1, 1}, {1, 6}, {-1, 1}};
  NDArrayHandle aux = NULL, rd = NULL, ra = NULL;
  CHECK_OK(MXNDArrayGetAuxNDArray(local, 0, &aux));
  if (g_corrupt_mode < 4) {
    CHECK_OK(MXNDArraySyncCopyFromCPU(aux, bad[g_corrupt_mode], 2));
  } else if (g_corrupt_mode == 4) {
    NDArrayHandle three = make_typed(3, DT_I64, (const int64_t[]){0, 1, 2});
    CHECK_OK(MXNDArraySyncCopyFromNDArray(local, three, 0));
    CHECK_OK(MXNDArrayFree(three));
  } else { /* a valid update: local = recv */
    CHECK_OK(MXNDArrayGetDataNDArray(recv, &rd));
    CHECK_OK(MXNDArrayGetAuxNDArray(recv, 0, &ra));
    CHECK_OK(MXNDArraySyncCopyFromNDArray(local, rd, -1));
    CHECK_OK(MXNDArraySyncCopyFromNDArray(local, ra, 0));
    CHECK_OK(MXNDArrayFree(rd));
    CHECK_OK(MXNDArrayFree(ra));
  }
  NDArrayHandle hs[3] = {aux, recv, local};
  free_all(hs, 3);
}

static void test_updater_breaking_indices(const char *type) {
  KVStoreHandle kv = new_store(type);
  const int64_t i13[2] = {1, 3};
  const float d13[4] = {1, 1, 3, 3}, sevens[2] = {7, 7};
  NDArrayHandle w = make_rsp(6, 2, i13, 2, d13);
  int k = 9;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &w));
  CHECK_OK(MXKVStoreSetUpdater(kv, corrupting_updater, NULL));
  NDArrayHandle v = make_rsp(6, 2, (const int64_t[]){0}, 1, sevens);
  NDArrayHandle out = make_rsp(6, 2, NULL, 0, NULL);
  for (g_corrupt_mode = 0; g_corrupt_mode < 5; g_corrupt_mode++) {
    CHECK_ERR(MXKVStorePush(kv, 1, &k, &v, 0),
              "MXKVStorePush: the updater left the row_sparse value of key 9 invalid (");
    CHECK_ERR(MXKVStorePush(kv, 1, &k, &v, 0), "the key keeps its indices from before the update");
    CHECK_OK(MXKVStorePullWithSparse(kv, 1, &k, &out, 0, false));
    check_rsp(out, 2, i13, d13, 2);
  }
  CHECK_OK(MXKVStorePush(kv, 1, &k, &v, 0));
  CHECK_OK(MXKVStorePullWithSparse(kv, 1, &k, &out, 0, false));
  check_rsp(out, 1, (const int64_t[]){0}, sevens, 2);
  NDArrayHandle hs[3] = {w, v, out};
  free_all(hs, 3);
  CHECK_OK(MXKVStoreFree(kv));
}

/* §11: 2-bit gradient compression on device (error feedback), none on local. */
static void test_compression(void) {
  const char *gk[2] = {"type", "threshold"}, *gv[2] = {"2bit", "0.5"};
  const float g[4] = {0.3f, 0.6f, -0.7f, 1.2f};
  NDArrayHandle x = make_f32(4, g), z = make_f32(4, NULL);
  int k = 0;
  KVStoreHandle kv = new_store("device");
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &z));
  CHECK_OK(MXKVStoreSetGradientCompression(kv, 2, gk, gv));
  CHECK_OK(MXKVStorePush(kv, 1, &k, &x, 0));
  CHECK_PULL(kv, 0, 4, 0, 0.5f, -0.5f, 0.5f);
  CHECK_OK(MXKVStorePush(kv, 1, &k, &x, 0));
  CHECK_PULL(kv, 0, 4, 0.5f, 0.5f, -0.5f, 0.5f);
  CHECK_OK(MXKVStorePush(kv, 1, &k, &x, 0));
  CHECK_PULL(kv, 0, 4, 0, 0.5f, -0.5f, 0.5f);
  CHECK_OK(MXKVStoreFree(kv));
  kv = new_store("local");
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &z));
  CHECK_OK(MXKVStoreSetGradientCompression(kv, 2, gk, gv));
  CHECK_OK(MXKVStorePush(kv, 1, &k, &x, 0));
  CHECK_PULL(kv, 0, 4, 0.3f, 0.6f, -0.7f, 1.2f);
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_OK(MXNDArrayFree(x));
  CHECK_OK(MXNDArrayFree(z));
}

/* §12: the multi-machine entry points on local stores. */
static int g_controller_calls;
static void controller(int head, const char *body, void *h) {
  (void)head, (void)body, (void)h;
  g_controller_calls++;
}

static void test_node_api(void) {
  int r = -1;
  CHECK_OK(MXInitPSEnv(0, NULL, NULL));
  CHECK_OK(MXKVStoreIsWorkerNode(&r));
  CHECK(r == 1);
  CHECK_OK(MXKVStoreIsServerNode(&r));
  CHECK(r == 0);
  CHECK_OK(MXKVStoreIsSchedulerNode(&r));
  CHECK(r == 0);

  KVStoreHandle kv = new_store("local");
  CHECK_OK(MXKVStoreGetRank(kv, &r));
  CHECK(r == 0);
  CHECK_OK(MXKVStoreGetGroupSize(kv, &r));
  CHECK(r == 1);
  const int nodes[5] = {1, 2, 4, 7, 0};
  for (int i = 0; i < 5; i++) {
    r = -1;
    CHECK_OK(MXKVStoreGetNumDeadNode(kv, nodes[i], &r, i == 0 ? 60 : i));
    CHECK(r == 0);
  }
  CHECK_OK(MXKVStoreBarrier(kv));
  CHECK_OK(MXKVStoreSetBarrierBeforeExit(kv, 1));
  CHECK_OK(MXKVStoreSetBarrierBeforeExit(kv, 0));
  g_controller_calls = 0;
  CHECK_OK(MXKVStoreRunServer(kv, controller, (void *)0x77));
  CHECK_OK(MXKVStoreRunServer(kv, NULL, NULL));
  CHECK(g_controller_calls == 0);
  CHECK_OK(MXKVStoreSendCommmandToServers(kv, 0, ""));
  CHECK_OK(MXKVStoreSendCommmandToServers(kv, 3, "some body"));
  CHECK(g_controller_calls == 0);

  CHECK_OK(MXKVStoreFree(kv));

  const char *rk[1] = {"DMLC_ROLE"}, *server[1] = {"server"}, *sched[1] = {"scheduler"},
             *worker[1] = {"worker"};
  CHECK_OK(MXInitPSEnv(1, rk, server));
  CHECK_OK(MXKVStoreIsWorkerNode(&r));
  CHECK(r == 0);
  CHECK_OK(MXKVStoreIsServerNode(&r));
  CHECK(r == 1);
  CHECK_OK(MXKVStoreIsSchedulerNode(&r));
  CHECK(r == 0);
  kv = new_store("local"); /* a local store can still be made */
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_OK(MXInitPSEnv(1, rk, sched));
  CHECK_OK(MXKVStoreIsSchedulerNode(&r));
  CHECK(r == 1);
  CHECK_OK(MXKVStoreIsServerNode(&r));
  CHECK(r == 0);
  CHECK_OK(MXInitPSEnv(1, rk, worker));
  CHECK_OK(MXKVStoreIsWorkerNode(&r));
  CHECK(r == 1);
  CHECK_OK(MXKVStoreIsSchedulerNode(&r));
  CHECK(r == 0);
}

/* Arrays of 32 MiB or more live in mappings that are pooled once freed: a new
   array never shows what a freed one held, and Init, which copies into a pooled
   mapping without zeroing it first, keeps every byte of the value. */
static void test_large_arrays_reuse_memory(void) {
  enum { N = 10 * 1024 * 1024 }; /* 40 MiB of float32 */
  uint32_t shape[1] = {N};
  float *buf = malloc((size_t)N * sizeof(float)), *got = malloc((size_t)N * sizeof(float));
  CHECK(buf && got);
  KVStoreHandle kv = new_store("local");
  for (int round = 0; round < 2; round++) {
    NDArrayHandle a = NULL, b = NULL, val = NULL, out = NULL;
    CHECK_OK(MXNDArrayCreateEx(shape, 1, DEV_CPU, 0, 0, DT_F32, &a));
    for (size_t i = 0; i < N; i++) buf[i] = 7.0f;
    CHECK_OK(MXNDArraySyncCopyFromCPU(a, buf, N));
    CHECK_OK(MXNDArrayFree(a));
    CHECK_OK(MXNDArrayCreateEx(shape, 1, DEV_CPU, 0, 0, DT_F32, &b));
    CHECK_OK(MXNDArraySyncCopyToCPU(b, got, N));
    for (size_t i = 0; i < N; i++) CHECK(got[i] == 0.0f);
    CHECK_OK(MXNDArrayCreateEx(shape, 1, DEV_CPU, 0, 0, DT_F32, &val));
    for (size_t i = 0; i < N; i++) buf[i] = 9.0f;
    CHECK_OK(MXNDArraySyncCopyFromCPU(b, buf, N));
    for (size_t i = 0; i < N; i++) buf[i] = (float)(i % 1013) + (float)round;
    CHECK_OK(MXNDArraySyncCopyFromCPU(val, buf, N));
    /* b's mapping, 9s in it, is the free one Init's stored copy gets next */
    CHECK_OK(MXNDArrayFree(b));
    int key = round;
    CHECK_OK(MXKVStoreInit(kv, 1, &key, &val));
    CHECK_OK(MXNDArrayFree(val));
    CHECK_OK(MXNDArrayCreateEx(shape, 1, DEV_CPU, 0, 0, DT_F32, &out));
    CHECK_OK(MXKVStorePull(kv, 1, &key, &out, 0));
    CHECK_OK(MXNDArraySyncCopyToCPU(out, got, N));
    CHECK(memcmp(got, buf, (size_t)N * sizeof(float)) == 0);
    CHECK_OK(MXNDArrayFree(out));
  }
  CHECK_OK(MXKVStoreFree(kv));
  free(buf);
  free(got);
}

int main(void) {
  /* Is*Node and dist checks read DMLC_* from the environment. */
  unsetenv("DMLC_ROLE");
  g_main_thread = pthread_self();
  g_start = live_now();

  test_version_and_errors();
  CHECK_LIVE(g_start);
  test_tutorial();
  CHECK_LIVE(g_start);
  test_types();
  CHECK_LIVE(g_start);
  test_int_keys_and_sums("local");
  test_int_keys_and_sums("device");
  CHECK_LIVE(g_start);
  test_dtypes();
  CHECK_LIVE(g_start);
  test_string_keys_and_updaters();
  CHECK_LIVE(g_start);
  test_updater_contract();
  CHECK_LIVE(g_start);
  test_reentrant_updater("local");
  test_reentrant_updater("device");
  CHECK_LIVE(g_start);
  test_pull_pushpull_broadcast();
  CHECK_LIVE(g_start);
  test_ndarray();
  CHECK_LIVE(g_start);
  test_save_load();
  CHECK_LIVE(g_start);
  test_sparse("local");
  test_sparse("device");
  CHECK_LIVE(g_start);
  test_csr_parts();
  CHECK_LIVE(g_start);
  test_copy_from_sparse_data();
  CHECK_LIVE(g_start);
  test_empty_rows("local");
  test_empty_rows("device");
  CHECK_LIVE(g_start);
  test_rows_too_large_for_memory("local");
  test_rows_too_large_for_memory("device");
  CHECK_LIVE(g_start);
  test_updater_breaking_indices("local");
  test_updater_breaking_indices("device");
  CHECK_LIVE(g_start);
  test_compression();
  CHECK_LIVE(g_start);
  test_node_api();
  CHECK_LIVE(g_start);
  test_large_arrays_reuse_memory();
  CHECK_LIVE(g_start);
  CHECK_OK(MXNotifyShutdown());
  printf("test_basic: OK\n");
  return 0;
}
