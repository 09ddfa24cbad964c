/*
 * C++ callbacks that throw. MXNet 1.9.1 calls the updater inside the push's
 * API_BEGIN/API_END, so an exception becomes the push's -1 and error text;
 * libmxkv calls user callbacks through a try/catch trampoline
 * (csrc/callbacks.cc) for the same result: the push returns -1 with the
 * exception's what() in MXGetLastError, nothing unwinds into the library or
 * out of the C API, and the store stays usable.
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind), with g++.
 */
#include <mxkv/c_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

/* check.h's helpers, in C++ (check.h uses C compound literals) */
#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#define CHECK_OK(call)                                                                \
  do {                                                                                \
    int rc_ = (call);                                                                 \
    if (rc_ != 0) {                                                                   \
      fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #call, rc_,  \
              MXGetLastError());                                                      \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#define CHECK_ERR(call, substr)                                                       \
  do {                                                                                \
    int rc_ = (call);                                                                 \
    const char *msg_ = rc_ == -1 ? MXGetLastError() : "";                             \
    if (rc_ != -1 || strstr(msg_, (substr)) == nullptr) {                             \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected -1 with \"%s\"\n",          \
              __FILE__, __LINE__, #call, rc_, msg_, (substr));                        \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static void check_f32(NDArrayHandle h, float a, float b) {
  float v[2];
  CHECK_OK(MXNDArraySyncCopyToCPU(h, v, 2));
  if (v[0] != a || v[1] != b) {
    fprintf(stderr, "values %g %g, expected %g %g\n", v[0], v[1], a, b);
    exit(1);
  }
}

static int g_calls;

static void throwing_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *) {
  g_calls++;
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
  throw std::runtime_error("optimizer failed for key " + std::to_string(key));
}

static void throwing_int(int, NDArrayHandle recv, NDArrayHandle local, void *) {
  g_calls++;
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
  throw 42;
}

static void throwing_str(const char *key, NDArrayHandle recv, NDArrayHandle local, void *) {
  g_calls++;
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
  throw std::invalid_argument(std::string("bad string key ") + key);
}

/* local += recv */
static void add_updater(int, NDArrayHandle recv, NDArrayHandle local, void *) {
  g_calls++;
  float r[2], l[2];
  if (MXNDArraySyncCopyToCPU(recv, r, 2) != 0 || MXNDArraySyncCopyToCPU(local, l, 2) != 0) abort();
  l[0] += r[0];
  l[1] += r[1];
  if (MXNDArraySyncCopyFromCPU(local, l, 2) != 0) abort();
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
}

static NDArrayHandle f32_2(float a, float b) {
  const uint32_t shape[1] = {2};
  const float v[2] = {a, b};
  NDArrayHandle h = nullptr;
  CHECK_OK(MXNDArrayCreateEx(shape, 1, 1, 0, 0, 0, &h));
  CHECK_OK(MXNDArraySyncCopyFromCPU(h, v, 2));
  return h;
}

int main() {
  KVStoreHandle kv = nullptr;
  CHECK_OK(MXKVStoreCreate("local", &kv));
  NDArrayHandle a = f32_2(1, 2), out = f32_2(0, 0);
  int k = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &k, &a));

  /* a std::exception: its what() reaches MXGetLastError */
  CHECK_OK(MXKVStoreSetUpdater(kv, throwing_updater, nullptr));
  try {
    CHECK_ERR(MXKVStorePush(kv, 1, &k, &a, 0), "optimizer failed for key 3");
    CHECK_ERR(MXKVStorePush(kv, 1, &k, &a, 0), "MXKVStorePush: the updater of key 3 threw");
    CHECK_ERR(MXKVStorePushPull(kv, 1, &k, 1, &k, &a, &out, 0), "optimizer failed for key 3");
  } catch (...) {
    fprintf(stderr, "an exception escaped the C API\n");
    return 1;
  }
  CHECK(g_calls == 3);

  /* anything else thrown */
  CHECK_OK(MXKVStoreSetUpdater(kv, throwing_int, nullptr));
  CHECK_ERR(MXKVStorePush(kv, 1, &k, &a, 0), "not a std::exception");
  CHECK(g_calls == 4);

  /* the string-key updater */
  KVStoreHandle skv = nullptr;
  CHECK_OK(MXKVStoreCreate("local", &skv));
  const char *sk = "weight";
  CHECK_OK(MXKVStoreInitEx(skv, 1, &sk, &a));
  CHECK_OK(MXKVStoreSetUpdaterEx(skv, add_updater, throwing_str, nullptr));
  CHECK_ERR(MXKVStorePushEx(skv, 1, &sk, &a, 0), "bad string key weight");
  CHECK(g_calls == 5);
  CHECK_OK(MXKVStoreFree(skv));

  /* the store still works: the stored value is unchanged, a good updater runs */
  CHECK_OK(MXKVStorePull(kv, 1, &k, &out, 0));
  check_f32(out, 1, 2);
  CHECK_OK(MXKVStoreSetUpdater(kv, add_updater, nullptr));
  CHECK_OK(MXKVStorePush(kv, 1, &k, &a, 0));
  CHECK_OK(MXKVStorePull(kv, 1, &k, &out, 0));
  check_f32(out, 2, 4);
  CHECK(g_calls == 6);

  CHECK_OK(MXKVStoreFree(kv));
  CHECK_OK(MXNDArrayFree(a));
  CHECK_OK(MXNDArrayFree(out));
  printf("test_cxx_callbacks: OK\n");
  return 0;
}
