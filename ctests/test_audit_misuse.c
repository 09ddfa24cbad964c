/*
 * Audit (session 12): random use and misuse of the KVStore C API from several
 * threads at once, on shared stores and arrays that other threads free and
 * replace meanwhile. Every call may fail (stale handles, uninitialised keys,
 * shape and dtype mismatches, wrong storage types, invalid UTF-8 string keys,
 * bad compression parameters ...), but none may crash, hang or leave the
 * library unusable: at the end a fresh store must still give exact sums.
 *
 * Deterministic per thread (a fixed seed each); the interleaving is not, so a
 * failure names the seed and the last operation of each thread.
 * MXKV_AUDIT_ITERS sets the operations per thread (default 3000), MXKV_AUDIT_SEED
 * the seeds (default 1).
 */
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#define NT 4          /* threads */
#define NSLOT 8       /* shared stores and arrays */

static _Atomic(KVStoreHandle) g_kv[NSLOT];
static _Atomic(NDArrayHandle) g_arr[NSLOT];
static _Atomic int g_op[NT];
static _Atomic long g_ok[16]; /* successful calls per operation */
static int g_iters = 3000;
static uint32_t g_seed = 1;

static uint32_t rnd(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static const char *const k_types[] = {"local", "device", "local_update_cpu",
                                      "local_allreduce_cpu", "local_allreduce_device"};
/* shapes: a few small ones, so that some calls match and some do not */
static const uint32_t k_shapes[][2] = {{4, 0}, {2, 2}, {3, 0}, {2, 3}};
static const uint32_t k_ndims[] = {1, 2, 1, 2};
static const int k_dtypes[] = {DT_F32, DT_F32, DT_F64, DT_F16, DT_I32, DT_U8, DT_I64};

static NDArrayHandle new_dense(uint32_t *s) {
  /* mostly float32 [4], so that many calls go through */
  int which = (rnd(s) % 4 == 0) ? (int)(rnd(s) % 4) : 0;
  int dtype = (rnd(s) % 4 == 0) ? k_dtypes[rnd(s) % 7] : DT_F32;
  int dev = (int)(rnd(s) % 3);
  NDArrayHandle h = NULL;
  if (MXNDArrayCreateEx(k_shapes[which], k_ndims[which], DEV_CPU, dev, 0, dtype, &h) != 0) {
    return NULL;
  }
  size_t n = 1;
  for (uint32_t i = 0; i < k_ndims[which]; i++) n *= k_shapes[which][i];
  unsigned char buf[8 * 6];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(rnd(s) & 0x3f);
  (void)MXNDArraySyncCopyFromCPU(h, buf, n);
  return h;
}

static NDArrayHandle new_rsp(uint32_t *s) {
  /* a row_sparse [4] or [2,2] array with no stored rows */
  int which = (rnd(s) % 4 == 0) ? 1 : 0;
  int aux_type = DT_I64;
  uint32_t aux_ndim = 1, aux_shape = 0;
  NDArrayHandle h = NULL;
  if (MXNDArrayCreateSparseEx(1, k_shapes[which], k_ndims[which], DEV_CPU, 0, 0, DT_F32, 1,
                              &aux_type, &aux_ndim, &aux_shape, &h) != 0) {
    return NULL;
  }
  return h;
}

/* an array of the slots, or a fresh one, or NULL */
static NDArrayHandle pick_arr(uint32_t *s, bool *fresh) {
  uint32_t r = rnd(s) % 16;
  *fresh = false;
  if (r < 10) return atomic_load(&g_arr[rnd(s) % NSLOT]);
  if (r == 10) return NULL;
  *fresh = true;
  return (r == 11) ? new_rsp(s) : new_dense(s);
}

static KVStoreHandle pick_kv(uint32_t *s, uint32_t *slot) {
  *slot = rnd(s) % NSLOT;
  return atomic_load(&g_kv[*slot]);
}

static const char *pick_str(uint32_t *s) {
  static const char *const keys[] = {"a", "b", "a", "\xff\xfe", "", "a\xc3", "b", "a"};
  return keys[rnd(s) % 8];
}

static _Atomic long g_updates;

static void updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  atomic_fetch_add(&g_updates, 1);
  /* calls back into the store (user: its handle, which another thread may have
     freed meanwhile): a pull of the key into recv, which may fail, never hang */
  int k = key;
  NDArrayHandle out = recv;
  (void)MXKVStorePull((KVStoreHandle)user, 1, &k, &out, 0);
  /* copy recv into local: may fail (dtype/shape/stype), which is fine; the
     handles are the callee's to free, as in MXNet */
  (void)MXNDArraySyncCopyFromNDArray(local, recv, -1);
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  const char *k = key;
  NDArrayHandle out = recv;
  (void)MXKVStorePullEx((KVStoreHandle)user, 1, &k, &out, 0);
  (void)MXNDArraySyncCopyFromNDArray(local, recv, -1);
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  uint32_t s = 0x9e3779b9u * (uint32_t)(t + 1) + g_seed * 0x85ebca6bu;
  if (s == 0) s = 1;
  for (int it = 0; it < g_iters; it++) {
    int op = (int)(rnd(&s) % 16);
    atomic_store(&g_op[t], op);
    uint32_t slot = 0;
    KVStoreHandle kv = pick_kv(&s, &slot);
    bool f1 = false, f2 = false;
    NDArrayHandle a = pick_arr(&s, &f1);
    NDArrayHandle b = pick_arr(&s, &f2);
    NDArrayHandle vals[3] = {a, b, a};
    int ikeys[3] = {(int)(rnd(&s) % 3), (int)(rnd(&s) % 3), (int)(rnd(&s) % 4) - 1};
    const char *skeys[3] = {pick_str(&s), pick_str(&s), pick_str(&s)};
    uint32_t n = 1 + rnd(&s) % 3;
    /* odd slots' stores mostly take string keys (a store takes one kind) */
    bool str = (slot % 2) ^ (rnd(&s) % 8 == 0);
    switch (op) {
      case 0: { /* replace a store (now and then) */
        KVStoreHandle h = NULL;
        if (rnd(&s) % 4 != 0) break;
        if (MXKVStoreCreate(k_types[rnd(&s) % 5], &h) == 0) {
          KVStoreHandle old = atomic_exchange(&g_kv[rnd(&s) % NSLOT], h);
          if (old != NULL) (void)MXKVStoreFree(old);
        }
        break;
      }
      case 1: { /* replace an array */
        NDArrayHandle h = (rnd(&s) % 4 == 0) ? new_rsp(&s) : new_dense(&s);
        NDArrayHandle old = atomic_exchange(&g_arr[rnd(&s) % NSLOT], h);
        if (old != NULL) (void)MXNDArrayFree(old);
        break;
      }
      case 2:
        g_ok[op] += 0 == (str ? MXKVStoreInitEx(kv, n, skeys, vals) : MXKVStoreInit(kv, n, ikeys, vals));
        break;
      case 3:
      case 4:
        g_ok[op] += 0 == (str ? MXKVStorePushEx(kv, n, skeys, vals, 0)
                   : MXKVStorePush(kv, n, ikeys, vals, 0));
        break;
      case 5:
        g_ok[op] += 0 == (str ? MXKVStorePullWithSparseEx(kv, n, skeys, vals, 0, rnd(&s) % 2)
                   : MXKVStorePullWithSparse(kv, n, ikeys, vals, 0, rnd(&s) % 2));
        break;
      case 6: {
        NDArrayHandle outs[3] = {b, a, b};
        g_ok[op] += 0 == (str ? MXKVStorePushPullEx(kv, n, skeys, n, skeys, vals, outs, 0)
                   : MXKVStorePushPull(kv, n, ikeys, n, ikeys, vals, outs, 0));
        break;
      }
      case 7: {
        NDArrayHandle outs[3] = {b, b, a};
        g_ok[op] += 0 == (str ? MXKVStoreBroadcastEx(kv, n, skeys, n, skeys, vals, outs, 0)
                   : MXKVStoreBroadcast(kv, n, ikeys, n, ikeys, vals, outs, 0));
        break;
      }
      case 8: {
        NDArrayHandle rows[3] = {b, a, b};
        g_ok[op] += 0 == (str ? MXKVStorePullRowSparseEx(kv, n, skeys, vals, rows, 0)
                   : MXKVStorePullRowSparse(kv, n, ikeys, vals, rows, 0));
        break;
      }
      case 9:
        if (rnd(&s) % 2) {
          g_ok[op] += 0 == MXKVStoreSetUpdaterEx(kv, updater, str_updater, kv);
        } else {
          g_ok[op] += 0 == MXKVStoreSetUpdater(kv, updater, kv);
        }
        break;
      case 10: {
        static const char *const pk[] = {"type", "threshold", "type", "x"};
        static const char *const pv[] = {"2bit", "0.5", "1bit", "\xff", "-1", "nan", "none"};
        const char *ks[2] = {pk[rnd(&s) % 4], pk[rnd(&s) % 4]};
        const char *vs[2] = {pv[rnd(&s) % 7], pv[rnd(&s) % 7]};
        g_ok[op] += 0 == MXKVStoreSetGradientCompression(kv, 1 + rnd(&s) % 2, ks, vs);
        break;
      }
      case 11: {
        const char *ty = NULL;
        int r = 0;
        (void)MXKVStoreGetType(kv, &ty);
        (void)MXKVStoreGetRank(kv, &r);
        (void)MXKVStoreGetGroupSize(kv, &r);
        (void)MXKVStoreBarrier(kv);
        break;
      }
      case 12: /* a store freed twice, or freed while others use it */
        if (rnd(&s) % 8 == 0) {
          KVStoreHandle old = atomic_exchange(&g_kv[rnd(&s) % NSLOT], NULL);
          if (old != NULL) {
            (void)MXKVStoreFree(old);
            CHECK(MXKVStoreFree(old) != 0);
          }
        }
        break;
      case 13: /* an array freed twice */
        if (rnd(&s) % 8 == 0) {
          NDArrayHandle old = atomic_exchange(&g_arr[rnd(&s) % NSLOT], NULL);
          if (old != NULL) {
            (void)MXNDArrayFree(old);
            CHECK(MXNDArrayFree(old) != 0);
          }
        }
        break;
      case 14: { /* read an array that may be gone */
        int dt = 0, st = 0;
        (void)MXNDArrayGetDType(a, &dt);
        (void)MXNDArrayGetStorageType(a, &st);
        (void)MXNDArrayWaitToRead(a);
        break;
      }
      default: /* a count of 0 and NULL arrays */
        (void)MXKVStorePush(kv, 0, NULL, NULL, 0);
        (void)MXKVStoreInit(kv, 0, NULL, NULL);
        CHECK(MXKVStorePush(kv, 1, NULL, vals, 0) != 0);
        CHECK(MXKVStorePullWithSparse(kv, 1, ikeys, NULL, 0, 1) != 0);
        break;
    }
    if (f1) (void)MXNDArrayFree(a);
    if (f2) (void)MXNDArrayFree(b);
  }
  atomic_store(&g_op[t], -1);
  return NULL;
}

