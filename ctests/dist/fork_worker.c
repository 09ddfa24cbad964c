/*
 * A worker forks while its dist store is up; the child (a C frontend's
 * forked helper process) frees its copy of the handle and ends, and the
 * parent goes on with its job. The child's calls on the parent's store fail
 * naming the owning process, its MXKVStoreFree and MXNotifyShutdown return 0
 * and leave the parent's node alone (src/dist/store.rs); before that the
 * child's Free tore down the parent's ZeroMQ context and the parent aborted.
 * (MXNet 1.9.1's child hangs at exit instead.)
 *
 * Run by `make ctest-dist` on 2 workers and 1 server (every node runs this
 * program: scheduler and server serve). Prints DIST FORK OK per worker.
 */
#include "../check.h"
#include "../fork_util.h"

static void pull_check(KVStoreHandle kv, float want) {
  NDArrayHandle o = make_f32(4, NULL);
  int k = 3;
  CHECK_OK(MXKVStorePull(kv, 1, &k, &o, 0));
  CHECK_F32(o, 4, want, want, want, want);
  CHECK_OK(MXNDArrayFree(o));
}

static void push_all(KVStoreHandle kv, float v) {
  NDArrayHandle h = make_f32(4, (float[]){v, v, v, v});
  int k = 3;
  CHECK_OK(MXKVStorePush(kv, 1, &k, &h, 0));
  CHECK_OK(MXNDArrayFree(h));
}

static KVStoreHandle kv;

/* the forked child: its calls on the parent's store fail, Free and
   MXNotifyShutdown leave the parent's node alone */
static int child(void *arg) {
  (void)arg;
  int k = 3;
  NDArrayHandle h = make_f32(4, (float[]){1, 1, 1, 1});
  CHECK_ERR(MXKVStorePush(kv, 1, &k, &h, 0), "a forked child");
  CHECK_ERR(MXKVStoreBarrier(kv), "a forked child");
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_OK(MXNotifyShutdown());
  CHECK_OK(MXNDArrayFree(h));
  return 0;
}

int main(void) {
  int worker = -1;
  CHECK_OK(MXKVStoreIsWorkerNode(&worker));
  CHECK_OK(MXKVStoreCreate("dist_sync", &kv));
  if (!worker) {
    CHECK_OK(MXKVStoreRunServer(kv, NULL, NULL));
    CHECK_OK(MXKVStoreFree(kv));
    return 0;
  }
  int rank = -1, size = -1;
  CHECK_OK(MXKVStoreGetRank(kv, &rank));
  CHECK_OK(MXKVStoreGetGroupSize(kv, &size));
  NDArrayHandle z = make_f32(4, NULL);
  int k = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &z));
  push_all(kv, 1);
  pull_check(kv, (float)size); /* a sync round stores the sum of its pushes */

  CHECK_CHILD(wait_child(fork_child(child, NULL, 30)), "the forked worker");

  /* the parent's job goes on: another round sums every worker's push */
  push_all(kv, 3);
  pull_check(kv, 3.0f * (float)size);
  CHECK_OK(MXKVStoreBarrier(kv));
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_OK(MXNDArrayFree(z));
  printf("DIST FORK OK rank %d of %d\n", rank, size);
  return 0;
}
