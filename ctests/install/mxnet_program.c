/*
 * A program written for MXNet's <mxnet/c_api.h>, in the style of MXNet's own
 * examples: mx_float buffers, mx_uint shapes, dim_t, the handle typedefs, a
 * MXKVStoreUpdater and (in C++) MXKVStoreGetNumDeadNode's default argument.
 * It is valid C11 and C++17; ctests/install/check.sh builds it both ways,
 * -Wall -Wextra -Werror, against an installed libmxkv found by pkg-config.
 */
#include <mxnet/c_api.h>

#include <stdio.h>
#include <stdlib.h>

#define CALL(x)                                                              \
  do {                                                                       \
    if ((x) != 0) {                                                          \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x,     \
              MXGetLastError());                                             \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define EXPECT(c)                                                            \
  do {                                                                       \
    if (!(c)) {                                                              \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #c);      \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static NDArrayHandle make(const mx_uint *shape, mx_uint ndim, const mx_float *data, size_t n) {
  NDArrayHandle h = NULL;
  CALL(MXNDArrayCreate(shape, ndim, 1, 0, 0, &h));
  CALL(MXNDArraySyncCopyFromCPU(h, data, n));
  return h;
}

/* stored += 2 * recv, written through MXNet's updater function type. */
static void updater(int key, NDArrayHandle recv, NDArrayHandle local, void *handle) {
  mx_float r[6], l[6];
  int i;
  (void)key;
  ++*(int *)handle;
  CALL(MXNDArraySyncCopyToCPU(recv, r, 6));
  CALL(MXNDArraySyncCopyToCPU(local, l, 6));
  for (i = 0; i < 6; ++i) l[i] += 2 * r[i];
  CALL(MXNDArraySyncCopyFromCPU(local, l, 6));
}

int main(void) {
  const mx_uint shape[2] = {2, 3};
  const mx_float ones[6] = {1, 1, 1, 1, 1, 1};
  const mx_float grad[6] = {0.5f, 1, 1.5f, 2, 2.5f, 3};
  mx_float out[6];
  const int key = 3;
  int calls = 0, version = 0, dead = -1, i;
  mx_uint ndim = 0;
  const mx_uint *dims = NULL;
  int ndim64 = 0;
  const dim_t *dims64 = NULL;
  MXKVStoreUpdater *fn = updater;
  KVStoreHandle kv = NULL;
  NDArrayHandle w, g, o;

  CALL(MXGetVersion(&version));
  EXPECT(version == 10901);
  CALL(MXKVStoreCreate("local", &kv));
  w = make(shape, 2, ones, 6);
  g = make(shape, 2, grad, 6);
  o = make(shape, 2, ones, 6);
  CALL(MXKVStoreInit(kv, 1, &key, &w));
  CALL(MXKVStoreSetUpdater(kv, fn, &calls));
  CALL(MXKVStorePush(kv, 1, &key, &g, 0));
  CALL(MXKVStorePull(kv, 1, &key, &o, 0));
  CALL(MXNDArrayWaitAll());
  CALL(MXNDArraySyncCopyToCPU(o, out, 6));
  for (i = 0; i < 6; ++i) EXPECT(out[i] == ones[i] + 2 * grad[i]);
  EXPECT(calls == 1);

  CALL(MXNDArrayGetShape(o, &ndim, &dims));
  EXPECT(ndim == 2 && dims[0] == 2 && dims[1] == 3);
  CALL(MXNDArrayGetShapeEx64(o, &ndim64, &dims64));
  EXPECT(ndim64 == 2 && dims64[0] == 2 && dims64[1] == 3);

#ifdef __cplusplus
  /* MXNet's C++ default argument: timeout_sec = 60 (JNI glue calls it so). */
  CALL(MXKVStoreGetNumDeadNode(kv, 0, &dead));
#else
  CALL(MXKVStoreGetNumDeadNode(kv, 0, &dead, 60));
#endif
  EXPECT(dead == 0);

  CALL(MXNDArrayFree(w));
  CALL(MXNDArrayFree(g));
  CALL(MXNDArrayFree(o));
  CALL(MXKVStoreFree(kv));
  printf("mxnet_program: ok (%s)\n",
#ifdef __cplusplus
         "C++"
#else
         "C"
#endif
  );
  return 0;
}
