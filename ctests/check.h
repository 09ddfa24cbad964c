/*
 * Tiny helpers shared by the C tests in ctests/test_*.c.
 *
 *   CHECK_OK(call)            the call must return 0; otherwise print the line,
 *                             the call and MXGetLastError(), and exit(1).
 *   CHECK_ERR(call, "text")   the call must return -1 and MXGetLastError() must
 *                             contain "text".
 *   CHECK(cond)               a plain assertion (also in release builds).
 *   CHECK_F32(h, n, ...)      the float32 array h holds exactly the n values.
 *   make_f32(n, vals)         a new 1-D float32 cpu(0) array holding vals.
 *
 * Set MXKV_TEST_VERBOSE=1 to print every expected error message (to review
 * their wording).
 */
#ifndef MXKV_CTESTS_CHECK_H
#define MXKV_CTESTS_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<mxnet/c_api.h>)
#include <mxnet/c_api.h>
#else
#include <mxkv/c_api.h>
#endif
#else
#include <mxkv/c_api.h>
#endif

/* dtype codes (mshadow type flags) */
enum {
  DT_F32 = 0, DT_F64 = 1, DT_F16 = 2, DT_U8 = 3, DT_I32 = 4, DT_I8 = 5, DT_I64 = 6,
  DT_BOOL = 7, DT_I16 = 8, DT_U16 = 9, DT_U32 = 10, DT_U64 = 11, DT_BF16 = 12
};
/* device types */
enum { DEV_CPU = 1, DEV_GPU = 2, DEV_CPU_PINNED = 3, DEV_CPU_SHARED = 5 };

static inline size_t dtype_size(int dtype) {
  static const size_t sizes[] = {4, 8, 2, 1, 4, 1, 8, 1, 2, 2, 4, 8, 2};
  return (dtype >= 0 && dtype <= 12) ? sizes[dtype] : 0;
}

