/*
 * A distributed store driven from C through MXNet's C API only (include/mxkv/c_api.h),
 * as MXNet's C users write it: every node of the job runs this program; a scheduler or
 * server node creates the store and calls MXKVStoreRunServer until the job ends, a worker
 * runs the checks below and frees its store (which does the barrier before exit).
 *
 Workers check: rank and group size against DMLC_TASK_ID / DMLC_NUM_WORKER; keys summing
 * exactly over rounds, as int keys (Init/Push/Pull; argument `int`) or string keys
 * (InitEx/PushEx/PullEx; argument `str`: a store uses one kind, as in MXNet), among them two
 * devices' values in one push and a key above MXNET_KVSTORE_BIGARRAY_BOUND, split over the
 * servers; Barrier; and errors: a pull of a key never inited and a push of an int32 array
 * give -1 and a message, and leave the store working; a second dist store in the process,
 * and one after the first was freed, give -1 and a message.
 *
 * Run by `make ctest-dist` with bindings/python/mxkv_launch.py (1 scheduler, 1 or 2
 * servers, 2 workers on 127.0.0.1, under `timeout`). By hand, after `make build`:
 *   gcc -std=c11 -Wall -Wextra -Wpedantic -Werror -D_GNU_SOURCE -Iinclude \
 *       ctests/dist/dist_worker.c -Lbuild/lib -lmxkv -Wl,-rpath,$PWD/build/lib \
 *       -lpthread -o /tmp/dist_worker
 *   MXNET_KVSTORE_BIGARRAY_BOUND=20 timeout 120 python3 bindings/python/mxkv_launch.py \
 *       -n 2 -s 1 --timeout 100 /tmp/dist_worker int
 */
#include "../check.h"

#define BIG 45 /* values of key 9: above the bound of 20 the make target sets */

static int env_int(const char *name) {
  const char *v = getenv(name);
  if (v == NULL) {
    fprintf(stderr, "%s is not set (run under mxkv_launch.py)\n", name);
    exit(1);
  }
  return atoi(v);
}

static void fill(float *v, size_t n, float x) {
  for (size_t i = 0; i < n; i++) v[i] = x;
}

/* Keys 0, 1, 2 of the test: int keys 3, 9, 4 or string keys "w", "big", "b". */
static int g_str;
static const int INT_KEYS[3] = {3, 9, 4};
static const char *STR_KEYS[3] = {"w", "big", "b"};

/* Init (is_push 0) or push of keys idx[0..num), at most 4, as int or string keys. */
static int send_keys(KVStoreHandle kv, int is_push, uint32_t num, const int *idx,
                     NDArrayHandle *vals) {
  int ik[4];
  const char *sk[4];
  CHECK(num <= 4);
  for (uint32_t i = 0; i < num; i++) {
    ik[i] = INT_KEYS[idx[i]];
    sk[i] = STR_KEYS[idx[i]];
  }
  if (g_str)
    return is_push ? MXKVStorePushEx(kv, num, sk, vals, 0) : MXKVStoreInitEx(kv, num, sk, vals);
  return is_push ? MXKVStorePush(kv, num, ik, vals, 0) : MXKVStoreInit(kv, num, ik, vals);
}

static int init(KVStoreHandle kv, uint32_t num, const int *idx, NDArrayHandle *vals) {
  return send_keys(kv, 0, num, idx, vals);
}

static int push(KVStoreHandle kv, uint32_t num, const int *idx, NDArrayHandle *vals) {
  return send_keys(kv, 1, num, idx, vals);
}

static int pull(KVStoreHandle kv, int idx, NDArrayHandle out) {
  return g_str ? MXKVStorePullEx(kv, 1, &STR_KEYS[idx], &out, 0)
               : MXKVStorePull(kv, 1, &INT_KEYS[idx], &out, 0);
}

/* Pulls key idx (n values) and checks every value is want[i]. */
static void check_pull(KVStoreHandle kv, int idx, size_t n, const float *want) {
  NDArrayHandle o = make_f32(n, NULL);
  CHECK_OK(pull(kv, idx, o));
  CHECK_F32V(o, n, want);
  CHECK_OK(MXNDArrayFree(o));
}