static atomic_bool g_done;

static void *watchdog(void *arg) {
  (void)arg;
  for (int i = 0; i < 600 && !atomic_load(&g_done); i++) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (!atomic_load(&g_done)) {
    fprintf(stderr, "test_audit_misuse: no progress in 60 s; last ops:");
    for (int t = 0; t < NT; t++) fprintf(stderr, " %d", atomic_load(&g_op[t]));
    fprintf(stderr, "\n");
    _exit(2);
  }
  return NULL;
}

int main(void) {
  const char *e = getenv("MXKV_AUDIT_ITERS");
  if (e != NULL && atoi(e) > 0) g_iters = atoi(e);
  e = getenv("MXKV_AUDIT_SEED");
  if (e != NULL) g_seed = (uint32_t)strtoul(e, NULL, 10);
  uint32_t s = 12345;
  for (int i = 0; i < NSLOT; i++) {
    KVStoreHandle h = NULL;
    CHECK_OK(MXKVStoreCreate(k_types[i % 5], &h));
    atomic_store(&g_kv[i], h);
    atomic_store(&g_arr[i], new_dense(&s));
  }
  pthread_t wd, th[NT];
  CHECK(pthread_create(&wd, NULL, watchdog, NULL) == 0);
  for (int t = 0; t < NT; t++) CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
  for (int t = 0; t < NT; t++) CHECK(pthread_join(th[t], NULL) == 0);
  atomic_store(&g_done, true);
  CHECK(pthread_join(wd, NULL) == 0);
  for (int i = 0; i < NSLOT; i++) {
    KVStoreHandle k = atomic_exchange(&g_kv[i], NULL);
    if (k != NULL) CHECK_OK(MXKVStoreFree(k));
    NDArrayHandle a = atomic_exchange(&g_arr[i], NULL);
    if (a != NULL) CHECK_OK(MXNDArrayFree(a));
  }
  /* the library still works: exact sums on a fresh store */
  KVStoreHandle kv = NULL;
  CHECK_OK(MXKVStoreCreate("local", &kv));
  float one[3] = {1, 1, 1};
  NDArrayHandle v = make_f32(3, one), out = make_f32(3, one);
  int key = 7;
  CHECK_OK(MXKVStoreInit(kv, 1, &key, &v));
  NDArrayHandle vs[4] = {v, v, v, v};
  int keys[4] = {7, 7, 7, 7};
  CHECK_OK(MXKVStorePush(kv, 4, keys, vs, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &key, &out, 0));
  CHECK_F32(out, 3, 4.0f, 4.0f, 4.0f);
  CHECK_OK(MXNDArrayFree(v));
  CHECK_OK(MXNDArrayFree(out));
  CHECK_OK(MXKVStoreFree(kv));
  int nkv = -1, nnd = -1;
  CHECK_OK(mxkv_live_handles(&nkv, &nnd));
  if (nkv != 0 || nnd != 0) {
    fprintf(stderr, "test_audit_misuse: %d stores and %d arrays left alive\n", nkv, nnd);
    return 1;
  }
  printf("test_audit_misuse: %d threads x %d operations; successful init/push/pull/pushpull/"
         "broadcast/row_sparse_pull/compression calls:", NT, g_iters);
  for (int op = 2; op <= 10; op++) printf(" %ld", atomic_load(&g_ok[op]));
  printf("; updates: %ld\n", atomic_load(&g_updates));
  /* the random calls reach the store's work, not only its checks */
  for (int op = 2; op <= 7; op++) CHECK(atomic_load(&g_ok[op]) > 0);
  return 0;
}