static inline int check_verbose(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("MXKV_TEST_VERBOSE");
    v = e != NULL && e[0] != '\0' && e[0] != '0';
  }
  return v;
}

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#define CHECK_OK(call)                                                            \
  do {                                                                            \
    int check_rc_ = (call);                                                       \
    if (check_rc_ != 0) {                                                         \
      fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #call,    \
              check_rc_, MXGetLastError());                                       \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#define CHECK_ERR(call, substr)                                                   \
  do {                                                                            \
    int check_rc_ = (call);                                                       \
    if (check_rc_ != -1) {                                                        \
      fprintf(stderr, "%s:%d: %s returned %d, expected -1 with \"%s\"\n",          \
              __FILE__, __LINE__, #call, check_rc_, (substr));                     \
      exit(1);                                                                    \
    }                                                                             \
    const char *check_msg_ = MXGetLastError();                                    \
    if (check_msg_ == NULL || strstr(check_msg_, (substr)) == NULL) {              \
      fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", __FILE__,        \
              __LINE__, #call, check_msg_ ? check_msg_ : "(NULL)", (substr));      \
      exit(1);                                                                    \
    }                                                                             \
    if (check_verbose()) fprintf(stderr, "  [%d] %s\n", __LINE__, check_msg_);    \
  } while (0)

/* A new float32 array of the given shape holding vals (NULL: zeros). */
static inline NDArrayHandle make_f32_shape_at(const char *file, int line, const uint32_t *shape,
                                              uint32_t ndim, const float *vals) {
  NDArrayHandle h = NULL;
  size_t n = 1;
  for (uint32_t i = 0; i < ndim; i++) n *= shape[i];
  if (MXNDArrayCreateEx(shape, ndim, DEV_CPU, 0, 0, DT_F32, &h) != 0 ||
      (vals != NULL && MXNDArraySyncCopyFromCPU(h, vals, n) != 0)) {
    fprintf(stderr, "%s:%d: making a float32 array failed: %s\n", file, line, MXGetLastError());
    exit(1);
  }
  return h;
}
#define make_f32_shape(shape, ndim, vals) make_f32_shape_at(__FILE__, __LINE__, shape, ndim, vals)
#define make_f32(n, ...) \
  make_f32_shape_at(__FILE__, __LINE__, (const uint32_t[]){(uint32_t)(n)}, 1, __VA_ARGS__)

/* A new 1-D array of `n` elements of `dtype` on (dev_type, dev_id), holding
   the raw bytes at `data` (NULL: zeros). */
static inline NDArrayHandle make_typed_at(const char *file, int line, uint32_t n, int dtype,
                                          int dev_type, int dev_id, const void *data) {
  NDArrayHandle h = NULL;
  if (MXNDArrayCreateEx(&n, 1, dev_type, dev_id, 0, dtype, &h) != 0 ||
      (data != NULL && MXNDArraySyncCopyFromCPU(h, data, n) != 0)) {
    fprintf(stderr, "%s:%d: making an array of dtype %d failed: %s\n", file, line, dtype,
            MXGetLastError());
    exit(1);
  }
  return h;
}
/* (`...` is the data pointer: a compound literal with commas may be passed) */
#define make_typed(n, dtype, ...) \
  make_typed_at(__FILE__, __LINE__, n, dtype, DEV_CPU, 0, __VA_ARGS__)

/* A new row_sparse float32 array of shape (rows, cols) storing the rows
   `idx[0..nidx)` with `data` (nidx * cols values), built as frontends do:
   CreateSparseEx, then SyncCopyFromNDArray of the data (-1) and indices (0). */
static inline NDArrayHandle make_rsp_at(const char *file, int line, uint32_t rows, uint32_t cols,
                                        const int64_t *idx, uint32_t nidx, const float *data) {
  uint32_t shape[2] = {rows, cols}, aux_shape[1] = {0}, aux_ndims[1] = {1}, dshape[2] = {nidx, cols};
  int aux_type[1] = {DT_I64};
  NDArrayHandle sp = NULL, d = NULL, i = NULL;
  if (MXNDArrayCreateSparseEx(1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape,
                              &sp) != 0 ||
      MXNDArrayCreateEx(dshape, 2, DEV_CPU, 0, 0, DT_F32, &d) != 0 ||
      MXNDArrayCreateEx(&nidx, 1, DEV_CPU, 0, 0, DT_I64, &i) != 0 ||
      (nidx > 0 && MXNDArraySyncCopyFromCPU(d, data, (size_t)nidx * cols) != 0) ||
      (nidx > 0 && MXNDArraySyncCopyFromCPU(i, idx, nidx) != 0) ||
      MXNDArraySyncCopyFromNDArray(sp, d, -1) != 0 || MXNDArraySyncCopyFromNDArray(sp, i, 0) != 0 ||
      MXNDArrayFree(d) != 0 || MXNDArrayFree(i) != 0) {
    fprintf(stderr, "%s:%d: making a row_sparse array failed: %s\n", file, line, MXGetLastError());
    exit(1);
  }
  return sp;
}
#define make_rsp(rows, cols, idx, nidx, ...) \
  make_rsp_at(__FILE__, __LINE__, rows, cols, idx, nidx, __VA_ARGS__)

static inline void read_f32_at(const char *file, int line, NDArrayHandle h, float *out, size_t n) {
  if (MXNDArraySyncCopyToCPU(h, out, n) != 0) {
    fprintf(stderr, "%s:%d: reading a float32 array failed: %s\n", file, line, MXGetLastError());
    exit(1);
  }
}
#define read_f32(h, out, n) read_f32_at(__FILE__, __LINE__, h, out, n)

/* Compares bit patterns, so -0.0 != 0.0 and NaN == NaN (same bits). */
static inline void check_f32_at(const char *file, int line, NDArrayHandle h, size_t n,
                                const float *want) {
  float got[256];
  if (n > 256) {
    fprintf(stderr, "%s:%d: check_f32: n %zu too large\n", file, line, n);
    exit(1);
  }
  read_f32_at(file, line, h, got, n);
  if (memcmp(got, want, n * sizeof(float)) != 0) {
    fprintf(stderr, "%s:%d: array mismatch:\n  got ", file, line);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %.9g", (double)got[i]);
    fprintf(stderr, "\n  want");
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %.9g", (double)want[i]);
    fprintf(stderr, "\n");
    exit(1);
  }
}
#define CHECK_F32(h, n, ...) check_f32_at(__FILE__, __LINE__, h, n, (const float[]){__VA_ARGS__})
#define CHECK_F32V(h, n, vals) check_f32_at(__FILE__, __LINE__, h, n, vals)

/* Pulls int key `key` of `kv` into a fresh float32 array of n elements and
   checks the values. */
static inline void check_pull_f32_at(const char *file, int line, KVStoreHandle kv, int key,
                                     size_t n, const float *want) {
  NDArrayHandle out = make_f32_shape_at(file, line, (const uint32_t[]){(uint32_t)n}, 1, NULL);
  if (MXKVStorePull(kv, 1, &key, &out, 0) != 0) {
    fprintf(stderr, "%s:%d: pull of key %d failed: %s\n", file, line, key, MXGetLastError());
    exit(1);
  }
  check_f32_at(file, line, out, n, want);
  if (MXNDArrayFree(out) != 0) {
    fprintf(stderr, "%s:%d: free failed: %s\n", file, line, MXGetLastError());
    exit(1);
  }
}
#define CHECK_PULL(kv, key, n, ...) \
  check_pull_f32_at(__FILE__, __LINE__, kv, key, n, (const float[]){__VA_ARGS__})

/* String-key form of CHECK_PULL. */
static inline void check_pull_ex_f32_at(const char *file, int line, KVStoreHandle kv,
                                        const char *key, size_t n, const float *want) {
  NDArrayHandle out = make_f32_shape_at(file, line, (const uint32_t[]){(uint32_t)n}, 1, NULL);
  if (MXKVStorePullEx(kv, 1, &key, &out, 0) != 0) {
    fprintf(stderr, "%s:%d: pull of key \"%s\" failed: %s\n", file, line, key, MXGetLastError());
    exit(1);
  }
  check_f32_at(file, line, out, n, want);
  if (MXNDArrayFree(out) != 0) {
    fprintf(stderr, "%s:%d: free failed: %s\n", file, line, MXGetLastError());
    exit(1);
  }
}
#define CHECK_PULL_EX(kv, key, n, ...) \
  check_pull_ex_f32_at(__FILE__, __LINE__, kv, key, n, (const float[]){__VA_ARGS__})

/* Live handle counts (libmxkv's leak check). */
typedef struct {
  int kvstores;
  int ndarrays;
} live_t;

static inline live_t live_now(void) {
  live_t l = {-1, -1};
  if (mxkv_live_handles(&l.kvstores, &l.ndarrays) != 0) {
    fprintf(stderr, "mxkv_live_handles failed: %s\n", MXGetLastError());
    exit(1);
  }
  return l;
}

#define CHECK_LIVE(start)                                                             \
  do {                                                                                \
    live_t check_now_ = live_now();                                                   \
    if (check_now_.kvstores != (start).kvstores || check_now_.ndarrays != (start).ndarrays) { \
      fprintf(stderr, "%s:%d: live handles: %d kvstores, %d ndarrays; expected %d, %d\n", \
              __FILE__, __LINE__, check_now_.kvstores, check_now_.ndarrays,           \
              (start).kvstores, (start).ndarrays);                                    \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#endif /* MXKV_CTESTS_CHECK_H */
