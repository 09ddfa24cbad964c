/*
 * fork() while other threads are inside the library (as a training thread
 * creating and freeing arrays is while a data-loader forks its workers): the
 * child has only the forking thread, and a process-wide lock held by
 * another thread at the fork would stay held in it forever. libmxkv holds
 * its locks (the handle registries', the store count's, the ps-lite
 * variables') in a pthread_atfork prepare handler (src/capi/boundary.rs);
 * before that, about one child in fifteen hung in its first
 * MXNDArrayCreateEx, and with the store count's lock of 8ea6358 one child
 * in a hundred hung in MXKVStoreCreate.
 *
 * Two threads create and free arrays in a loop, a third creates and frees
 * stores and asks for the node's role, two more create and free big arrays
 * (32 MiB: the buffer pool's lock, src/ndarray/pool.rs), and one tries to
 * create a dist store (the ps-lite variables name a scheduler port nothing
 * listens on, with a deadline of 0.3 s: the worker node's lock of
 * src/factory.rs) and calls MXNotifyShutdown (the dist stores' list there).
 * The main thread forks 200 times; each child asks for its role, creates an
 * array, a store, pushes and pulls, creates and frees a big array, calls
 * MXNotifyShutdown, in every tenth round tries a dist store (which must
 * fail, not hang), and exits
 * (alarm(): a child that hangs is killed, and the test fails). Locks of single
 * arrays or stores other threads hold at the fork stay held in the child,
 * as in MXNet, so the child uses only its own. Before the pool's and the
 * factory's locks were held across fork() too, a child hung within 20
 * rounds (the first dist store try; and about one child in 100 on the pool).
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"
#include "fork_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static void *churn_arrays(void *arg) {
  (void)arg;
  while (churning()) {
    NDArrayHandle h = make_f32(4, NULL);
    CHECK_OK(MXNDArrayFree(h));
  }
  return NULL;
}

/* stores and the ps-lite environment: their process-wide locks too */
static void *churn_stores(void *arg) {
  (void)arg;
  while (churning()) {
    KVStoreHandle kv;
    int w = -1;
    CHECK_OK(MXKVStoreCreate("local", &kv));
    CHECK_OK(MXKVStoreIsWorkerNode(&w));
    CHECK_OK(MXKVStoreFree(kv));
  }
  return NULL;
}

/* a dist store that cannot start (no scheduler), and MXNotifyShutdown */
static void *churn_dist(void *arg) {
  (void)arg;
  while (churning()) {
    KVStoreHandle kv;
    CHECK(MXKVStoreCreate("dist_sync", &kv) == -1);
    CHECK_OK(MXNotifyShutdown());
  }
  return NULL;
}

static int child(int round) {
  int w = -1;
  if (MXKVStoreIsWorkerNode(&w) != 0 || w != 1) return 6;
  NDArrayHandle a = make_f32(2, (float[]){1, 2});
  NDArrayHandle out = make_f32(2, NULL);
  KVStoreHandle kv;
  int k = 5;
  if (MXKVStoreCreate("local", &kv) != 0 || MXKVStoreInit(kv, 1, &k, &a) != 0 ||
      MXKVStorePush(kv, 1, &k, &a, 0) != 0 || MXKVStorePull(kv, 1, &k, &out, 0) != 0)
    return 3;
  float v[2];
  if (MXNDArraySyncCopyToCPU(out, v, 2) != 0 || v[0] != 1 || v[1] != 2) return 4;
  if (MXKVStoreFree(kv) != 0 || MXNDArrayFree(a) != 0 || MXNDArrayFree(out) != 0) return 5;
  NDArrayHandle big;
  if (MXNDArrayCreateEx(&CHURN_BIG, 1, DEV_CPU, 0, 0, DT_F32, &big) != 0 ||
      MXNDArrayFree(big) != 0)
    return 7;
  if (MXNotifyShutdown() != 0) return 8;
  if (round % 10 == 0 && MXKVStoreCreate("dist_sync", &kv) != -1) return 9;
  return 0;
}

int main(int argc, char **argv) {
  if (under_asan()) {
    /* ASan's own allocator lock, held by another thread at a fork, stays held
       in the child (seen: children hung in asan_malloc): not a test of ours */
    printf("test_fork_threads: skipped under AddressSanitizer (its allocator is not fork-safe)\n");
    return 0;
  }
  if (under_valgrind()) {
    /* a child's leak check counts the arrays the parent's other threads
       held at the fork (their stacks are not in the child) as lost */
    printf("test_fork_threads: skipped under valgrind (children leak what other threads held)\n");
    return 0;
  }
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  /* No pool: the big arrays' loop is mmap and munmap of untouched memory, so
     it spends its time near the pool's lock (read before the first big
     array is freed). */
  CHECK(setenv("MXKV_CPU_MEM_POOL_MB", "0", 1) == 0);
  /* a port nothing listens on (bound, never listening), for the scheduler */
  int no_listen = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(no_listen >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  CHECK(bind(no_listen, (struct sockaddr *)&addr, sizeof addr) == 0);
  CHECK(getsockname(no_listen, (struct sockaddr *)&addr, &alen) == 0);
  char port[16];
  snprintf(port, sizeof port, "%d", ntohs(addr.sin_port));
  const char *keys[] = {"DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI",
                        "DMLC_PS_ROOT_PORT", "MXKV_TIMEOUT_S"};
  const char *vals[] = {"worker", "1", "1", "127.0.0.1", port, "0.3"};
  CHECK_OK(MXInitPSEnv(6, keys, vals));
  churn(churn_arrays);
  churn(churn_arrays);
  churn(churn_stores);
  churn(churn_big);
  churn(churn_big);
  churn(churn_dist);
  int bad = fork_rounds(rounds, child, 10);
  churn_stop();
  close(no_listen);
  CHECK(bad == 0);
  printf("test_fork_threads: OK\n");
  return 0;
}