int main(int argc, char **argv) {
  int worker = -1, server = -1, scheduler = -1;
  CHECK_OK(MXKVStoreIsWorkerNode(&worker));
  CHECK_OK(MXKVStoreIsServerNode(&server));
  CHECK_OK(MXKVStoreIsSchedulerNode(&scheduler));
  CHECK(worker + server + scheduler == 1);

  KVStoreHandle kv = NULL;
  CHECK_OK(MXKVStoreCreate("dist_sync", &kv));
  if (!worker) {
    /* MXNet's C users: a server or scheduler node serves until the workers are done */
    CHECK_OK(MXKVStoreRunServer(kv, NULL, NULL));
    CHECK_OK(MXKVStoreFree(kv));
    return 0;
  }
  CHECK(argc == 2 && (strcmp(argv[1], "int") == 0 || strcmp(argv[1], "str") == 0));
  g_str = strcmp(argv[1], "str") == 0;

  int rank = -1, size = -1;
  CHECK_OK(MXKVStoreGetRank(kv, &rank));
  CHECK_OK(MXKVStoreGetGroupSize(kv, &size));
  CHECK(size == env_int("DMLC_NUM_WORKER"));
  CHECK(rank == env_int("DMLC_TASK_ID")); /* the launcher pins ports in rank order */
  const float n = (float)size, s = n * (n + 1) / 2; /* sum over ranks of (rank + 1) */
  float want[BIG];

  /* one dist store per worker process (MXNet 1.9.1 waits forever in a second create) */
  {
    KVStoreHandle second = NULL;
    CHECK_ERR(MXKVStoreCreate("dist_sync", &second), "already has a dist store");
    CHECK(second == NULL);
  }

  /* a key nobody inited: -1 and a message naming it */
  {
    NDArrayHandle o = make_f32(4, NULL);
    CHECK_ERR(pull(kv, 0, o), g_str ? "key w has not been inited" : "key 3 has not been inited");
    CHECK_OK(MXNDArrayFree(o));
  }

  /* key 0: 4 values; key 1: BIG values (split over the servers); key 2: 3 values of 1 */
  float ones[BIG];
  fill(ones, BIG, 1.0f);
  NDArrayHandle vals[3] = {make_f32(4, NULL), make_f32(BIG, NULL), make_f32(3, ones)};
  CHECK_OK(init(kv, 3, (const int[]){0, 1, 2}, vals));
  for (int i = 0; i < 3; i++) CHECK_OK(MXNDArrayFree(vals[i]));
  fill(want, 3, 1.0f);
  check_pull(kv, 2, 3, want); /* rank 0's init, seen by every worker after Init's barrier */

  for (int t = 0; t < 3; t++) {
    float a[4], b[4], big[BIG], c[3];
    /* key 0: two devices' values in one call, reduced on the worker first */
    fill(a, 4, (float)(rank + 1));
    fill(b, 4, (float)t);
    NDArrayHandle two[2] = {make_f32(4, a), make_f32(4, b)};
    CHECK_OK(push(kv, 2, (const int[]){0, 0}, two));
    /* keys 1 and 2 in one call */
    for (int i = 0; i < BIG; i++) big[i] = (float)(i * (rank + 1) + t);
    fill(c, 3, (float)(10 * t + rank));
    NDArrayHandle hv[2] = {make_f32(BIG, big), make_f32(3, c)};
    CHECK_OK(push(kv, 2, (const int[]){1, 2}, hv));

    fill(want, 4, s + n * (float)t);
    check_pull(kv, 0, 4, want);
    for (int i = 0; i < BIG; i++) want[i] = (float)i * s + n * (float)t;
    check_pull(kv, 1, BIG, want);
    fill(want, 3, n * (float)(10 * t) + (n - 1) * n / 2);
    check_pull(kv, 2, 3, want);

    for (int i = 0; i < 2; i++) {
      CHECK_OK(MXNDArrayFree(two[i]));
      CHECK_OK(MXNDArrayFree(hv[i]));
    }
    CHECK_OK(MXKVStoreBarrier(kv));
  }

  /* an int32 push: refused at the call (MXNet's server dies on it) */
  {
    NDArrayHandle i32 = make_typed(4, DT_I32, (const int32_t[]){1, 2, 3, 4});
    CHECK_ERR(push(kv, 1, (const int[]){0}, &i32), "float16/32/64 values only");
    CHECK_OK(MXNDArrayFree(i32));
    /* the key is unharmed: one more round sums as before */
    float a[4];
    fill(a, 4, (float)(rank + 1));
    NDArrayHandle h = make_f32(4, a);
    CHECK_OK(push(kv, 1, (const int[]){0}, &h));
    fill(want, 4, s);
    check_pull(kv, 0, 4, want);
    CHECK_OK(MXNDArrayFree(h));
  }

  CHECK_OK(MXKVStoreBarrier(kv));
  CHECK_OK(MXKVStoreFree(kv)); /* barrier before exit; rank 0 stops the servers */
  /* the node has finished: no new dist store in this process */
  CHECK_ERR(MXKVStoreCreate("dist_sync", &kv), "has already finished");
  printf("DIST C OK %s keys, rank %d of %d\n", argv[1], rank, size);
  return 0;
}
