/*
 * MXInitPSEnv and the process environment with bytes that are not UTF-8.
 * MXNet 1.9.1 keeps names and values as std::string: the call succeeds, and
 * a DMLC_ROLE of "work\xfe" makes the process neither a worker nor a server
 * (a set but unknown role: libmxnet.so gives the roles checked here, from
 * MXInitPSEnv and from the environment). libmxkv refused such a call with -1
 * before, and took
 * such a process-environment value for an unset one (so the node counted as
 * a worker, the default, and a dist store said the variable was not set).
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"

static void roles(int worker, int server, int scheduler) {
  int w = -1, s = -1, c = -1;
  CHECK_OK(MXKVStoreIsWorkerNode(&w));
  CHECK_OK(MXKVStoreIsServerNode(&s));
  CHECK_OK(MXKVStoreIsSchedulerNode(&c));
  if (w != worker || s != server || c != scheduler) {
    fprintf(stderr, "roles worker %d server %d scheduler %d, expected %d %d %d\n", w, s, c,
            worker, server, scheduler);
    exit(1);
  }
}

int main(void) {
  /* the process environment: a role that is not UTF-8 is set, and unknown */
  CHECK(setenv("DMLC_ROLE", "sched\xff", 1) == 0);
  roles(0, 0, 0);
  CHECK(unsetenv("DMLC_ROLE") == 0);
  roles(1, 0, 0);

  /* MXInitPSEnv: names and values that are not UTF-8 are accepted */
  const char *keys[] = {"DMLC_\xff\xfe", "DMLC_ROLE"};
  const char *vals[] = {"1", "work\xfe"};
  CHECK_OK(MXInitPSEnv(2, keys, vals));
  roles(0, 0, 0);
  const char *k2[] = {"DMLC_ROLE"};
  const char *v2[] = {"server"};
  CHECK_OK(MXInitPSEnv(1, k2, v2));
  roles(0, 1, 0);

  /* a dist store names the variable whose value it cannot use */
  const char *k3[] = {"DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI",
                      "DMLC_PS_ROOT_PORT"};
  const char *v3[] = {"worker", "1", "1", "127.0.0.1", "9\xff"};
  CHECK_OK(MXInitPSEnv(5, k3, v3));
  roles(1, 0, 0);
  KVStoreHandle kv = NULL;
  CHECK_ERR(MXKVStoreCreate("dist_sync", &kv), "DMLC_PS_ROOT_PORT");

  /* NULL strings are still refused */
  const char *k4[] = {NULL};
  CHECK_ERR(MXInitPSEnv(1, k4, v2), "keys");
  printf("test_psenv_bytes: OK\n");
  return 0;
}
