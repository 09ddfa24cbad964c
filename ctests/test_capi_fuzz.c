/*
 * A randomized call-sequence fuzzer over the whole exported C API
 * (include/mxkv/c_api.h). From a seed it makes long random sequences of calls
 * to every function of the header and keeps a model of what should be valid:
 *
 *   - a call the model says is valid must return 0, and its results are
 *     checked (shapes, dtypes, contexts, storage types; a pull after pushes
 *     gives the exact sum, or the sum added by the test's updater; a
 *     row_sparse_pull gives the requested rows; a save/load round trip gives
 *     the arrays back);
 *   - a call with one defect the model knows to be invalid (NULL, freed,
 *     foreign or wrong-kind handles, NULL arrays with a nonzero count, wrong
 *     counts, shape/dtype mismatches, uninitialised or duplicate keys, keys
 *     of the other kind, gpu contexts, wrong sizes, truncated buffers) must
 *     return -1 with a text naming the function, and an all-or-nothing call
 *     (init, broadcast, pushpull) must leave the store as it was;
 *   - "chaos" calls whose outcome the model does not predict (corrupt
 *     buffers, odd shapes) must return 0 or -1 with a text; the model then
 *     forgets what it cannot know and learns it back from later pulls.
 *
 * libmxkv's MXKVMTSeed and MXKVMTDraw (MXNet's random engines, kept by the
 * caller) are checked without a second generator: seeding recurrence, the
 * split over engines, positions, determinism, continuation, the three views
 * of one state's outputs, one known output (see "MT random draws").
 *
 * Every value is a small non-negative integer, exact in every dtype, so sums
 * are exact whatever the summation order. Every handle made is freed at the
 * end of a seed (checked with mxkv_live_handles).
 *
 * A threaded mode runs several threads on a shared pool of array and store
 * handles, freeing and using them concurrently; results are only checked for
 * "0, or -1 with a text" (no crash, hang or leak).
 *
 * Usage:
 *   test_capi_fuzz                      the bounded CI run (fixed seeds)
 *   test_capi_fuzz SEED OPS [THREADS]   one seed: OPS calls single-threaded,
 *                                       then (THREADS > 0) a threaded run
 * MXKV_FUZZ_TRACE=1 prints every operation (to minimise a failure).
 * A run that makes no progress for MXKV_FUZZ_HANG_S seconds (default 120)
 * is reported as a hang (exit 3).
 */
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------- plumbing */

static uint64_t g_rng;
static atomic_long g_beat; /* progress, for the watchdog */
static long g_op;       /* operation number in the current seed */
static uint64_t g_seed; /* current seed */
static int g_trace;
static unsigned char *g_keep; /* MXKV_FUZZ_KEEP: the operations to run (others skipped) */
static const char *g_what = ""; /* the current operation, for messages */
/* statistics: calls that had to succeed, had to fail, either; elements compared */
static long g_n_ok, g_n_fail, g_n_any, g_n_checked;
static long g_n_mt; /* MXKVMTSeed / MXKVMTDraw operations */

static uint64_t rnd(void) {
  /* xorshift64* */
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 2685821657736338717ull;
}
static int rn(int n) { return n <= 0 ? 0 : (int)(rnd() % (uint64_t)n); }
static bool chance(int pct) { return rn(100) < pct; }

#define FAIL(...)                                                                  \
  do {                                                                             \
    fprintf(stderr, "test_capi_fuzz: seed %llu op %ld (%s), line %d: ",            \
            (unsigned long long)g_seed, g_op, g_what, __LINE__);                   \
    fprintf(stderr, __VA_ARGS__);                                                  \
    fprintf(stderr, "\n");                                                         \
    exit(1);                                                                       \
  } while (0)

#define TRACE(...)                                \
  do {                                            \
    if (g_trace) {                                \
      fprintf(stderr, "[%ld] ", g_op);            \
      fprintf(stderr, __VA_ARGS__);               \
      fprintf(stderr, "\n");                      \
    }                                             \
  } while (0)

/* A call the model says is valid. */
#define MUST_OK(call)                                                              \
  do {                                                                             \
    int rc_ = (call);                                                              \
    g_n_ok++;                                                                      \
    if (rc_ != 0) FAIL("%s returned %d: %s", #call, rc_, MXGetLastError());         \
  } while (0)

static void check_err_text(const char *call) {
  const char *m = MXGetLastError();
  if (m == NULL || m[0] != 'M') FAIL("%s: error text \"%s\" does not name the function", call, m ? m : "(NULL)");
}

/* A call with a defect the model knows. */
#define MUST_FAIL(call)                                                            \
  do {                                                                             \
    int rc_ = (call);                                                              \
    g_n_fail++;                                                                    \
    if (rc_ != -1) FAIL("%s returned %d, expected -1", #call, rc_);                 \
    check_err_text(#call);                                                         \
    if (g_trace) fprintf(stderr, "    -> %s\n", MXGetLastError());                 \
  } while (0)

/* A call whose outcome the model does not predict: 0, or -1 with a text. */
static int any_rc(int rc, const char *call) {
  g_n_any++;
  if (rc != 0 && rc != -1) FAIL("%s returned %d", call, rc);
  if (rc == -1) check_err_text(call);
  if (g_trace) fprintf(stderr, "    (chaos) -> %d %s\n", rc, rc ? MXGetLastError() : "");
  return rc;
}
#define ANY(call) any_rc((call), #call)

/* ------------------------------------------------------- element values */

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0) return (uint16_t)sign; /* zero (and tiny) */
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) return (uint16_t)sign; /* not used: values are small integers */
  uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
  uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)h;
}
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (man == 0) {
      x = sign;
    } else {
      float f = (float)man / 16777216.0f;
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (man << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put_elem(int dt, void *p, size_t i, double v) {
  switch (dt) {
    case DT_F32: ((float *)p)[i] = (float)v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_F16: ((uint16_t *)p)[i] = f32_to_f16((float)v); break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case DT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case DT_I16: ((int16_t *)p)[i] = (int16_t)v; break;
    case DT_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case DT_U32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case DT_U64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case DT_BF16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      ((uint16_t *)p)[i] = (uint16_t)(x >> 16);
      break;
    }
    default: break;
  }
}
static double get_elem(int dt, const void *p, size_t i) {
  switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case DT_U8: return ((const uint8_t *)p)[i];
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I8: return ((const int8_t *)p)[i];
    case DT_I64: return (double)((const int64_t *)p)[i];
    case DT_BOOL: return ((const uint8_t *)p)[i];
    case DT_I16: return ((const int16_t *)p)[i];
    case DT_U16: return ((const uint16_t *)p)[i];
    case DT_U32: return ((const uint32_t *)p)[i];
    case DT_U64: return (double)((const uint64_t *)p)[i];
    case DT_BF16: {
      uint32_t x = (uint32_t)((const uint16_t *)p)[i] << 16;
      float f;
      memcpy(&f, &x, 4);
      return f;
    }
    default: return NAN;
  }
}

/* dtypes whose small integers (0..127) are exact: all but bool */
static int rand_value_dtype(void) {
  static const int dts[] = {DT_F32, DT_F32, DT_F32, DT_F64, DT_F16, DT_U8, DT_I32,
                            DT_I8,  DT_I64, DT_I16, DT_U16, DT_U32, DT_U64, DT_BF16};
  return dts[rn((int)(sizeof dts / sizeof dts[0]))];
}
/* a dense array's dtype: any, bool now and then */
static int rand_dense_dtype(void) { return rn(14) == 0 ? DT_BOOL : rand_value_dtype(); }
/* a value converted to dtype `dt` (values are exact in every dtype but bool) */
static double cast_to(int dt, double v) { return dt == DT_BOOL ? (double)(v != 0) : v; }

/* the largest value a model value may hold (exact in int8 and bfloat16) */
#define VMAX 127.0

/* Whether the values convert to `dt` exactly (else the model does not
   predict the converted output: compression makes fractions and negatives). */
static bool cast_exact(int dt, const double *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (v[i] != (double)(int64_t)v[i] || v[i] < 0 || v[i] > VMAX) {
      if (dt != DT_F32 && dt != DT_F64) return false;
      if (dt == DT_F32 && (double)(float)v[i] != v[i]) return false;
    }
  }
  return true;
}

/* ---------------------------------------------------------------- model */

#define MAXEL 64 /* elements of a model array: ndim <= 3, dims <= 4 */

typedef struct {
  NDArrayHandle h;
  bool live;
  int stype; /* -1 none, 0 dense, 1 row_sparse, 2 csr */
  int ndim;
  uint32_t shape[3];
  int dtype;
  int devt, devid;
  bool known; /* v holds the (densified) contents */
  double v[MAXEL];
  bool is_part; /* untracked contents: a handle on a part of another array (aux/data),
                  or a sparse array whose parts a chaos call replaced */
  int parent;   /* for a part: the array slot it came from (-1 none) */
} Arr;

#define NARR 48
static Arr g_arr[NARR];
#define NDEAD 16
static NDArrayHandle g_dead_nd[NDEAD]; /* freed array handles */
static KVStoreHandle g_dead_kv[NDEAD]; /* freed store handles */

typedef struct {
  bool inited;
  bool wild; /* a chaos call used it: storage type and value untracked, left alone */
  int stype; /* 0 dense, 1 row_sparse */
  int ndim;
  uint32_t shape[3];
  int dtype;
  bool known;
  double v[MAXEL];
} Key;

#define NKEYS 8
typedef struct {
  int mode; /* 0 none, 1 add, 2 assign, 3 noop, 4 add without a cap (threaded counter) */
  bool nested; /* calls back into the library */
  KVStoreHandle kv;
  KVStoreHandle side; /* threaded runs: a store without updater the updater pushes into */
  int keys_kind;      /* single-threaded runs: 1 int keys, 2 string keys (checked), 0 unchecked */
  bool str_cb;        /* a string updater is installed */
  bool free_store;    /* the next call frees the store it updates (kv), from inside */
  bool freed;         /* ... and did */
  atomic_long calls;
} UpdCtx;

typedef struct {
  KVStoreHandle h;
  bool live;
  bool str;      /* string keys */
  bool device;   /* device comm */
  bool compress; /* gradient compression set (values then unknown on device) */
  char type[32];
  UpdCtx *upd;
  Key keys[NKEYS];
} Store;

#define NSTORE 3
static Store g_st[NSTORE];
/* updater contexts: static, never freed (a store's updater handle must stay
   valid while pushes in flight may call it) */
static UpdCtx g_upd[NSTORE];

static const int INT_KEYS[NKEYS] = {0, 1, 2, 5, -1, -7, 1000000, INT_MAX};
static const char *STR_KEYS[NKEYS] = {"a", "b", "w0", "", "\xff\xfe", "\xc3\xa9t\xc3\xa9", "k:7",
                                      "a-rather-long-key-name-that-is-still-fine"};
static const int ABSENT_INT = 424242;
static const char *ABSENT_STR = "never-inited";

static size_t nelem(int ndim, const uint32_t *shape) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}
static size_t arr_n(const Arr *a) { return nelem(a->ndim, a->shape); }

static bool same_shape(int nd1, const uint32_t *s1, int nd2, const uint32_t *s2) {
  if (nd1 != nd2) return false;
  for (int i = 0; i < nd1; i++)
    if (s1[i] != s2[i]) return false;
  return true;
}

static void remember_dead_nd(NDArrayHandle h) { g_dead_nd[rn(NDEAD)] = h; }
static void remember_dead_kv(KVStoreHandle h) { g_dead_kv[rn(NDEAD)] = h; }

/* A handle that is not a live array: NULL, freed, a store, garbage. */
static int g_stack_int = 7;
static NDArrayHandle bad_nd_handle(bool allow_null) {
  for (;;) {
    switch (rn(6)) {
      case 0:
        if (allow_null) return NULL;
        break;
      case 1:
        if (g_dead_nd[0] || g_dead_nd[1]) {
          NDArrayHandle h = g_dead_nd[rn(NDEAD)];
          if (h) return h;
        }
        break;
      case 2:
        for (int i = 0; i < NSTORE; i++)
          if (g_st[i].live) return g_st[i].h;
        break;
      case 3: return (void *)(uintptr_t)(1 + rn(1000));
      case 4: return &g_stack_int;
      case 5: return (void *)(uintptr_t)0x4e000001ffffffffull; /* (a forged value may name a live handle) */
    }
  }
}
static KVStoreHandle bad_kv_handle(void) {
  for (;;) {
    switch (rn(6)) {
      case 0: return NULL;
      case 1: {
        KVStoreHandle h = g_dead_kv[rn(NDEAD)];
        if (h) return h;
        break;
      }
      case 2:
        for (int i = 0; i < NARR; i++)
          if (g_arr[i].live) return g_arr[i].h;
        break;
      case 3: return (void *)(uintptr_t)(1 + rn(1000));
      case 4: return &g_stack_int;
      case 5: return (void *)(uintptr_t)0x4b000001ffffffffull;
    }
  }
}

/* ------------------------------------------------------ array helpers */

static int free_slot(void) {
  int start = rn(NARR);
  for (int k = 0; k < NARR; k++) {
    int i = (start + k) % NARR;
    if (!g_arr[i].live) return i;
  }
  return -1;
}

/* Reads a live array's contents (its densified contents for sparse). */
static void read_arr(const Arr *a, double *out) {
  size_t n = arr_n(a);
  if (a->stype == 0) {
    unsigned char buf[MAXEL * 8];
    MUST_OK(MXNDArraySyncCopyToCPU(a->h, buf, n));
    for (size_t i = 0; i < n; i++) out[i] = get_elem(a->dtype, buf, i);
    return;
  }
  /* sparse: densify into a dense array of its shape and dtype */
  NDArrayHandle d = NULL;
  MUST_OK(MXNDArrayCreateEx(a->shape, (uint32_t)a->ndim, DEV_CPU, 0, 0, a->dtype, &d));
  MUST_OK(MXNDArraySyncCopyFromNDArray(d, a->h, -1));
  unsigned char buf[MAXEL * 8];
  MUST_OK(MXNDArraySyncCopyToCPU(d, buf, n));
  for (size_t i = 0; i < n; i++) out[i] = get_elem(a->dtype, buf, i);
  MUST_OK(MXNDArrayFree(d));
}

static void check_meta(const Arr *a) {
  int dt = -2, st = -2, devt = -2, devid = -2;
  uint32_t nd = 99;
  const uint32_t *sh = NULL;
  MUST_OK(MXNDArrayGetDType(a->h, &dt));
  MUST_OK(MXNDArrayGetStorageType(a->h, &st));
  MUST_OK(MXNDArrayGetContext(a->h, &devt, &devid));
  MUST_OK(MXNDArrayGetShape(a->h, &nd, &sh));
  if (a->stype == -1) {
    if (dt != -1 || st != -1 || devt != 0 || devid != 0 || nd != 0)
      FAIL("CreateNone array: dtype %d stype %d ctx (%d,%d) ndim %u", dt, st, devt, devid, nd);
    return;
  }
  if (dt != a->dtype) FAIL("GetDType %d, model %d", dt, a->dtype);
  if (st != a->stype) FAIL("GetStorageType %d, model %d", st, a->stype);
  if (devt != a->devt || devid != a->devid)
    FAIL("GetContext (%d,%d), model (%d,%d)", devt, devid, a->devt, a->devid);
  if ((int)nd != a->ndim || (nd > 0 && memcmp(sh, a->shape, nd * sizeof(uint32_t)) != 0))
    FAIL("GetShape ndim %u, model %d", nd, a->ndim);
  int nd2 = -1;
  const int64_t *sh64 = NULL;
  MUST_OK(MXNDArrayGetShapeEx64(a->h, &nd2, &sh64));
  if (nd2 != a->ndim) FAIL("GetShapeEx64 ndim %d, model %d", nd2, a->ndim);
  for (int i = 0; i < nd2; i++)
    if (sh64[i] != (int64_t)a->shape[i]) FAIL("GetShapeEx64 dim %d", i);
  const int *shi = NULL;
  MUST_OK(MXNDArrayGetShapeEx(a->h, &nd2, &shi));
  if (nd2 != a->ndim) FAIL("GetShapeEx ndim %d, model %d", nd2, a->ndim);
  for (int i = 0; i < nd2; i++)
    if (shi[i] != (int)a->shape[i]) FAIL("GetShapeEx dim %d", i);
}

static void check_contents(Arr *a) {
  if (!a->live || a->stype < 0 || a->is_part) return;
  double got[MAXEL];
  read_arr(a, got);
  size_t n = arr_n(a);
  if (!a->known) {
    memcpy(a->v, got, n * sizeof(double));
    a->known = true;
    return;
  }
  g_n_checked += (long)n;
  for (size_t i = 0; i < n; i++)
    if (got[i] != a->v[i])
      FAIL("array slot %ld dtype %d stype %d element %zu: got %g, model %g", (long)(a - g_arr),
           a->dtype, a->stype, i, got[i], a->v[i]);
}

static void rand_shape(int *ndim, uint32_t *shape, int max_dim) {
  /* (ndim 0: one element, a scalar, as MXNet 1.9.1 makes it) */
  *ndim = rn(12) == 0 ? 0 : 1 + rn(3);
  for (int i = 0; i < *ndim; i++) shape[i] = (uint32_t)rn(max_dim + 1);
}

static void rand_ctx(int *devt, int *devid) {
  static const int types[] = {DEV_CPU, DEV_CPU, DEV_CPU, DEV_CPU_PINNED, DEV_CPU_SHARED};
  *devt = types[rn(5)];
  *devid = rn(3);
}

static void fill_values(int dtype, size_t n, double *v) {
  for (size_t i = 0; i < n; i++) v[i] = dtype == DT_BOOL ? rn(2) : rn(4);
}

/* Writes model values into a live dense array through SyncCopyFromCPU. */
static void write_dense(Arr *a, const double *v) {
  size_t n = arr_n(a);
  unsigned char buf[MAXEL * 8];
  for (size_t i = 0; i < n; i++) put_elem(a->dtype, buf, i, v[i]);
  MUST_OK(MXNDArraySyncCopyFromCPU(a->h, buf, n));
  memcpy(a->v, v, n * sizeof(double));
  a->known = true;
}

/* A new dense array in a free slot, with random contents. -1 if no slot. */
static int new_dense(int ndim, const uint32_t *shape, int dtype, int devt, int devid) {
  int s = free_slot();
  if (s < 0 || ndim > 3 || nelem(ndim, shape) > MAXEL) return -1;
  Arr *a = &g_arr[s];
  memset(a, 0, sizeof *a);
  a->parent = -1;
  int which = rn(4);
  if (which == 3) {
    /* storage type 0 through the sparse constructor: a dense array, as in MXNet */
    uint32_t ash[1] = {(uint32_t)rn(3)}, andim[1] = {1};
    int atype[1] = {DT_I64};
    MUST_OK(MXNDArrayCreateSparseEx(0, shape, (uint32_t)ndim, devt, devid, rn(2), dtype, (uint32_t)rn(2), atype,
                                    andim, ash, &a->h));
  } else if (which == 0 || dtype != DT_F32 || ndim > 3) {
    if (which == 2) {
      int64_t sh64[3];
      for (int i = 0; i < ndim; i++) sh64[i] = shape[i];
      MUST_OK(MXNDArrayCreateEx64(sh64, ndim, devt, devid, rn(2), dtype, &a->h));
    } else {
      MUST_OK(MXNDArrayCreateEx(shape, (uint32_t)ndim, devt, devid, rn(2), dtype, &a->h));
    }
  } else {
    MUST_OK(MXNDArrayCreate(shape, (uint32_t)ndim, devt, devid, rn(2), &a->h));
  }
  a->live = true;
  a->stype = 0;
  a->ndim = ndim;
  memcpy(a->shape, shape, sizeof(uint32_t) * (size_t)ndim);
  a->dtype = dtype;
  a->devt = devt;
  a->devid = devid;
  /* zero-filled */
  a->known = true;
  memset(a->v, 0, sizeof a->v);
  if (chance(80)) {
    double v[MAXEL];
    fill_values(dtype, arr_n(a), v);
    write_dense(a, v);
  }
  return s;
}

/* A new row_sparse array of shape (rows, cols) storing the rows idx. */
static int new_rsp(uint32_t rows, uint32_t cols, int dtype, int devt, int devid, const int64_t *idx,
                   uint32_t nidx, const double *rowvals /* nidx * cols */) {
  int s = free_slot();
  if (s < 0 || (size_t)rows * cols > MAXEL || rows > 8) return -1;
  Arr *a = &g_arr[s];
  memset(a, 0, sizeof *a);
  a->parent = -1;
  uint32_t shape[2] = {rows, cols}, aux_shape[1] = {0}, aux_ndims[1] = {1},
           dshape[2] = {nidx, cols};
  int aux_type[1] = {DT_I64};
  if (chance(50)) {
    MUST_OK(MXNDArrayCreateSparseEx(1, shape, 2, devt, devid, 0, dtype, 1, aux_type, aux_ndims,
                                    aux_shape, &a->h));
  } else {
    int64_t sh64[2] = {rows, cols}, ash[1] = {0};
    int andims[1] = {1};
    MUST_OK(MXNDArrayCreateSparseEx64(1, sh64, 2, devt, devid, 0, dtype, 1, aux_type, andims, ash,
                                      &a->h));
  }
  a->live = true;
  a->stype = 1;
  a->ndim = 2;
  a->shape[0] = rows;
  a->shape[1] = cols;
  a->dtype = dtype;
  a->devt = devt;
  a->devid = devid;
  NDArrayHandle d = NULL, i = NULL;
  MUST_OK(MXNDArrayCreateEx(dshape, 2, DEV_CPU, 0, 0, dtype, &d));
  MUST_OK(MXNDArrayCreateEx(&nidx, 1, DEV_CPU, 0, 0, DT_I64, &i));
  unsigned char buf[MAXEL * 8];
  for (size_t k = 0; k < (size_t)nidx * cols; k++) put_elem(dtype, buf, k, rowvals[k]);
  if (nidx > 0 && cols > 0) MUST_OK(MXNDArraySyncCopyFromCPU(d, buf, (size_t)nidx * cols));
  if (nidx > 0) MUST_OK(MXNDArraySyncCopyFromCPU(i, idx, nidx));
  MUST_OK(MXNDArraySyncCopyFromNDArray(a->h, d, -1));
  MUST_OK(MXNDArraySyncCopyFromNDArray(a->h, i, 0));
  MUST_OK(MXNDArrayFree(d));
  MUST_OK(MXNDArrayFree(i));
  memset(a->v, 0, sizeof a->v);
  for (uint32_t r = 0; r < nidx; r++)
    for (uint32_t c = 0; c < cols; c++) a->v[idx[r] * cols + c] = rowvals[r * cols + c];
  a->known = true;
  return s;
}

/* Random sorted unique row ids in [0, rows). */
static uint32_t rand_rows(uint32_t rows, int64_t *idx) {
  uint32_t n = 0;
  for (uint32_t r = 0; r < rows; r++)
    if (chance(50)) idx[n++] = r;
  return n;
}

static int new_rsp_random(uint32_t rows, uint32_t cols, int dtype, int devt, int devid) {
  int64_t idx[8];
  double vals[MAXEL];
  uint32_t n = rand_rows(rows, idx);
  fill_values(dtype, (size_t)n * cols, vals);
  return new_rsp(rows, cols, dtype, devt, devid, idx, n, vals);
}

/* A new csr array of shape (rows, cols) with random entries, built as
   MXNet's csr_matrix builds it: CreateSparseEx, then data, indptr, indices. */
static int new_csr_random(uint32_t rows, uint32_t cols, int dtype, int devt, int devid) {
  int s = free_slot();
  if (s < 0 || (size_t)rows * cols > MAXEL || rows > 8) return -1;
  Arr *a = &g_arr[s];
  memset(a, 0, sizeof *a);
  a->parent = -1;
  int64_t indptr[9], indices[MAXEL];
  double vals[MAXEL];
  uint32_t nnz = 0;
  memset(a->v, 0, sizeof a->v);
  indptr[0] = 0;
  for (uint32_t r = 0; r < rows; r++) {
    for (uint32_t c = 0; c < cols; c++)
      if (chance(40)) {
        indices[nnz] = c;
        vals[nnz] = dtype == DT_BOOL ? rn(2) : rn(4);
        a->v[r * cols + c] = vals[nnz];
        nnz++;
      }
    indptr[r + 1] = nnz;
  }
  uint32_t shape[2] = {rows, cols}, aux_shape[2] = {rows + 1, nnz}, aux_ndims[2] = {1, 1};
  int aux_type[2] = {DT_I64, DT_I64};
  MUST_OK(MXNDArrayCreateSparseEx(2, shape, 2, devt, devid, 0, dtype, 2, aux_type, aux_ndims, aux_shape,
                                  &a->h));
  a->live = true;
  a->stype = 2;
  a->ndim = 2;
  a->shape[0] = rows;
  a->shape[1] = cols;
  a->dtype = dtype;
  a->devt = devt;
  a->devid = devid;
  NDArrayHandle d = NULL, ip = NULL, ix = NULL;
  uint32_t np1 = rows + 1;
  MUST_OK(MXNDArrayCreateEx(&nnz, 1, DEV_CPU, 0, 0, dtype, &d));
  MUST_OK(MXNDArrayCreateEx(&np1, 1, DEV_CPU, 0, 0, DT_I64, &ip));
  MUST_OK(MXNDArrayCreateEx(&nnz, 1, DEV_CPU, 0, 0, DT_I64, &ix));
  unsigned char buf[MAXEL * 8];
  for (uint32_t k = 0; k < nnz; k++) put_elem(dtype, buf, k, vals[k]);
  if (nnz > 0) MUST_OK(MXNDArraySyncCopyFromCPU(d, buf, nnz));
  MUST_OK(MXNDArraySyncCopyFromCPU(ip, indptr, np1));
  if (nnz > 0) MUST_OK(MXNDArraySyncCopyFromCPU(ix, indices, nnz));
  MUST_OK(MXNDArraySyncCopyFromNDArray(a->h, d, -1));
  MUST_OK(MXNDArraySyncCopyFromNDArray(a->h, ip, 0));
  MUST_OK(MXNDArraySyncCopyFromNDArray(a->h, ix, 1));
  MUST_OK(MXNDArrayFree(d));
  MUST_OK(MXNDArrayFree(ip));
  MUST_OK(MXNDArrayFree(ix));
  a->known = true;
  return s;
}

static void free_arr(int s) {
  Arr *a = &g_arr[s];
  MUST_OK(MXNDArrayFree(a->h));
  remember_dead_nd(a->h);
  a->live = false;
}

/* A chaos call wrote into `a`: its contents (and its parent's, for a part)
   are no longer tracked. */
static void touched(Arr *a) {
  a->known = false;
  if (a->stype != 0) a->is_part = true;
  if (a->is_part && a->parent >= 0 && g_arr[a->parent].live) {
    g_arr[a->parent].known = false;
    if (g_arr[a->parent].stype != 0) g_arr[a->parent].is_part = true;
  }
}

static int pick_live_arr(void) {
  int start = rn(NARR);
  for (int k = 0; k < NARR; k++) {
    int i = (start + k) % NARR;
    if (g_arr[i].live) return i;
  }
  return -1;
}

/* Values that may be summed (up to 6 of them) within VMAX. */
static bool small_values(const Arr *a) {
  for (size_t i = 0; i < arr_n(a); i++)
    if (a->v[i] < 0 || a->v[i] > 15 || a->v[i] != (double)(int64_t)a->v[i]) return false;
  return true;
}

/* A live dense array of this shape and dtype (dtype -1: any exact dtype),
   made if none is at hand (with probability), with known contents. */
static int get_dense(int ndim, const uint32_t *shape, int dtype, bool fresh) {
  if (!fresh) {
    int start = rn(NARR);
    for (int k = 0; k < NARR; k++) {
      Arr *a = &g_arr[(start + k) % NARR];
      if (a->live && a->stype == 0 && !a->is_part && a->known &&
          (dtype < 0 || a->dtype == dtype) && same_shape(a->ndim, a->shape, ndim, shape) &&
          small_values(a))
        return (int)(a - g_arr);
    }
  }
  int devt, devid;
  rand_ctx(&devt, &devid);
  return new_dense(ndim, shape, dtype < 0 ? rand_dense_dtype() : dtype, devt, devid);
}

/* ------------------------------------------------------ store helpers */

static Store *pick_store(void) {
  int start = rn(NSTORE);
  for (int k = 0; k < NSTORE; k++) {
    Store *s = &g_st[(start + k) % NSTORE];
    if (s->live) return s;
  }
  return NULL;
}

static const char *key_str(const Store *s, int k) { (void)s; return STR_KEYS[k]; }

static void upd_apply(UpdCtx *c, NDArrayHandle recv, NDArrayHandle local) {
  int mode = c->mode;
  if (mode == 3) return;
  int st_r = -2, st_l = -2;
  if (MXNDArrayGetStorageType(recv, &st_r) != 0 || MXNDArrayGetStorageType(local, &st_l) != 0)
    FAIL("updater: GetStorageType failed: %s", MXGetLastError());
  TRACE("    updater: recv stype %d, local stype %d, mode %d", st_r, st_l, mode);
  if (st_r != 0 || st_l != 0) return; /* sparse: left as it is */
  int dt_r, dt_l;
  uint32_t nd_r, nd_l;
  const uint32_t *sh;
  uint32_t shape_r[8], shape_l[8];
  if (MXNDArrayGetDType(recv, &dt_r) != 0 || MXNDArrayGetDType(local, &dt_l) != 0)
    FAIL("updater: GetDType failed: %s", MXGetLastError());
  if (MXNDArrayGetShape(recv, &nd_r, &sh) != 0) FAIL("updater: GetShape failed");
  memcpy(shape_r, sh, nd_r * sizeof(uint32_t));
  if (MXNDArrayGetShape(local, &nd_l, &sh) != 0) FAIL("updater: GetShape failed");
  memcpy(shape_l, sh, nd_l * sizeof(uint32_t));
  if (!same_shape((int)nd_r, shape_r, (int)nd_l, shape_l)) FAIL("updater: recv and local shapes differ");
  size_t n = nelem((int)nd_l, shape_l);
  if (n > MAXEL) FAIL("updater: %zu elements", n);
  unsigned char br[MAXEL * 8], bl[MAXEL * 8];
  if (MXNDArraySyncCopyToCPU(recv, br, n) != 0 || MXNDArraySyncCopyToCPU(local, bl, n) != 0)
    FAIL("updater: SyncCopyToCPU failed: %s", MXGetLastError());
  for (size_t i = 0; i < n; i++) {
    double r = get_elem(dt_r, br, i), l = get_elem(dt_l, bl, i);
    double x = mode == 2 ? r : mode == 4 ? l + r : (l + r <= VMAX ? l + r : r);
    put_elem(dt_l, bl, i, x);
  }
  if (MXNDArraySyncCopyFromCPU(local, bl, n) != 0) FAIL("updater: SyncCopyFromCPU failed: %s", MXGetLastError());
}

static void upd_nested(UpdCtx *c, NDArrayHandle recv) {
  if (c->free_store) {
    /* the store is freed from inside its own updater: the push in flight
       goes on (it holds the store), every later call sees a stale handle */
    c->free_store = false;
    if (MXKVStoreFree(c->kv) != 0) FAIL("updater: MXKVStoreFree of its own store failed: %s", MXGetLastError());
    c->freed = true;
    const char *t;
    if (MXKVStoreGetType(c->kv, &t) != -1) FAIL("updater: GetType of the freed store did not fail");
  }
  /* calls back into the library: getters, a failing call, the store's type */
  int devt, devid;
  if (MXNDArrayGetContext(recv, &devt, &devid) != 0) FAIL("updater: GetContext failed");
  if (MXNDArrayWaitToRead(recv) != 0) FAIL("updater: WaitToRead failed");
  if (MXNDArrayFree((void *)(uintptr_t)3) != -1) FAIL("updater: Free of a garbage handle did not fail");
  const char *t = NULL;
  if (c->kv != NULL && !c->freed && MXKVStoreGetType(c->kv, &t) != 0)
    FAIL("updater: GetType failed: %s", MXGetLastError());
  NDArrayHandle h = NULL;
  if (MXNDArrayGetDataNDArray(recv, &h) != 0) FAIL("updater: GetDataNDArray failed: %s", MXGetLastError());
  if (MXNDArrayFree(h) != 0) FAIL("updater: Free failed");
  if (c->side != NULL) {
    /* a push of recv and a pull into a new array on another store (0 or -1
       with a text: recv may have another shape than the side keys) */
    int k = (int)(atomic_load(&c->calls) % 4);
    int rc = MXKVStorePush(c->side, 1, &k, &recv, 0);
    if (rc != 0 && (rc != -1 || MXGetLastError()[0] != 'M')) FAIL("updater: side push rc %d", rc);
    uint32_t sh[2] = {2, 2};
    NDArrayHandle o = NULL;
    if (MXNDArrayCreateEx(sh, 2, DEV_CPU, 0, 0, DT_F32, &o) != 0) FAIL("updater: create failed");
    rc = MXKVStorePull(c->side, 1, &k, &o, 0);
    if (rc != 0) FAIL("updater: side pull failed: %s", MXGetLastError());
    if (MXNDArrayFree(o) != 0) FAIL("updater: Free failed");
  }
}

static void fuzz_updater_body(UpdCtx *c, NDArrayHandle recv, NDArrayHandle local);

static void fuzz_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *handle) {
  UpdCtx *c = handle;
  if (c->keys_kind == 1) {
    bool ok = false;
    for (int i = 0; i < NKEYS; i++) ok |= INT_KEYS[i] == key;
    if (!ok) FAIL("int updater called with key %d, not a key of the store", key);
  } else if (c->keys_kind == 2) {
    /* string keys without a string updater: internal ids in registration order */
    if (c->str_cb) FAIL("int updater called on a string-key store with a string updater");
    if (key < 0 || key >= NKEYS) FAIL("int updater called with internal id %d", key);
  }
  fuzz_updater_body(c, recv, local);
}

static void fuzz_updater_body(UpdCtx *c, NDArrayHandle recv, NDArrayHandle local) {
  atomic_fetch_add(&c->calls, 1);
  if (c->nested) upd_nested(c, recv);
  upd_apply(c, recv, local);
  if (MXNDArrayFree(recv) != 0 || MXNDArrayFree(local) != 0) FAIL("updater: Free failed: %s", MXGetLastError());
}
static void fuzz_str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local, void *handle) {
  UpdCtx *c = handle;
  if (key == NULL) FAIL("string updater: NULL key");
  if (c->keys_kind == 1) FAIL("string updater called on an int-key store");
  if (c->keys_kind == 2) {
    bool ok = false;
    for (int i = 0; i < NKEYS; i++) ok |= strcmp(STR_KEYS[i], key) == 0;
    if (!ok) FAIL("string updater called with key \"%s\", not a key of the store", key);
  }
  fuzz_updater_body(c, recv, local);
}

/* the model's result of an update: stored `l`, merged `r` */
static double upd_model(int mode, double l, double r) {
  switch (mode) {
    case 0: return r;
    case 1: return l + r <= VMAX ? l + r : r;
    case 2: return r;
    default: return l;
  }
}

/* Store types: created as local stores (any name that is not dist/nccl). */
static const char *LOCAL_TYPES[] = {"local", "device", "local_update_cpu", "local_allreduce_cpu",
                                    "local_allreduce_device", "LOCAL", "Device", "no-such-type",
                                    "", "\xff\xfe-device"};

static void lower(char *d, const char *s, size_t cap) {
  size_t i = 0;
  for (; s[i] && i + 1 < cap; i++) d[i] = (s[i] >= 'A' && s[i] <= 'Z') ? (char)(s[i] + 32) : s[i];
  d[i] = 0;
}

/* keys for a call: int or string, from slots */
typedef struct {
  int n;
  int slot[16]; /* key slot, or -1 absent */
  int ik[16];
  const char *sk[16];
} Keys;

static void keys_set(const Store *s, Keys *k, int i, int slot) {
  k->slot[i] = slot;
  k->ik[i] = slot < 0 ? ABSENT_INT : INT_KEYS[slot];
  k->sk[i] = slot < 0 ? ABSENT_STR : key_str(s, slot);
}

/* ------------------------------------------------------------ operations */

static void op_new_array(void) {
  g_what = "new array";
  int ndim, devt, devid;
  uint32_t shape[3];
  rand_shape(&ndim, shape, 4);
  rand_ctx(&devt, &devid);
  int r = rn(10);
  if (r < 6) {
    int s = new_dense(ndim, shape, chance(5) ? DT_BOOL : rand_value_dtype(), devt, devid);
    if (s >= 0) TRACE("new dense slot %d dtype %d", s, g_arr[s].dtype);
  } else if (r < 8) {
    uint32_t rows = (uint32_t)rn(5), cols = (uint32_t)rn(4);
    int s = chance(60) ? new_rsp_random(rows, cols, rand_value_dtype(), devt, devid)
                       : new_csr_random(rows, cols, rand_value_dtype(), devt, devid);
    if (s >= 0) TRACE("new sparse slot %d stype %d (%u,%u)", s, g_arr[s].stype, rows, cols);
  } else if (r < 9) {
    int s = free_slot();
    if (s < 0) return;
    Arr *a = &g_arr[s];
    memset(a, 0, sizeof *a);
    a->parent = -1;
    MUST_OK(MXNDArrayCreateNone(&a->h));
    a->live = true;
    a->stype = -1;
    a->ndim = 0;
    a->dtype = -1;
    TRACE("new none slot %d", s);
  } else {
    /* a defect: gpu, bad dtype, NULL shape, NULL out, bad stype, bad aux */
    NDArrayHandle h = (void *)(uintptr_t)1;
    switch (rn(8)) {
      case 0: MUST_FAIL(MXNDArrayCreateEx(shape, (uint32_t)ndim, DEV_GPU, rn(2), 0, DT_F32, &h)); break;
      case 1: MUST_FAIL(MXNDArrayCreate(shape, (uint32_t)ndim, DEV_GPU, 0, 0, &h)); break;
      case 2: {
        static const int bad[] = {13, 14, -1, -2, 99, INT_MAX, INT_MIN};
        MUST_FAIL(MXNDArrayCreateEx(shape, (uint32_t)ndim, devt, devid, 0, bad[rn(7)], &h));
        break;
      }
      case 3: MUST_FAIL(MXNDArrayCreateEx(NULL, 1 + (uint32_t)rn(3), devt, devid, 0, DT_F32, &h)); break;
      case 4: MUST_FAIL(MXNDArrayCreateEx(shape, (uint32_t)ndim, devt, devid, 0, DT_F32, NULL)); break;
      case 5: {
        uint32_t sh2[2] = {3, 2}, ash[1] = {0}, andim[1] = {1};
        int atype[1] = {DT_I64};
        static const int bad_st[] = {3, -1, 7, -2};
        MUST_FAIL(MXNDArrayCreateSparseEx(bad_st[rn(4)], sh2, 2, DEV_CPU, 0, 0, DT_F32, 1, atype, andim, ash, &h));
        break;
      }
      case 6: {
        uint32_t sh2[2] = {3, 2}, ash[1] = {0}, andim[1] = {1};
        int atype[1] = {DT_I64};
        MUST_FAIL(MXNDArrayCreateSparseEx(1, sh2, 2, DEV_GPU, 0, 0, DT_F32, 1, atype, andim, ash, &h));
        break;
      }
      case 7: {
        int64_t sh64[2] = {-3, 2};
        MUST_FAIL(MXNDArrayCreateEx64(sh64, 2, DEV_CPU, 0, 0, DT_F32, &h));
        break;
      }
    }
    if (h != (void *)(uintptr_t)1) FAIL("a failed create wrote its output");
  }
}

static void op_new_array_chaos(void) {
  g_what = "new array (chaos)";
  /* ndim 0, big dims, odd contexts, negative device ids: 0 or -1 */
  NDArrayHandle h = NULL;
  int rc;
  switch (rn(5)) {
    case 0: {
      uint32_t sh[1] = {0};
      rc = ANY(MXNDArrayCreateEx(sh, 0, DEV_CPU, 0, 0, DT_F32, &h));
      break;
    }
    case 1: {
      int64_t sh64[2] = {(int64_t)1 << 40, rn(2)};
      rc = ANY(MXNDArrayCreateEx64(sh64, 2, DEV_CPU, 0, 0, rand_value_dtype(), &h));
      break;
    }
    case 2: {
      uint32_t sh[2] = {2, 2};
      static const int dts[] = {0, 4, 6, -1, 7};
      rc = ANY(MXNDArrayCreateEx(sh, 2, dts[rn(5)], rn(5) - 2, 0, DT_F32, &h));
      break;
    }
    case 3: {
      uint32_t sh[9] = {1, 1, 1, 1, 1, 1, 1, 2, 1};
      rc = ANY(MXNDArrayCreateEx(sh, 9, DEV_CPU, 0, 0, DT_F32, &h));
      break;
    }
    default: {
      uint32_t sh[2] = {3, 2}, ash[2] = {(uint32_t)rn(4), (uint32_t)rn(4)}, andim[2] = {1, 1};
      int atype[2] = {rn(2) ? DT_I64 : DT_I32, DT_I64};
      rc = ANY(MXNDArrayCreateSparseEx(1 + rn(2), sh, 2, DEV_CPU, 0, 0, rand_value_dtype(),
                                       (uint32_t)rn(3), atype, andim, ash, &h));
      break;
    }
  }
  if (rc == 0) {
    int st = -9, dt = -9;
    MUST_OK(MXNDArrayGetStorageType(h, &st));
    MUST_OK(MXNDArrayGetDType(h, &dt));
    MUST_OK(MXNDArrayFree(h));
    remember_dead_nd(h);
  }
}

static void op_free_array(void) {
  g_what = "free array";
  int r = rn(10);
  if (r < 6) {
    int s = pick_live_arr();
    if (s < 0) return;
    TRACE("free slot %d", s);
    free_arr(s);
  } else if (r < 7) {
    MUST_OK(MXNDArrayFree(NULL));
  } else {
    NDArrayHandle h = bad_nd_handle(false);
    TRACE("free bad handle %p", h);
    MUST_FAIL(MXNDArrayFree(h));
  }
}

static void op_copy_from_cpu(void) {
  g_what = "SyncCopyFromCPU";
  int s = pick_live_arr();
  if (s < 0) return;
  Arr *a = &g_arr[s];
  size_t n = arr_n(a);
  unsigned char buf[(MAXEL + 8) * 8];
  memset(buf, 0, sizeof buf);
  if (a->stype == 0 && !a->is_part && chance(70)) {
    double v[MAXEL];
    fill_values(a->dtype, n, v);
    TRACE("copy from cpu slot %d (%zu)", s, n);
    write_dense(a, v);
    return;
  }
  if (a->stype == 0 && chance(60)) {
    /* wrong sizes */
    size_t bad = n + 1 + (size_t)rn(3);
    if (n > 0 && chance(50)) bad = n - 1;
    TRACE("copy from cpu slot %d wrong size %zu (n %zu)", s, bad, n);
    MUST_FAIL(MXNDArraySyncCopyFromCPU(a->h, buf, bad));
    return;
  }
  if (chance(30)) {
    MUST_FAIL(MXNDArraySyncCopyFromCPU(bad_nd_handle(true), buf, 1));
    return;
  }
  if (a->stype == 0 && n > 0) {
    MUST_FAIL(MXNDArraySyncCopyFromCPU(a->h, NULL, n));
    return;
  }
  /* sparse or none: whatever it does */
  TRACE("copy from cpu (chaos) slot %d", s);
  int rc = ANY(MXNDArraySyncCopyFromCPU(a->h, buf, n));
  if (rc == 0) touched(a);
}

static void op_copy_to_cpu(void) {
  g_what = "SyncCopyToCPU";
  int s = pick_live_arr();
  if (s < 0) return;
  Arr *a = &g_arr[s];
  size_t n = arr_n(a);
  unsigned char buf[(MAXEL + 8) * 8];
  if (a->stype == 0 && chance(70)) {
    TRACE("check slot %d", s);
    check_meta(a);
    check_contents(a);
    return;
  }
  if (a->stype == 0 && chance(70)) {
    size_t bad = n + 1 + (size_t)rn(3);
    if (n > 0 && chance(50)) bad = n - 1;
    MUST_FAIL(MXNDArraySyncCopyToCPU(a->h, buf, bad));
    return;
  }
  if (chance(30)) {
    MUST_FAIL(MXNDArraySyncCopyToCPU(bad_nd_handle(true), buf, 1));
    return;
  }
  if (a->stype == 0 && n > 0) {
    MUST_FAIL(MXNDArraySyncCopyToCPU(a->h, NULL, n));
    return;
  }
  if (a->stype >= 0) check_meta(a);
  if (a->stype == 1 && !a->is_part) check_contents(a);
  (void)ANY(MXNDArraySyncCopyToCPU(a->h, buf, n > MAXEL ? MAXEL : n));
}

static void op_getters(void) {
  g_what = "getters";
  int dt, st, devt, devid, nd;
  uint32_t und;
  const uint32_t *sh;
  const int *shi;
  const int64_t *sh64;
  void *data;
  if (chance(60)) {
    int s = pick_live_arr();
    if (s < 0) return;
    Arr *a = &g_arr[s];
    TRACE("getters slot %d (stype %d)", s, a->stype);
    check_meta(a);
    MUST_OK(MXNDArrayWaitToRead(a->h));
    MUST_OK(MXNDArrayWaitToWrite(a->h));
    if (a->stype == 0) {
      MUST_OK(MXNDArrayGetData(a->h, &data));
      if ((arr_n(a) == 0) != (data == NULL)) FAIL("GetData of %zu elements gave %p", arr_n(a), data);
      if (data != NULL && a->known) {
        for (size_t i = 0; i < arr_n(a); i++)
          if (get_elem(a->dtype, data, i) != a->v[i]) FAIL("GetData element %zu differs", i);
      }
    } else {
      (void)ANY(MXNDArrayGetData(a->h, &data));
    }
    if (a->stype == 1) {
      int at = -1;
      MUST_OK(MXNDArrayGetAuxType(a->h, 0, &at));
      if (at != DT_I64) FAIL("aux type %d", at);
      MUST_OK(MXNDArrayGetAuxType64(a->h, 0, &at));
      MUST_FAIL(MXNDArrayGetAuxType(a->h, 1 + (uint32_t)rn(5), &at));
      /* (parts replaced by a chaos copy may disagree until the next copy) */
      if (a->is_part)
        (void)ANY(MXNDArraySyncCheckFormat(a->h, rn(2)));
      else
        MUST_OK(MXNDArraySyncCheckFormat(a->h, rn(2)));
    } else if (a->stype == 0) {
      int at;
      (void)ANY(MXNDArrayGetAuxType(a->h, (uint32_t)rn(2), &at));
      (void)ANY(MXNDArraySyncCheckFormat(a->h, rn(2)));
    }
    /* the live count with NULL pointers */
    MUST_OK(mxkv_live_handles(NULL, NULL));
    return;
  }
  NDArrayHandle h = bad_nd_handle(true);
  switch (rn(12)) {
    case 0: MUST_FAIL(MXNDArrayGetDType(h, &dt)); break;
    case 1: MUST_FAIL(MXNDArrayGetStorageType(h, &st)); break;
    case 2: MUST_FAIL(MXNDArrayGetContext(h, &devt, &devid)); break;
    case 3: MUST_FAIL(MXNDArrayGetShape(h, &und, &sh)); break;
    case 4: MUST_FAIL(MXNDArrayGetShapeEx(h, &nd, &shi)); break;
    case 5: MUST_FAIL(MXNDArrayGetShapeEx64(h, &nd, &sh64)); break;
    case 6: MUST_FAIL(MXNDArrayGetData(h, &data)); break;
    case 7: MUST_FAIL(MXNDArrayWaitToRead(h)); break;
    case 8: MUST_FAIL(MXNDArrayWaitToWrite(h)); break;
    case 9: MUST_FAIL(MXNDArraySyncCheckFormat(h, true)); break;
    case 10: {
      int s = pick_live_arr();
      if (s < 0) return;
      switch (rn(4)) {
        case 0: MUST_FAIL(MXNDArrayGetDType(g_arr[s].h, NULL)); break;
        case 1: MUST_FAIL(MXNDArrayGetShape(g_arr[s].h, NULL, &sh)); break;
        case 2: MUST_FAIL(MXNDArrayGetContext(g_arr[s].h, &devt, NULL)); break;
        default: MUST_FAIL(MXNDArrayGetStorageType(g_arr[s].h, NULL)); break;
      }
      break;
    }
    default: {
      NDArrayHandle o = NULL;
      MUST_FAIL(MXNDArrayGetDataNDArray(h, &o));
      MUST_FAIL(MXNDArrayGetAuxNDArray(h, 0, &o));
      int at;
      MUST_FAIL(MXNDArrayGetAuxType(h, 0, &at));
      break;
    }
  }
}

/* handles on parts: GetDataNDArray / GetAuxNDArray */
static void op_parts(void) {
  g_what = "parts";
  int s = pick_live_arr();
  if (s < 0) return;
  Arr *a = &g_arr[s];
  int t = free_slot();
  if (t < 0) return;
  Arr *b = &g_arr[t];
  memset(b, 0, sizeof *b);
  b->parent = -1;
  NDArrayHandle h = NULL;
  int rc;
  bool aux = chance(50);
  if (aux) {
    if (chance(50))
      rc = ANY(MXNDArrayGetAuxNDArray(a->h, (uint32_t)rn(3), &h));
    else
      rc = ANY(MXNDArrayGetAuxNDArray64(a->h, rn(3) - 1, &h));
    if (a->stype == 0 && rc == 0) FAIL("GetAuxNDArray of a dense array returned 0");
  } else {
    rc = ANY(MXNDArrayGetDataNDArray(a->h, &h));
    if (a->stype >= 0 && rc != 0) FAIL("GetDataNDArray of a live array failed: %s", MXGetLastError());
  }
  if (rc != 0) return;
  b->h = h;
  b->live = true;
  b->is_part = true;
  int nd;
  const int64_t *sh64;
  MUST_OK(MXNDArrayGetDType(h, &b->dtype));
  MUST_OK(MXNDArrayGetStorageType(h, &b->stype));
  MUST_OK(MXNDArrayGetContext(h, &b->devt, &b->devid));
  MUST_OK(MXNDArrayGetShapeEx64(h, &nd, &sh64));
  if (nd > 3) FAIL("part ndim %d", nd);
  b->ndim = nd;
  for (int i = 0; i < nd; i++) b->shape[i] = (uint32_t)sh64[i];
  if (arr_n(b) > MAXEL) FAIL("part of %zu elements", arr_n(b));
  if (b->stype != 0 && b->stype != -1) FAIL("part of storage type %d", b->stype);
  if (b->stype == -1) b->stype = -1;
  /* (a part of a part shares its root's data) */
  b->parent = a->is_part && a->parent >= 0 ? a->parent : s;
  TRACE("part slot %d of slot %d (aux %d, stype %d)", t, s, aux, a->stype);
}

static void op_copy_nd(void) {
  g_what = "SyncCopyFromNDArray";
  int s = pick_live_arr(), t = pick_live_arr();
  if (s < 0 || t < 0) return;
  Arr *d = &g_arr[s], *src = &g_arr[t];
  if (d->stype == 0 && src->stype == 0 && !d->is_part && src->known &&
      cast_exact(d->dtype, src->v, arr_n(src)) &&
      same_shape(d->ndim, d->shape, src->ndim, src->shape) && chance(80)) {
    TRACE("copy nd slot %d <- %d", s, t);
    MUST_OK(MXNDArraySyncCopyFromNDArray(d->h, src->h, -1));
    for (size_t e = 0; e < arr_n(src); e++) d->v[e] = cast_to(d->dtype, src->v[e]);
    d->known = true;
    return;
  }
  if (chance(30)) {
    if (chance(50))
      MUST_FAIL(MXNDArraySyncCopyFromNDArray(bad_nd_handle(true), src->h, -1));
    else
      MUST_FAIL(MXNDArraySyncCopyFromNDArray(d->h, bad_nd_handle(true), -1));
    return;
  }
  if (d->stype == 0 && src->stype == 0 && !same_shape(d->ndim, d->shape, src->ndim, src->shape) &&
      arr_n(d) != arr_n(src)) {
    MUST_FAIL(MXNDArraySyncCopyFromNDArray(d->h, src->h, -1));
    return;
  }
  TRACE("copy nd (chaos) slot %d <- %d", s, t);
  int rc = ANY(MXNDArraySyncCopyFromNDArray(d->h, src->h, rn(4) - 1));
  if (rc == 0) touched(d);
}

/* ------------------------------------------------------ store operations */

static void op_new_store(void) {
  g_what = "new store";
  int si = -1;
  for (int i = 0; i < NSTORE; i++)
    if (!g_st[i].live) si = i;
  if (si < 0 || chance(15)) {
    /* a defect */
    KVStoreHandle h = (void *)(uintptr_t)1;
    static const char *bad[] = {"nccl", "dist_sync", "dist_async", "dist_device_sync", "my-dist", "NCCL"};
    switch (rn(3)) {
      case 0: MUST_FAIL(MXKVStoreCreate(bad[rn(6)], &h)); break;
      case 1: MUST_FAIL(MXKVStoreCreate(NULL, &h)); break;
      default: MUST_FAIL(MXKVStoreCreate("local", NULL)); break;
    }
    if (h != (void *)(uintptr_t)1) FAIL("a failed create wrote its output");
    return;
  }
  Store *s = &g_st[si];
  memset(s, 0, sizeof *s);
  const char *type = LOCAL_TYPES[rn((int)(sizeof LOCAL_TYPES / sizeof LOCAL_TYPES[0]))];
  MUST_OK(MXKVStoreCreate(type, &s->h));
  s->live = true;
  s->str = chance(50);
  lower(s->type, type, sizeof s->type);
  s->device = strstr(s->type, "device") != NULL;
  s->upd = &g_upd[si];
  s->upd->mode = 0;
  s->upd->keys_kind = 0;
  s->upd->kv = s->h;
  const char *t = NULL;
  MUST_OK(MXKVStoreGetType(s->h, &t));
  if (t == NULL || strcmp(t, s->type) != 0) FAIL("GetType \"%s\", created as \"%s\"", t ? t : "(NULL)", type);
  int r = -1;
  MUST_OK(MXKVStoreGetRank(s->h, &r));
  if (r != 0) FAIL("rank %d", r);
  MUST_OK(MXKVStoreGetGroupSize(s->h, &r));
  if (r != 1) FAIL("group size %d", r);
  /* fix the key type with an init of a first key */
  Key *k = &s->keys[0];
  int ndim;
  uint32_t shape[3];
  rand_shape(&ndim, shape, 4);
  int a = get_dense(ndim, shape, -1, false);
  if (a < 0) {
    /* no room: an empty init does not fix the key type; free the store */
    MUST_OK(MXKVStoreFree(s->h));
    s->live = false;
    return;
  }
  if (s->str) {
    const char *kk[1] = {STR_KEYS[0]};
    MUST_OK(MXKVStoreInitEx(s->h, 1, kk, &g_arr[a].h));
  } else {
    MUST_OK(MXKVStoreInit(s->h, 1, &INT_KEYS[0], &g_arr[a].h));
  }
  k->inited = true;
  k->stype = 0;
  k->ndim = ndim;
  memcpy(k->shape, shape, sizeof shape);
  k->dtype = g_arr[a].dtype;
  k->known = true;
  memcpy(k->v, g_arr[a].v, sizeof k->v);
  TRACE("new store %d \"%s\" (%s keys)", si, type, s->str ? "str" : "int");
}

static void op_free_store(void) {
  g_what = "free store";
  if (chance(30)) {
    if (chance(30)) {
      MUST_OK(MXKVStoreFree(NULL));
    } else {
      KVStoreHandle h = bad_kv_handle();
      if (h == NULL) return;
      MUST_FAIL(MXKVStoreFree(h));
    }
    return;
  }
  Store *s = pick_store();
  if (s == NULL) return;
  TRACE("free store %ld", (long)(s - g_st));
  MUST_OK(MXKVStoreFree(s->h));
  remember_dead_kv(s->h);
  s->live = false;
}

/* The key slots of a store that are (not) inited. */
static int pick_key(const Store *s, bool inited, int stype) {
  int start = rn(NKEYS);
  for (int i = 0; i < NKEYS; i++) {
    int k = (start + i) % NKEYS;
    if (s->keys[k].inited == inited && !s->keys[k].wild &&
        (!inited || stype < 0 || s->keys[k].stype == stype))
      return k;
  }
  return -2;
}

static int call_init(Store *s, KVStoreHandle h, Keys *k, NDArrayHandle *vals, uint32_t num, bool str) {
  if (str)
    return MXKVStoreInitEx(h, num, k ? k->sk : NULL, vals);
  return MXKVStoreInit(h, num, k ? k->ik : NULL, vals);
  (void)s;
}

/* a defect applied to a keyed call: returns a description, modifies args */
enum { D_NONE, D_KV, D_KEYS_NULL, D_VALS_NULL, D_VAL_BAD, D_KIND, D_NULL_STR };

static void op_init(void) {
  g_what = "init";
  Store *s = pick_store();
  if (s == NULL) return;
  Keys k;
  NDArrayHandle vals[16];
  int n = rn(4);
  bool rsp = chance(40), csr = !s->device && chance(30);
  /* choose distinct uninited keys */
  int used[NKEYS] = {0};
  k.n = 0;
  for (int i = 0; i < n; i++) {
    int slot = pick_key(s, false, -1);
    if (slot < 0 || used[slot]) break;
    used[slot] = 1;
    keys_set(s, &k, k.n++, slot);
  }
  n = k.n;
  /* values */
  int ndim[16];
  uint32_t shape[16][3];
  int srcs[16];
  for (int i = 0; i < n; i++) {
    int a;
    if (rsp) {
      uint32_t rows = 1 + (uint32_t)rn(4), cols = 1 + (uint32_t)rn(3);
      int devt, devid;
      rand_ctx(&devt, &devid);
      /* csr values: float32 on local comms (MXNet 1.9.1 casts a csr value
         through a float32 temporary, and a device comm's merge buffers are
         dense or row_sparse only: README deviation 25) */
      a = csr ? new_csr_random(rows, cols, DT_F32, devt, devid)
              : new_rsp_random(rows, cols, rand_value_dtype(), devt, devid);
    } else {
      int nd;
      uint32_t sh[3];
      rand_shape(&nd, sh, 4);
      a = get_dense(nd, sh, -1, false);
    }
    if (a < 0) return;
    srcs[i] = a;
    vals[i] = g_arr[a].h;
    ndim[i] = g_arr[a].ndim;
    memcpy(shape[i], g_arr[a].shape, sizeof shape[i]);
  }
  int defect = chance(35) ? 1 + rn(7) : 0;
  if (defect == 0) {
    TRACE("init %d keys (rsp %d) on store %ld", n, rsp, (long)(s - g_st));
    for (int i = 0; i < n; i++)
      TRACE("  key slot %d <- array slot %d (stype %d dtype %d known %d, %zu elements: %g %g %g %g)", k.slot[i],
            srcs[i], g_arr[srcs[i]].stype, g_arr[srcs[i]].dtype, g_arr[srcs[i]].known, arr_n(&g_arr[srcs[i]]),
            g_arr[srcs[i]].v[0], g_arr[srcs[i]].v[1], g_arr[srcs[i]].v[2], g_arr[srcs[i]].v[3]);
    MUST_OK(call_init(s, s->h, &k, vals, (uint32_t)n, s->str));
    for (int i = 0; i < n; i++) {
      Key *key = &s->keys[k.slot[i]];
      Arr *a = &g_arr[srcs[i]];
      key->inited = true;
      key->stype = a->stype;
      key->ndim = ndim[i];
      memcpy(key->shape, shape[i], sizeof key->shape);
      key->dtype = a->dtype;
      key->known = a->known;
      memcpy(key->v, a->v, sizeof key->v);
    }
    return;
  }
  /* defects: the call fails and changes nothing */
  TRACE("init defect %d (%d keys)", defect, n);
  switch (defect) {
    case 1: MUST_FAIL(call_init(s, bad_kv_handle(), &k, vals, (uint32_t)n, s->str)); break;
    case 2:
      if (n == 0) return;
      MUST_FAIL(call_init(s, s->h, NULL, vals, (uint32_t)n, s->str));
      break;
    case 3:
      if (n == 0) return;
      MUST_FAIL(call_init(s, s->h, &k, NULL, (uint32_t)n, s->str));
      break;
    case 4:
      if (n == 0) return;
      vals[rn(n)] = bad_nd_handle(false);
      MUST_FAIL(call_init(s, s->h, &k, vals, (uint32_t)n, s->str));
      break;
    case 5: {
      /* an inited key among new ones (all or nothing) */
      int slot = pick_key(s, true, -1);
      if (slot < 0) return;
      int a = srcs[0];
      if (n == 0) {
        a = get_dense(1, (uint32_t[]){2}, -1, false);
        if (a < 0) return;
        vals[0] = g_arr[a].h;
        n = 1;
      }
      int pos = rn(n);
      keys_set(s, &k, pos, slot);
      MUST_FAIL(call_init(s, s->h, &k, vals, (uint32_t)n, s->str));
      break;
    }
    case 6:
      /* keys of the other kind */
      if (n == 0) return;
      MUST_FAIL(call_init(s, s->h, &k, vals, (uint32_t)n, !s->str));
      break;
    case 7:
      if (!s->str || n == 0) return;
      k.sk[rn(n)] = NULL;
      MUST_FAIL(call_init(s, s->h, &k, vals, (uint32_t)n, true));
      break;
  }
}

static int call_push(KVStoreHandle h, Keys *k, NDArrayHandle *vals, uint32_t num, bool str) {
  int prio = rn(5) - 2;
  if (str) return MXKVStorePushEx(h, num, k ? k->sk : NULL, vals, prio);
  return MXKVStorePush(h, num, k ? k->ik : NULL, vals, prio);
}

/* Picks a push's keys and values; fills `sum` (per key slot) and `have`. */
typedef struct {
  Keys k;
  NDArrayHandle vals[16];
  int src[16];
  int n;
  double sum[NKEYS][MAXEL];
  int cnt[NKEYS];
  bool known[NKEYS];
} PushArgs;

static bool make_push(Store *s, PushArgs *p, int max) {
  memset(p, 0, sizeof *p);
  int n = rn(max + 1);
  for (int i = 0; i < n; i++) {
    int r = rn(100);
    int slot = pick_key(s, true, r < 70 ? 0 : r < 85 ? 1 : 2);
    if (slot < 0) return false;
    Key *key = &s->keys[slot];
    int a;
    if (key->stype == 1) {
      int devt, devid;
      rand_ctx(&devt, &devid);
      a = new_rsp_random(key->shape[0], key->shape[1], key->dtype, devt, devid);
    } else {
      /* the first value of a key must have its dtype; later ones any */
      a = get_dense(key->ndim, key->shape, p->cnt[slot] == 0 || chance(50) ? key->dtype : -1, false);
    }
    if (a < 0) return false;
    keys_set(s, &p->k, i, slot);
    p->vals[i] = g_arr[a].h;
    p->src[i] = a;
    if (p->cnt[slot] == 0) p->known[slot] = true;
    p->known[slot] = p->known[slot] && g_arr[a].known;
    for (size_t e = 0; e < nelem(key->ndim, key->shape); e++) p->sum[slot][e] += g_arr[a].v[e];
    p->cnt[slot]++;
  }
  p->n = n;
  p->k.n = n;
  return true;
}

/* Whether a push sums several values of a bool key. */
static bool bool_sum(const Store *s, const PushArgs *p) {
  for (int slot = 0; slot < NKEYS; slot++)
    if (p->cnt[slot] > 1 && s->keys[slot].dtype == DT_BOOL) return true;
  return false;
}

/* The model after a successful push. */
static void apply_push(Store *s, const PushArgs *p) {
  for (int slot = 0; slot < NKEYS; slot++) {
    if (p->cnt[slot] == 0) continue;
    Key *key = &s->keys[slot];
    size_t ne = nelem(key->ndim, key->shape);
    int mode = s->upd->mode;
    if (key->stype != 0 && mode != 0) mode = 3; /* the test's updater leaves sparse values */
    /* a dense push without an updater makes a csr key dense */
    if (key->stype == 2 && mode == 0) key->stype = 0;
    bool compressed = s->compress && s->device;
    if (!p->known[slot] || compressed || (mode != 0 && mode != 2 && !key->known)) {
      key->known = false;
      continue;
    }
    for (size_t e = 0; e < ne; e++) key->v[e] = cast_to(key->dtype, upd_model(mode, key->v[e], p->sum[slot][e]));
    key->known = true;
  }
}

static void forget_keys(Store *s, const Keys *k) {
  for (int i = 0; i < k->n; i++)
    if (k->slot[i] >= 0) {
      s->keys[k->slot[i]].known = false;
      /* a push may make a csr key dense */
      if (s->keys[k->slot[i]].stype == 2) s->keys[k->slot[i]].wild = true;
    }
}

static void op_push(void) {
  g_what = "push";
  Store *s = pick_store();
  if (s == NULL) return;
  PushArgs p;
  if (!make_push(s, &p, 6)) return;
  if (s->compress && s->device) {
    /* non-float32 or row_sparse values are refused with compression on */
    TRACE("push %d values on compressed store %ld (chaos)", p.n, (long)(s - g_st));
    for (int i = 0; i < p.n; i++) TRACE("  key slot %d", p.k.slot[i]);
    (void)ANY(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, s->str));
    forget_keys(s, &p.k);
    return;
  }
  if (bool_sum(s, &p)) {
    /* summing bool values is refused at the call (README deviation 3) */
    TRACE("push summing bool values");
    MUST_FAIL(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, s->str));
    forget_keys(s, &p.k);
    return;
  }
  int defect = chance(30) ? 1 + rn(7) : 0;
  if (defect == 0) {
    bool free_inside = s->upd->mode != 0 && s->upd->nested && p.n > 0 && chance(5);
    s->upd->free_store = free_inside;
    s->upd->freed = false;
    TRACE("push %d values on store %ld (updater mode %d, frees the store %d)", p.n, (long)(s - g_st),
          s->upd->mode, free_inside);
    for (int i = 0; i < p.n; i++)
      TRACE("  key slot %d (stype %d dtype %d) <- array slot %d (stype %d dtype %d: %g %g %g)", p.k.slot[i],
            s->keys[p.k.slot[i]].stype, s->keys[p.k.slot[i]].dtype, p.src[i], g_arr[p.src[i]].stype,
            g_arr[p.src[i]].dtype, g_arr[p.src[i]].v[0], g_arr[p.src[i]].v[1], g_arr[p.src[i]].v[2]);
    MUST_OK(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, s->str));
    s->upd->free_store = false;
    if (s->upd->freed) {
      s->upd->freed = false;
      const char *t;
      MUST_FAIL(MXKVStoreGetType(s->h, &t));
      remember_dead_kv(s->h);
      s->live = false;
      return;
    }
    apply_push(s, &p);
    return;
  }
  TRACE("push defect %d (%d values)", defect, p.n);
  switch (defect) {
    case 1: MUST_FAIL(call_push(bad_kv_handle(), &p.k, p.vals, (uint32_t)p.n, s->str)); return;
    case 2:
      if (p.n == 0) return;
      MUST_FAIL(call_push(s->h, NULL, p.vals, (uint32_t)p.n, s->str));
      return;
    case 3:
      if (p.n == 0) return;
      MUST_FAIL(call_push(s->h, &p.k, NULL, (uint32_t)p.n, s->str));
      return;
    case 4:
      if (p.n == 0) return;
      p.vals[rn(p.n)] = bad_nd_handle(false);
      MUST_FAIL(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, s->str));
      return;
    case 5: {
      /* an uninitialised key */
      int slot = pick_key(s, false, -1);
      int a = get_dense(1, (uint32_t[]){2}, -1, false);
      if (a < 0) return;
      keys_set(s, &p.k, p.n, slot < 0 ? -1 : slot);
      p.vals[p.n] = g_arr[a].h;
      p.k.n = ++p.n;
      MUST_FAIL(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, s->str));
      break;
    }
    case 6: {
      /* a value of another shape for a dense key */
      int slot = pick_key(s, true, 0);
      if (slot < 0) return;
      Key *key = &s->keys[slot];
      int nd = key->ndim;
      uint32_t sh[3];
      memcpy(sh, key->shape, sizeof sh);
      if (nd == 0) return;
      sh[rn(nd)] += 1 + (uint32_t)rn(2);
      int a = get_dense(nd, sh, key->dtype, false);
      if (a < 0) return;
      keys_set(s, &p.k, p.n, slot);
      p.vals[p.n] = g_arr[a].h;
      p.k.n = ++p.n;
      MUST_FAIL(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, s->str));
      break;
    }
    case 7:
      if (p.n == 0) return;
      MUST_FAIL(call_push(s->h, &p.k, p.vals, (uint32_t)p.n, !s->str));
      return;
  }
  /* a push is not all-or-nothing: its keys' values are unknown now */
  forget_keys(s, &p.k);
}

static int call_pull(KVStoreHandle h, Keys *k, NDArrayHandle *outs, uint32_t num, bool str, int how) {
  int prio = rn(3);
  switch (how) {
    case 0: return str ? MXKVStorePullEx(h, num, k ? k->sk : NULL, outs, prio)
                       : MXKVStorePull(h, num, k ? k->ik : NULL, outs, prio);
    case 1: return str ? MXKVStorePullWithSparseEx(h, num, k ? k->sk : NULL, outs, prio, true)
                       : MXKVStorePullWithSparse(h, num, k ? k->ik : NULL, outs, prio, true);
    default: return str ? MXKVStorePullWithSparseEx(h, num, k ? k->sk : NULL, outs, prio, false)
                        : MXKVStorePullWithSparse(h, num, k ? k->ik : NULL, outs, prio, false);
  }
}

typedef struct {
  Keys k;
  NDArrayHandle outs[16];
  int dst[16];
  int n;
} PullArgs;

/* Picks dense keys and distinct dense outputs of their shapes. */
static bool make_pull(Store *s, PullArgs *p, int max, bool fresh_outs) {
  memset(p, 0, sizeof *p);
  int n = rn(max + 1);
  for (int i = 0; i < n; i++) {
    int slot = pick_key(s, true, chance(80) ? 0 : 2);
    if (slot < 0) return false;
    Key *key = &s->keys[slot];
    int a = -1;
    for (int tries = 0; tries < 4; tries++) {
      a = get_dense(key->ndim, key->shape, chance(50) || key->stype == 2 ? key->dtype : -1,
                    fresh_outs || tries > 1);
      if (a < 0) return false;
      bool dup = false;
      for (int j = 0; j < i; j++) dup |= p->dst[j] == a;
      if (!dup) break;
      a = -1;
    }
    if (a < 0) return false;
    keys_set(s, &p->k, i, slot);
    p->outs[i] = g_arr[a].h;
    p->dst[i] = a;
  }
  p->n = n;
  p->k.n = n;
  return true;
}

/* The model after a successful pull: outputs hold their key's value. */
static void apply_pull(Store *s, const PullArgs *p) {
  for (int i = 0; i < p->n; i++) {
    Key *key = &s->keys[p->k.slot[i]];
    Arr *a = &g_arr[p->dst[i]];
    /* A device comm whose merge buffers are not placed yet writes one of a
       key's outputs (key % n) and copies the others from it, as MXNet
       1.9.1's CommDevice::Broadcast: through a bool output values become
       0/1. The model does not track the placement: such outputs are read. */
    bool via_bool = false;
    if (s->device)
      for (int j = 0; j < p->n; j++)
        if (j != i && p->k.slot[j] == p->k.slot[i] && g_arr[p->dst[j]].dtype == DT_BOOL) via_bool = true;
    TRACE("  output slot %d (dtype %d ctx %d,%d, %zu elements) <- key slot %d (stype %d dtype %d known %d v %g %g %g) store %ld",
          p->dst[i], a->dtype, a->devt, a->devid, arr_n(a), p->k.slot[i], key->stype, key->dtype, key->known,
          key->v[0], key->v[1], key->v[2], (long)(s - g_st));
    if (key->known && !via_bool && cast_exact(a->dtype, key->v, nelem(key->ndim, key->shape))) {
      for (size_t e = 0; e < nelem(key->ndim, key->shape); e++) a->v[e] = cast_to(a->dtype, key->v[e]);
      a->known = true;
      check_contents(a);
    } else {
      a->known = false;
      check_contents(a); /* learns the output */
      if (!via_bool && (a->dtype == key->dtype || a->dtype == DT_F64)) {
        memcpy(key->v, a->v, sizeof key->v);
        key->known = true;
      }
    }
  }
}

static void op_pull(void) {
  g_what = "pull";
  Store *s = pick_store();
  if (s == NULL) return;
  PullArgs p;
  if (!make_pull(s, &p, 5, false)) return;
  int how = rn(3);
  int defect = chance(30) ? 1 + rn(7) : 0;
  if (defect == 0) {
    /* with ignore_sparse, sparse outputs of dense keys are skipped (MXNet's
       "non-default weights detected during kvstore pull" warning) */
    int sp = -1;
    double before[MAXEL];
    if (how < 2 && p.n > 0 && p.n < 16 && chance(60)) {
      int slot = -1;
      for (int i = 0; i < p.n; i++)
        if (s->keys[p.k.slot[i]].stype == 0 && s->keys[p.k.slot[i]].ndim == 2) slot = p.k.slot[i];
      Key *key = &s->keys[slot < 0 ? 0 : slot];
      if (slot >= 0) {
        int devt, devid;
        rand_ctx(&devt, &devid);
        sp = chance(50) ? new_rsp_random(key->shape[0], key->shape[1], key->dtype, devt, devid)
                        : new_csr_random(key->shape[0], key->shape[1], key->dtype, devt, devid);
        if (sp >= 0) {
          int at = rn(p.n + 1);
          for (int i = p.n; i > at; i--) {
            p.k.slot[i] = p.k.slot[i - 1];
            p.k.ik[i] = p.k.ik[i - 1];
            p.k.sk[i] = p.k.sk[i - 1];
            p.outs[i] = p.outs[i - 1];
            p.dst[i] = p.dst[i - 1];
          }
          keys_set(s, &p.k, at, slot);
          p.outs[at] = g_arr[sp].h;
          p.dst[at] = sp;
          p.k.n = ++p.n;
          memcpy(before, g_arr[sp].v, sizeof before);
        }
      }
    }
    TRACE("pull %d outputs (how %d, sparse output slot %d) on store %ld", p.n, how, sp, (long)(s - g_st));
    MUST_OK(call_pull(s->h, &p.k, p.outs, (uint32_t)p.n, s->str, how));
    if (sp >= 0) {
      /* the sparse output is left as it was */
      PullArgs q = p;
      int m = 0;
      for (int i = 0; i < p.n; i++) {
        if (p.dst[i] == sp) continue;
        q.k.slot[m] = p.k.slot[i];
        q.k.ik[m] = p.k.ik[i];
        q.k.sk[m] = p.k.sk[i];
        q.outs[m] = p.outs[i];
        q.dst[m++] = p.dst[i];
      }
      q.n = q.k.n = m;
      apply_pull(s, &q);
      memcpy(g_arr[sp].v, before, sizeof before);
      check_meta(&g_arr[sp]);
      check_contents(&g_arr[sp]);
      return;
    }
    apply_pull(s, &p);
    return;
  }
  TRACE("pull defect %d (%d outputs, how %d)", defect, p.n, how);
  for (int i = 0; i < p.n; i++)
    TRACE("  output slot %d (dtype %d ctx %d,%d) <- key slot %d", p.dst[i], g_arr[p.dst[i]].dtype,
          g_arr[p.dst[i]].devt, g_arr[p.dst[i]].devid, p.k.slot[i]);
  switch (defect) {
    case 1: MUST_FAIL(call_pull(bad_kv_handle(), &p.k, p.outs, (uint32_t)p.n, s->str, how)); return;
    case 2:
      if (p.n == 0) return;
      MUST_FAIL(call_pull(s->h, NULL, p.outs, (uint32_t)p.n, s->str, how));
      return;
    case 3:
      if (p.n == 0) return;
      MUST_FAIL(call_pull(s->h, &p.k, NULL, (uint32_t)p.n, s->str, how));
      return;
    case 4:
      if (p.n == 0) return;
      p.outs[rn(p.n)] = bad_nd_handle(false);
      MUST_FAIL(call_pull(s->h, &p.k, p.outs, (uint32_t)p.n, s->str, how));
      break;
    case 5: {
      int slot = pick_key(s, false, -1);
      int a = get_dense(1, (uint32_t[]){2}, -1, true);
      if (a < 0) return;
      keys_set(s, &p.k, p.n, slot < 0 ? -1 : slot);
      p.outs[p.n] = g_arr[a].h;
      p.dst[p.n] = a;
      p.k.n = ++p.n;
      MUST_FAIL(call_pull(s->h, &p.k, p.outs, (uint32_t)p.n, s->str, how));
      break;
    }
    case 6: {
      int slot = pick_key(s, true, 0);
      if (slot < 0) return;
      Key *key = &s->keys[slot];
      int nd = key->ndim;
      uint32_t sh[3];
      memcpy(sh, key->shape, sizeof sh);
      if (nd == 0) return;
      sh[rn(nd)] += 1;
      int a = get_dense(nd, sh, -1, true);
      if (a < 0) return;
      keys_set(s, &p.k, p.n, slot);
      p.outs[p.n] = g_arr[a].h;
      p.dst[p.n] = a;
      p.k.n = ++p.n;
      MUST_FAIL(call_pull(s->h, &p.k, p.outs, (uint32_t)p.n, s->str, how));
      break;
    }
    case 7:
      if (p.n == 0) return;
      MUST_FAIL(call_pull(s->h, &p.k, p.outs, (uint32_t)p.n, !s->str, how));
      return;
  }
  /* a failed pull may have written some outputs */
  for (int i = 0; i < p.n; i++)
    if (p.dst[i] >= 0 && g_arr[p.dst[i]].live && !g_arr[p.dst[i]].is_part) g_arr[p.dst[i]].known = false;
}

static int call_pushpull(KVStoreHandle h, Keys *vk, uint32_t vn, Keys *ok, uint32_t on, NDArrayHandle *vals,
                         NDArrayHandle *outs, bool str) {
  if (str) return MXKVStorePushPullEx(h, vn, vk ? vk->sk : NULL, on, ok ? ok->sk : NULL, vals, outs, 0);
  return MXKVStorePushPull(h, vn, vk ? vk->ik : NULL, on, ok ? ok->ik : NULL, vals, outs, 0);
}

static void op_pushpull(void) {
  g_what = "pushpull";
  Store *s = pick_store();
  if (s == NULL) return;
  PushArgs p;
  PullArgs q;
  if (!make_push(s, &p, 4)) return;
  /* only dense keys in a pushpull (row_sparse values: chaos below) */
  bool has_rsp = false;
  for (int i = 0; i < p.n; i++) has_rsp |= s->keys[p.k.slot[i]].stype == 1;
  if (!make_pull(s, &q, 4, false)) return;
  if (chance(30)) {
    /* the pushed arrays are the outputs (kv.pushpull(k, g, out=g)), unless
       one array is pushed for two keys */
    for (int i = 0; i < p.n; i++)
      for (int j = 0; j < p.n; j++)
        if (p.src[i] == p.src[j] && p.k.slot[i] != p.k.slot[j]) return;
    q.k = p.k;
    q.n = p.n;
    memcpy(q.outs, p.vals, sizeof q.outs);
    memcpy(q.dst, p.src, sizeof q.dst);
  } else {
    /* an output that is also a pushed value gets its key's new value */
    for (int i = 0; i < q.n; i++)
      for (int j = 0; j < p.n; j++)
        for (int i2 = 0; i2 < q.n; i2++)
          if (q.dst[i] == p.src[j] && q.dst[i2] == p.src[j] && q.k.slot[i] != q.k.slot[i2]) return;
  }
  int defect = chance(25) ? 1 + rn(4) : 0;
  if (bool_sum(s, &p)) {
    MUST_FAIL(call_pushpull(s->h, &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, q.outs, s->str));
    return; /* all or nothing */
  }
  if (has_rsp || (s->compress && s->device)) {
    (void)ANY(call_pushpull(s->h, &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, q.outs, s->str));
    /* (a dense value pushed to a csr key makes it dense: storage types too
       are unknown now) */
    for (int i = 0; i < p.n; i++) s->keys[p.k.slot[i]].wild = true;
    for (int i = 0; i < q.n; i++) s->keys[q.k.slot[i]].wild = true;
    for (int i = 0; i < q.n; i++) g_arr[q.dst[i]].known = false;
    return;
  }
  if (defect == 0) {
    TRACE("pushpull %d values, %d outputs", p.n, q.n);
    MUST_OK(call_pushpull(s->h, &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, q.outs, s->str));
    apply_push(s, &p);
    apply_pull(s, &q);
    return;
  }
  TRACE("pushpull defect %d", defect);
  switch (defect) {
    case 1:
      MUST_FAIL(call_pushpull(bad_kv_handle(), &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, q.outs, s->str));
      return;
    case 2:
      if (q.n == 0) return;
      q.outs[rn(q.n)] = bad_nd_handle(false);
      MUST_FAIL(call_pushpull(s->h, &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, q.outs, s->str));
      return; /* outputs are checked before anything is pushed */
    case 3:
      if (q.n == 0) return;
      MUST_FAIL(call_pushpull(s->h, &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, NULL, s->str));
      return;
    case 4: {
      /* an uninitialised output key: all or nothing */
      int slot = pick_key(s, false, -1);
      int a = get_dense(1, (uint32_t[]){2}, -1, true);
      if (a < 0) return;
      keys_set(s, &q.k, q.n, slot < 0 ? -1 : slot);
      q.outs[q.n] = g_arr[a].h;
      q.dst[q.n] = a;
      q.k.n = ++q.n;
      MUST_FAIL(call_pushpull(s->h, &p.k, (uint32_t)p.n, &q.k, (uint32_t)q.n, p.vals, q.outs, s->str));
      return;
    }
  }
}

static int call_bcast(KVStoreHandle h, Keys *vk, uint32_t vn, Keys *ok, uint32_t on, NDArrayHandle *vals,
                      NDArrayHandle *outs, bool str) {
  if (str) return MXKVStoreBroadcastEx(h, vn, vk ? vk->sk : NULL, on, ok ? ok->sk : NULL, vals, outs, 0);
  return MXKVStoreBroadcast(h, vn, vk ? vk->ik : NULL, on, ok ? ok->ik : NULL, vals, outs, 0);
}

static void op_broadcast(void) {
  g_what = "broadcast";
  Store *s = pick_store();
  if (s == NULL) return;
  /* new dense keys, then a pull of them (and maybe of others) */
  Keys vk;
  NDArrayHandle vals[8];
  int src[8];
  int used[NKEYS] = {0};
  int n = rn(3);
  vk.n = 0;
  for (int i = 0; i < n; i++) {
    int slot = pick_key(s, false, -1);
    if (slot < 0 || used[slot]) break;
    used[slot] = 1;
    int nd;
    uint32_t sh[3];
    rand_shape(&nd, sh, 3);
    int a = get_dense(nd, sh, -1, false);
    if (a < 0) return;
    src[vk.n] = a;
    vals[vk.n] = g_arr[a].h;
    keys_set(s, &vk, vk.n++, slot);
  }
  n = vk.n;
  /* outputs: for each new key one output, plus maybe an inited key */
  Keys ok;
  NDArrayHandle outs[8];
  int dst[8];
  ok.n = 0;
  for (int i = 0; i < n; i++) {
    int a;
    for (;;) {
      a = get_dense(g_arr[src[i]].ndim, g_arr[src[i]].shape, -1, true);
      if (a < 0) return;
      break;
    }
    keys_set(s, &ok, ok.n, vk.slot[i]);
    outs[ok.n] = g_arr[a].h;
    dst[ok.n++] = a;
  }
  int defect = chance(30) ? 1 + rn(3) : 0;
  if (defect == 0) {
    TRACE("broadcast %d keys", n);
    MUST_OK(call_bcast(s->h, &vk, (uint32_t)n, &ok, (uint32_t)ok.n, vals, outs, s->str));
    for (int i = 0; i < n; i++) {
      Key *key = &s->keys[vk.slot[i]];
      Arr *a = &g_arr[src[i]];
      key->inited = true;
      key->stype = 0;
      key->ndim = a->ndim;
      memcpy(key->shape, a->shape, sizeof key->shape);
      key->dtype = a->dtype;
      key->known = a->known;
      memcpy(key->v, a->v, sizeof key->v);
    }
    PullArgs q;
    memset(&q, 0, sizeof q);
    q.k = ok;
    q.n = ok.n;
    memcpy(q.dst, dst, sizeof dst);
    apply_pull(s, &q);
    return;
  }
  TRACE("broadcast defect %d", defect);
  switch (defect) {
    case 1: MUST_FAIL(call_bcast(bad_kv_handle(), &vk, (uint32_t)n, &ok, (uint32_t)ok.n, vals, outs, s->str)); break;
    case 2: {
      /* an output of an uninitialised (and not broadcast) key */
      int slot = -1;
      for (int i = 0; i < NKEYS; i++)
        if (!s->keys[i].inited && !used[i]) slot = i;
      int a = get_dense(1, (uint32_t[]){2}, -1, true);
      if (a < 0) return;
      keys_set(s, &ok, ok.n, slot);
      outs[ok.n] = g_arr[a].h;
      dst[ok.n++] = a;
      MUST_FAIL(call_bcast(s->h, &vk, (uint32_t)n, &ok, (uint32_t)ok.n, vals, outs, s->str));
      break;
    }
    case 3: {
      /* an already inited key among the values */
      int slot = pick_key(s, true, 0);
      if (slot < 0) return;
      int a = get_dense(s->keys[slot].ndim, s->keys[slot].shape, s->keys[slot].dtype, false);
      if (a < 0) return;
      keys_set(s, &vk, n, slot);
      vals[n] = g_arr[a].h;
      n++;
      MUST_FAIL(call_bcast(s->h, &vk, (uint32_t)n, &ok, (uint32_t)ok.n, vals, outs, s->str));
      break;
    }
  }
  /* all or nothing: no key inited; the outputs are untouched */
}

static int call_rsp_pull(KVStoreHandle h, Keys *k, NDArrayHandle *outs, NDArrayHandle *rows, uint32_t n, bool str) {
  if (str) return MXKVStorePullRowSparseEx(h, n, k ? k->sk : NULL, outs, rows, 0);
  return MXKVStorePullRowSparse(h, n, k ? k->ik : NULL, outs, rows, 0);
}

static void op_rsp_pull(void) {
  g_what = "row_sparse_pull";
  Store *s = pick_store();
  if (s == NULL) return;
  int n = 1 + rn(3);
  Keys k;
  NDArrayHandle outs[8], rows[8];
  int dst[8];
  int64_t rid[8][8];
  int nrid[8];
  NDArrayHandle made[8];
  int nmade = 0;
  k.n = 0;
  for (int i = 0; i < n; i++) {
    int slot = pick_key(s, true, 1);
    if (slot < 0) break;
    Key *key = &s->keys[slot];
    int devt, devid;
    rand_ctx(&devt, &devid);
    int a = -1;
    for (int t = 0; t < 3 && a < 0; t++) {
      a = new_rsp_random(key->shape[0], key->shape[1], key->dtype, devt, devid);
      if (a < 0) break;
      for (int j = 0; j < k.n; j++)
        if (dst[j] == a) a = -1;
    }
    if (a < 0) break;
    /* row ids: random, possibly unsorted and repeated */
    nrid[k.n] = rn(5);
    for (int r = 0; r < nrid[k.n]; r++) rid[k.n][r] = rn((int)key->shape[0]);
    uint32_t len = (uint32_t)nrid[k.n];
    NDArrayHandle rh = NULL;
    MUST_OK(MXNDArrayCreateEx(&len, 1, DEV_CPU, 0, 0, DT_I64, &rh));
    if (len > 0) MUST_OK(MXNDArraySyncCopyFromCPU(rh, rid[k.n], len));
    made[nmade++] = rh;
    rows[k.n] = rh;
    outs[k.n] = g_arr[a].h;
    dst[k.n] = a;
    keys_set(s, &k, k.n, slot);
    k.n++;
  }
  n = k.n;
  if (n == 0) goto out;
  int defect = chance(30) ? 1 + rn(5) : 0;
  if (defect == 0) {
    TRACE("row_sparse_pull %d", n);
    MUST_OK(call_rsp_pull(s->h, &k, outs, rows, (uint32_t)n, s->str));
    for (int i = 0; i < n; i++) {
      Key *key = &s->keys[k.slot[i]];
      Arr *a = &g_arr[dst[i]];
      uint32_t cols = key->shape[1];
      if (key->known) {
        memset(a->v, 0, sizeof a->v);
        for (int r = 0; r < nrid[i]; r++)
          for (uint32_t c = 0; c < cols; c++) a->v[rid[i][r] * cols + c] = key->v[rid[i][r] * cols + c];
        a->known = true;
      } else {
        a->known = false;
      }
      check_meta(a);
      check_contents(a);
    }
    goto out;
  }
  TRACE("row_sparse_pull defect %d", defect);
  switch (defect) {
    case 1: MUST_FAIL(call_rsp_pull(bad_kv_handle(), &k, outs, rows, (uint32_t)n, s->str)); break;
    case 2: MUST_FAIL(call_rsp_pull(s->h, &k, outs, NULL, (uint32_t)n, s->str)); break;
    case 3:
      rows[rn(n)] = bad_nd_handle(false);
      MUST_FAIL(call_rsp_pull(s->h, &k, outs, rows, (uint32_t)n, s->str));
      break;
    case 4: {
      /* a row id out of range */
      int i = rn(n);
      uint32_t len = 1;
      int64_t bad = chance(50) ? (int64_t)s->keys[k.slot[i]].shape[0] + rn(3) : -1 - rn(3);
      NDArrayHandle rh = NULL;
      MUST_OK(MXNDArrayCreateEx(&len, 1, DEV_CPU, 0, 0, DT_I64, &rh));
      MUST_OK(MXNDArraySyncCopyFromCPU(rh, &bad, 1));
      made[nmade++] = rh;
      rows[i] = rh;
      MUST_FAIL(call_rsp_pull(s->h, &k, outs, rows, (uint32_t)n, s->str));
      break;
    }
    case 5: {
      /* a dense key */
      int slot = pick_key(s, true, 0);
      if (slot < 0) goto out;
      keys_set(s, &k, 0, slot);
      MUST_FAIL(call_rsp_pull(s->h, &k, outs, rows, (uint32_t)n, s->str));
      break;
    }
  }
  for (int i = 0; i < n; i++) g_arr[dst[i]].known = false;
out:
  for (int i = 0; i < nmade; i++) MUST_OK(MXNDArrayFree(made[i]));
}

/* Calls whose outcome the model does not predict: storage types that do not
   fit the key, CreateNone values, sparse outputs of dense pulls. */
static void op_store_chaos(void) {
  g_what = "store chaos";
  Store *s = pick_store();
  if (s == NULL) return;
  Keys k;
  NDArrayHandle hs[8];
  int idx[8];
  int n = 1 + rn(3);
  k.n = 0;
  for (int i = 0; i < n; i++) {
    int slot = chance(85) ? pick_key(s, true, -1) : pick_key(s, false, -1);
    int a = pick_live_arr();
    if (a < 0) return;
    keys_set(s, &k, k.n, slot < 0 ? -1 : slot);
    hs[k.n] = g_arr[a].h;
    idx[k.n++] = a;
  }
  n = k.n;
  int what = rn(6);
  int rc;
  TRACE("store chaos %d (%d)", what, n);
  switch (what) {
    case 0: rc = ANY(call_push(s->h, &k, hs, (uint32_t)n, s->str)); break;
    case 1: rc = ANY(call_pull(s->h, &k, hs, (uint32_t)n, s->str, rn(3))); break;
    case 2: rc = ANY(call_pushpull(s->h, &k, (uint32_t)n, &k, (uint32_t)n, hs, hs, s->str)); break;
    case 3: {
      NDArrayHandle rows[8];
      for (int i = 0; i < n; i++) rows[i] = g_arr[pick_live_arr()].h;
      rc = ANY(call_rsp_pull(s->h, &k, hs, rows, (uint32_t)n, s->str));
      break;
    }
    case 4: {
      /* empty calls with NULL arrays: nothing to do */
      MUST_OK(call_push(s->h, NULL, NULL, 0, s->str));
      MUST_OK(call_pull(s->h, NULL, NULL, 0, s->str, rn(3)));
      MUST_OK(call_init(s, s->h, NULL, NULL, 0, s->str));
      MUST_OK(call_pushpull(s->h, NULL, 0, NULL, 0, NULL, NULL, s->str));
      MUST_OK(call_bcast(s->h, NULL, 0, NULL, 0, NULL, NULL, s->str));
      MUST_OK(call_rsp_pull(s->h, NULL, NULL, NULL, 0, s->str));
      return;
    }
    default: {
      /* "negative" counts: a huge count with NULL arrays */
      uint32_t big = (uint32_t)-1 - (uint32_t)rn(3);
      MUST_FAIL(call_push(s->h, NULL, NULL, big, s->str));
      MUST_FAIL(call_pull(s->h, NULL, hs, big, s->str, rn(3)));
      MUST_FAIL(call_init(s, s->h, NULL, NULL, big, s->str));
      MUST_FAIL(call_pushpull(s->h, NULL, big, NULL, big, NULL, NULL, s->str));
      MUST_FAIL(call_rsp_pull(s->h, NULL, NULL, NULL, big, s->str));
      return;
    }
  }
  (void)rc;
  for (int i = 0; i < n; i++)
    if (k.slot[i] >= 0 && s->keys[k.slot[i]].inited) s->keys[k.slot[i]].wild = true;
  for (int i = 0; i < n; i++) touched(&g_arr[idx[i]]);
}

static void op_updater(void) {
  g_what = "updater";
  Store *s = pick_store();
  if (s == NULL) return;
  if (chance(20)) {
    /* defects: NULL updater, bad store */
    if (chance(50)) {
      MUST_FAIL(MXKVStoreSetUpdater(s->h, NULL, s->upd));
    } else if (chance(50)) {
      MUST_FAIL(MXKVStoreSetUpdaterEx(s->h, NULL, fuzz_str_updater, s->upd));
    } else {
      MUST_FAIL(MXKVStoreSetUpdater(bad_kv_handle(), fuzz_updater, s->upd));
    }
    return;
  }
  int mode = 1 + rn(3);
  s->upd->mode = mode;
  s->upd->nested = chance(40);
  TRACE("updater mode %d nested %d on store %ld", mode, s->upd->nested, (long)(s - g_st));
  s->upd->keys_kind = s->str ? 2 : 1;
  switch (rn(3)) {
    case 0:
      MUST_OK(MXKVStoreSetUpdater(s->h, fuzz_updater, s->upd));
      s->upd->str_cb = false;
      break;
    case 1:
      MUST_OK(MXKVStoreSetUpdaterEx(s->h, fuzz_updater, fuzz_str_updater, s->upd));
      s->upd->str_cb = true;
      break;
    default:
      MUST_OK(MXKVStoreSetUpdaterEx(s->h, fuzz_updater, NULL, s->upd));
      s->upd->str_cb = false;
      break;
  }
}

static void op_compression(void) {
  g_what = "gradient compression";
  Store *s = pick_store();
  if (s == NULL) return;
  const char *keys[3], *vals[3];
  switch (rn(6)) {
    case 0:
    case 1:
      keys[0] = "type";
      vals[0] = chance(70) ? "2bit" : "1bit";
      keys[1] = "threshold";
      vals[1] = chance(50) ? "0.5" : "1";
      TRACE("compression %s", vals[0]);
      MUST_OK(MXKVStoreSetGradientCompression(s->h, 2, keys, vals));
      s->compress = true;
      /* compression changes what pushes store on device comms */
      if (s->device)
        for (int i = 0; i < NKEYS; i++) s->keys[i].known = false;
      return;
    case 2:
      MUST_FAIL(MXKVStoreSetGradientCompression(s->h, 2, NULL, NULL));
      return;
    case 3:
      keys[0] = "type";
      vals[0] = NULL;
      MUST_FAIL(MXKVStoreSetGradientCompression(s->h, 1, keys, vals));
      return;
    case 4:
      keys[0] = "type";
      vals[0] = "2bit";
      MUST_FAIL(MXKVStoreSetGradientCompression(bad_kv_handle(), 1, keys, vals));
      return;
    default: {
      static const char *bk[] = {"type", "threshold", "no-such-param", "\xff"};
      static const char *bv[] = {"3bit", "-1", "abc", "", "2bit", "\xfe"};
      keys[0] = bk[rn(4)];
      vals[0] = bv[rn(6)];
      int rc = ANY(MXKVStoreSetGradientCompression(s->h, 1, keys, vals));
      if (rc == 0) {
        s->compress = true;
        if (s->device)
          for (int i = 0; i < NKEYS; i++) s->keys[i].known = false;
      }
      return;
    }
  }
}

static void op_store_misc(void) {
  g_what = "store misc";
  Store *s = pick_store();
  int r = -5;
  if (s == NULL || chance(25)) {
    KVStoreHandle h = bad_kv_handle();
    const char *t;
    switch (rn(7)) {
      case 0: MUST_FAIL(MXKVStoreGetType(h, &t)); break;
      case 1: MUST_FAIL(MXKVStoreGetRank(h, &r)); break;
      case 2: MUST_FAIL(MXKVStoreGetGroupSize(h, &r)); break;
      case 3: MUST_FAIL(MXKVStoreBarrier(h)); break;
      case 4: MUST_FAIL(MXKVStoreSetBarrierBeforeExit(h, 1)); break;
      case 5: MUST_FAIL(MXKVStoreSendCommmandToServers(h, 0, "x")); break;
      default: MUST_FAIL(MXKVStoreGetNumDeadNode(h, 0, &r, 1)); break;
    }
    return;
  }
  const char *t = NULL;
  switch (rn(9)) {
    case 0:
      MUST_OK(MXKVStoreGetType(s->h, &t));
      if (strcmp(t, s->type) != 0) FAIL("GetType \"%s\", model \"%s\"", t, s->type);
      break;
    case 1: MUST_OK(MXKVStoreBarrier(s->h)); break;
    case 2: MUST_OK(MXKVStoreSetBarrierBeforeExit(s->h, rn(3) - 1)); break;
    case 3: MUST_OK(MXKVStoreRunServer(s->h, NULL, NULL)); break;
    case 4:
      /* a local store has no servers: any command is a no-op (MXNet's KVStore base) */
      MUST_OK(MXKVStoreSendCommmandToServers(s->h, rn(10) - 2, chance(50) ? "body" : ""));
      MUST_FAIL(MXKVStoreSendCommmandToServers(s->h, 0, NULL));
      break;
    case 5:
      MUST_OK(MXKVStoreGetNumDeadNode(s->h, rn(10), &r, rn(3)));
      if (r != 0) FAIL("dead nodes %d", r);
      break;
    case 6: MUST_FAIL(MXKVStoreGetType(s->h, NULL)); break;
    case 7: MUST_FAIL(MXKVStoreGetRank(s->h, NULL)); break;
    default: {
      int w = -1, sv = -1, sc = -1;
      MUST_OK(MXKVStoreIsWorkerNode(&w));
      MUST_OK(MXKVStoreIsServerNode(&sv));
      MUST_OK(MXKVStoreIsSchedulerNode(&sc));
      if (w != 1 || sv != 0 || sc != 0) FAIL("node roles %d %d %d", w, sv, sc);
      MUST_FAIL(MXKVStoreIsWorkerNode(NULL));
      break;
    }
  }
}

static void op_global(void) {
  g_what = "global";
  int v = 0;
  switch (rn(9)) {
    case 0:
      MUST_OK(MXGetVersion(&v));
      if (v != 10901) FAIL("version %d", v);
      MUST_FAIL(MXGetVersion(NULL));
      break;
    case 1: MUST_OK(MXNDArrayWaitAll()); break;
    case 2: {
      const char *k[1] = {"MXKV_FUZZ_HARMLESS"}, *val[1] = {chance(50) ? "1" : "\xff\xfe"};
      MUST_OK(MXInitPSEnv(1, k, val));
      MUST_FAIL(MXInitPSEnv(1, NULL, val));
      break;
    }
    case 3: {
      float rows[6] = {1, 2, 3, 4, 5, 6}, out[3];
      MUST_OK(MXKVKahanSumColumns(0, rows, 2, 3, out));
      if (out[0] != 5 || out[1] != 7 || out[2] != 9) FAIL("KahanSumColumns");
      MUST_FAIL(MXKVKahanSumColumns(7, rows, 2, 3, out));
      MUST_FAIL(MXKVKahanSumColumns(0, NULL, 2, 3, out));
      MUST_FAIL(MXKVKahanSumColumns(0, rows, 2, 3, rows)); /* overlap */
      break;
    }
    case 4: {
      double x[3] = {1, 2, 3}, out = 0;
      MUST_OK(MXKVBlasDot(1, x, x, 3, 1 + rn(4), &out));
      if (out != 14) FAIL("BlasDot %g", out);
      MUST_FAIL(MXKVBlasDot(1, x, x, 3, 0, &out));
      MUST_FAIL(MXKVBlasDot(2, x, x, 3, 1, &out));
      const char *name = NULL;
      MUST_OK(MXKVBlasCoreName(&name));
      if (name == NULL || name[0] == 0) FAIL("BlasCoreName");
      MUST_FAIL(MXKVBlasCoreName(NULL));
      break;
    }
    case 5: {
      NDArrayHandle hs[4];
      int st[4], n = 0;
      int idx[4];
      for (int i = 0; i < 4; i++) {
        int s = pick_live_arr();
        if (s < 0) break;
        idx[n] = s;
        hs[n++] = g_arr[s].h;
      }
      MUST_OK(MXKVNDArrayGetStorageTypes((uint32_t)n, hs, st));
      for (int i = 0; i < n; i++)
        if (st[i] != g_arr[idx[i]].stype) FAIL("GetStorageTypes[%d] %d, model %d", i, st[i], g_arr[idx[i]].stype);
      if (n > 0) {
        hs[rn(n)] = bad_nd_handle(true);
        MUST_FAIL(MXKVNDArrayGetStorageTypes((uint32_t)n, hs, st));
      }
      MUST_FAIL(MXKVNDArrayGetStorageTypes(2, NULL, st));
      break;
    }
    case 6: {
      /* a row_sparse array's storage types at once, NULL output */
      NDArrayHandle h = NULL;
      MUST_OK(MXNDArrayCreateNone(&h));
      int st = 5;
      MUST_OK(MXKVNDArrayGetStorageTypes(1, &h, &st));
      if (st != -1) FAIL("GetStorageTypes of CreateNone: %d", st);
      MUST_FAIL(MXKVNDArrayGetStorageTypes(1, &h, NULL));
      MUST_OK(MXNDArrayFree(h));
      remember_dead_nd(h);
      break;
    }
    case 7: {
      /* no dist store here: nothing to close */
      MUST_OK(MXNotifyShutdown());
      break;
    }
    default: {
      int a = -1, b = -1;
      MUST_OK(mxkv_live_handles(&a, &b));
      int live = 0;
      for (int i = 0; i < NSTORE; i++) live += g_st[i].live;
      (void)live;
      break;
    }
  }
}

/* ------------------------------------------------------ MT random draws */

/* MXKVMTSeed and MXKVMTDraw (libmxkv only): the caller keeps the states of
   std::mt19937 engines (624 key words and a position in 0..=624 each). The
   model does not reimplement the generator; it checks what the documented
   contract fixes exactly:
   - MXKVMTSeed: engine j's key words are std::mt19937(base + j)'s (the C++
     standard's seeding recurrence), its position 624; no other engine moves;
   - MXKVMTDraw splits `num` over min(ceil(num / 64), E) engines in chunks
     of ceil(num / that): the engines past the used ones do not move, and
     each used engine's chunk is what a one-engine draw from its old state
     gives, leaving the same state (determinism and the split at once);
   - uniforms take 1 (float32) or 2 (float64) outputs a number, randint words
     2: a position moves by exactly that, and key words change only by a
     twist (at 624); a normal takes pairs of canonicals, 2 or 4 outputs a try;
   - a draw of a then b numbers from one engine is a draw of a + b;
   - one state's outputs seen three ways, as randint words (w1 << 31) + w2,
     float32 uniforms w / 2^32 and float64 uniforms (w1 + w2 2^32) / 2^64,
     agree exactly (and leave one state); randint words are below
     2^63 + 2^31; uniforms in [0, 1]; normals finite;
   - std::mt19937(5489)'s 10000th output is 4123659995 (C++ [rand.predef]);
   - nothing past `num` elements of `out` is written;
   - a call with one defect (kind, dtype for the kind, NULL where items are
     announced, a position outside 0..=624 in any engine, no engines for a
     draw, sizes beyond memory, overlapping or misaligned buffers) returns -1
     with a text naming the function and writes nothing. */

#define MT_N 624
#define MT_E 12      /* engines in the model's state at most */
#define MT_GUARD 64  /* bytes past `out` that must stay untouched */
#define MT_PAT 0xA5

static uint32_t g_mt_keys[MT_E * MT_N];
static int64_t g_mt_pos[MT_E];
static uint64_t g_mt_e; /* engines in the model's state; 0: none yet */

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) FAIL("out of memory (%zu bytes)", n);
  return p;
}

static void mt_err_names(const char *fn, const char *call) {
  const char *m = MXGetLastError();
  if (m == NULL || strncmp(m, fn, strlen(fn)) != 0) FAIL("%s: error text \"%s\" does not name %s", call, m ? m : "(NULL)", fn);
}

static size_t mt_size(int kind, int dtype) { return kind == 2 || dtype == 1 ? 8 : 4; }
static void mt_rand_kd(int *kind, int *dtype) {
  *kind = rn(3);
  *dtype = *kind == 2 ? 6 : rn(2);
}

/* MXNet's LaunchRNG split: outputs per engine, and engines used */
static void mt_split(uint64_t num, uint64_t e, uint64_t *step, uint64_t *used) {
  *step = *used = 0;
  if (num == 0) return;
  uint64_t nt = (num + 63) / 64;
  if (nt > e) nt = e;
  if (nt == 0) nt = 1;
  *step = (num + nt - 1) / nt;
  *used = (num + *step - 1) / *step;
}

/* an engine's position after `k` outputs from `p`; *twisted: its key words
   were twisted on the way */
static int64_t mt_advance(int64_t p, uint64_t k, bool *twisted) {
  *twisted = false;
  if (k <= (uint64_t)(MT_N - p)) return p + (int64_t)k;
  *twisted = true;
  return (int64_t)((k - (uint64_t)(MT_N - p) - 1) % MT_N + 1);
}

/* numbers to draw: around the split thresholds (64 a engine, E engines)
   and the twist (624 outputs) */
static uint64_t mt_rand_num(uint64_t e) {
  switch (rn(6)) {
    case 0: return (uint64_t)rn(4);
    case 1: return 63 + (uint64_t)rn(3);
    case 2: return 64 * (uint64_t)(1 + rn((int)e + 1)) + (uint64_t)rn(3) - 1;
    case 3: return (uint64_t)rn(700);
    case 4: return 64 * e + (uint64_t)rn(1500);
    default: return 1 + (uint64_t)rn(200);
  }
}

/* the values of a draw in their ranges */
static void mt_check_values(int kind, int dtype, const void *out, uint64_t num) {
  for (uint64_t i = 0; i < num; i++) {
    if (kind == 2) {
      uint64_t v;
      memcpy(&v, (const char *)out + 8 * i, 8);
      if (v > (0xFFFFFFFFull << 31) + 0xFFFFFFFFull) FAIL("randint word %llu is %#llx, beyond (w1 << 31) + w2", (unsigned long long)i, (unsigned long long)v);
      continue;
    }
    double x = dtype == 0 ? (double)((const float *)out)[i] : ((const double *)out)[i];
    if (kind == 0 && !(x >= 0 && x <= 1)) FAIL("uniform %llu is %.17g, outside [0, 1]", (unsigned long long)i, x);
    if (kind == 1 && !(isfinite(x) && fabs(x) < 64)) FAIL("normal %llu is %.17g", (unsigned long long)i, x);
  }
  g_n_checked += (long)num;
}

/* A draw the model says is valid, from the E engines at keys/pos, into out
   (room for num elements and MT_GUARD bytes), checked as above. */
static void mt_draw_checked(int kind, int dtype, uint32_t *keys, int64_t *pos, uint64_t e, uint64_t num, void *out) {
  size_t sz = mt_size(kind, dtype), nb = (size_t)num * sz;
  uint32_t *k0 = xmalloc(e * MT_N * 4);
  int64_t *p0 = xmalloc(e * 8);
  memcpy(k0, keys, e * MT_N * 4);
  memcpy(p0, pos, e * 8);
  memset(out, MT_PAT, nb + MT_GUARD);
  TRACE("MTDraw kind %d dtype %d engines %llu num %llu", kind, dtype, (unsigned long long)e, (unsigned long long)num);
  MUST_OK(MXKVMTDraw(kind, dtype, keys, pos, e, num, num == 0 && chance(50) ? NULL : out));
  for (size_t i = 0; i < MT_GUARD; i++)
    if (((unsigned char *)out)[nb + i] != MT_PAT) FAIL("MTDraw wrote byte %zu past %llu elements", i, (unsigned long long)num);
  mt_check_values(kind, dtype, out, num);
  uint64_t step, used;
  mt_split(num, e, &step, &used);
  /* outputs a number (0: a normal's vary) */
  int per = kind == 1 ? 0 : kind == 2 || dtype == 1 ? 2 : 1;
  int try_ = dtype == 1 ? 4 : 2; /* a normal's try */
  unsigned char *o2 = xmalloc(step * sz + MT_GUARD);
  for (uint64_t j = 0; j < e; j++) {
    uint32_t *kj = keys + j * MT_N, *k0j = k0 + j * MT_N;
    bool same_keys = memcmp(kj, k0j, MT_N * 4) == 0;
    if (j >= used) {
      if (!same_keys || pos[j] != p0[j]) FAIL("MTDraw of %llu on %llu engines moved engine %llu (only %llu used)", (unsigned long long)num, (unsigned long long)e, (unsigned long long)j, (unsigned long long)used);
      continue;
    }
    uint64_t c = num - j * step < step ? num - j * step : step;
    if (per > 0) {
      bool tw;
      int64_t want = mt_advance(p0[j], c * (uint64_t)per, &tw);
      if (pos[j] != want) FAIL("MTDraw kind %d dtype %d: engine %llu at %lld after %llu numbers from %lld, expected %lld", kind, dtype, (unsigned long long)j, (long long)pos[j], (unsigned long long)c, (long long)p0[j], (long long)want);
      if (!tw && !same_keys) FAIL("MTDraw: engine %llu's key words changed without a twist", (unsigned long long)j);
    } else if (same_keys) {
      /* no twist (a twist leaves no random state as it was) */
      int64_t d = pos[j] - p0[j];
      if (d < (int64_t)(c * (uint64_t)try_) || d % try_ != 0) FAIL("MTDraw normals: engine %llu moved %lld for %llu numbers", (unsigned long long)j, (long long)d, (unsigned long long)c);
    }
    /* the chunk again, from the old state, with this engine alone */
    memset(o2, MT_PAT, c * sz + MT_GUARD);
    MUST_OK(MXKVMTDraw(kind, dtype, k0j, p0 + j, 1, c, o2));
    if (memcmp(o2, (unsigned char *)out + j * step * sz, c * sz) != 0) FAIL("MTDraw: engine %llu's chunk of %llu differs from a one-engine draw of %llu", (unsigned long long)j, (unsigned long long)num, (unsigned long long)c);
    if (memcmp(k0j, kj, MT_N * 4) != 0 || p0[j] != pos[j]) FAIL("MTDraw: engine %llu's state after a draw of %llu differs from a one-engine draw's", (unsigned long long)j, (unsigned long long)num);
    g_n_checked += (long)c;
  }
  free(o2);
  free(k0);
  free(p0);
}

/* MXKVMTSeed, checked: the C++ standard's std::mt19937(seed) key words */
static void mt_seed_checked(uint32_t base, uint32_t *keys, int64_t *pos, uint64_t e, uint64_t room) {
  for (uint64_t j = 0; j < room; j++) pos[j] = chance(50) ? -7 - rn(9) : (int64_t)rn(MT_N + 1); /* overwritten */
  for (uint64_t i = 0; i < room * MT_N; i++) keys[i] = (uint32_t)rnd();
  uint32_t tail0 = room > e ? keys[e * MT_N] : 0;
  int64_t ptail = room > e ? pos[e] : 0;
  TRACE("MTSeed base %u engines %llu", base, (unsigned long long)e);
  MUST_OK(MXKVMTSeed(base, keys, pos, e));
  for (uint64_t j = 0; j < e; j++) {
    if (pos[j] != MT_N) FAIL("MTSeed: engine %llu at %lld", (unsigned long long)j, (long long)pos[j]);
    uint32_t prev = base + (uint32_t)j;
    if (keys[j * MT_N] != prev) FAIL("MTSeed(%u): engine %llu's first key word %u", base, (unsigned long long)j, keys[j * MT_N]);
    for (uint32_t i = 1; i < MT_N; i++) {
      prev = 1812433253u * (prev ^ (prev >> 30)) + i;
      if (keys[j * MT_N + i] != prev) FAIL("MTSeed(%u): engine %llu's key word %u", base, (unsigned long long)j, i);
    }
  }
  if (room > e && (keys[e * MT_N] != tail0 || pos[e] != ptail)) FAIL("MTSeed of %llu engines wrote past them", (unsigned long long)e);
  g_n_checked += (long)e * MT_N;
}

/* The same outputs of one engine three ways: randint words, float32 and
   float64 uniforms. */
static void mt_three_ways(const uint32_t *key, int64_t p, uint64_t c) {
  static uint32_t k[3 * MT_N];
  int64_t ps[3] = {p, p, p};
  for (int i = 0; i < 3; i++) memcpy(k + i * MT_N, key, MT_N * 4);
  int64_t *w = xmalloc(c * 8 + MT_GUARD);
  float *f = xmalloc(2 * c * 4 + MT_GUARD);
  double *d = xmalloc(c * 8 + MT_GUARD);
  mt_draw_checked(2, 6, k, &ps[0], 1, c, w);
  mt_draw_checked(0, 0, k + MT_N, &ps[1], 1, 2 * c, f);
  mt_draw_checked(0, 1, k + 2 * MT_N, &ps[2], 1, c, d);
  if (ps[0] != ps[1] || ps[0] != ps[2] || memcmp(k, k + MT_N, MT_N * 4) != 0 || memcmp(k, k + 2 * MT_N, MT_N * 4) != 0)
    FAIL("MTDraw: %llu randint words, %llu float32 and %llu float64 uniforms leave different states", (unsigned long long)c, (unsigned long long)(2 * c), (unsigned long long)c);
  for (uint64_t i = 0; i < c; i++) {
    uint64_t v = (uint64_t)w[i];
    bool found = false;
    /* (w1 << 31) + w2 with w2 < 2^32: w1 is v >> 31 or one less */
    for (int back = 0; back < 2 && !found; back++) {
      uint64_t w1 = (v >> 31) - (uint64_t)back;
      if ((v >> 31) < (uint64_t)back || w1 > 0xFFFFFFFFull) continue;
      uint64_t w2 = v - (w1 << 31);
      if (w2 > 0xFFFFFFFFull) continue;
      float u1 = (float)(uint32_t)w1 / 4294967296.0f, u2 = (float)(uint32_t)w2 / 4294967296.0f;
      double du = ((double)w1 + (double)w2 * 4294967296.0) / 18446744073709551616.0;
      found = u1 == f[2 * i] && u2 == f[2 * i + 1] && du == d[i];
    }
    if (!found) FAIL("MTDraw: randint word %llu %#llx is not float32 uniforms %.9g, %.9g and float64 uniform %.17g", (unsigned long long)i, (unsigned long long)v, (double)f[2 * i], (double)f[2 * i + 1], d[i]);
  }
  free(w);
  free(f);
  free(d);
}

/* one defect: a block with keys, positions and out (where they are put),
   all of which must be as they were after the refused call */
static void op_mt_fail(void) {
  uint64_t e = g_mt_e;
  int kind, dtype;
  mt_rand_kd(&kind, &dtype);
  uint64_t num = 1 + (uint64_t)rn(300);
  size_t sz = mt_size(kind, dtype), kb = e * MT_N * 4, pb = e * 8, ob = num * sz;
  size_t off_k = 0, off_p = kb + 16, off_o = off_p + pb + 16, bsz = off_o + ob + MT_GUARD + 16;
  unsigned char *blk = xmalloc(bsz), *snap = xmalloc(bsz);
  for (size_t i = 0; i < bsz; i++) blk[i] = (unsigned char)rnd();
  bool seed = chance(25);
  int defect = rn(seed ? 5 : 10);
  uint64_t ne = e, nn = num;
  bool null_k = false, null_p = false, null_o = false;
  switch (defect) {
    case 0: /* seed and draw: keys NULL */ null_k = true; break;
    case 1: /* positions NULL */ null_p = true; break;
    case 2: { /* overlapping (touching is fine: the valid contiguous draws) */
      int w = rn(seed ? 2 : 5);
      if (w == 0) off_p = 8 * (size_t)rn((int)(kb / 8));
      else if (w == 1) off_p = kb - 8;
      else if (w == 2) off_o = 8 * (size_t)rn((int)(kb / 8));
      else if (w == 3) off_o = off_p + 8 * (size_t)rn((int)e);
      else off_o = off_p + pb - 8;
      break;
    }
    case 3: { /* sizes beyond memory */
      static const uint64_t big_e[] = {UINT64_MAX, 1ull << 62, (1ull << 63) / (MT_N * 4) + 1, (1ull << 63) / 8};
      static const uint64_t big_n[] = {UINT64_MAX, 1ull << 61, 1ull << 62};
      if (seed || chance(50)) ne = big_e[rn(4)];
      else nn = sz == 8 ? (chance(50) ? (1ull << 60) : big_n[rn(3)]) : big_n[rn(3)];
      break;
    }
    case 4: { /* misaligned */
      int w = rn(seed ? 2 : 3);
      if (w == 0) off_k += 1 + (size_t)rn(3);
      else if (w == 1) off_p += 4;
      else off_o += sz == 8 ? 4 : 2;
      break;
    }
    case 5: /* out NULL */ null_o = true; break;
    case 6: { /* kind */
      static const int bad[] = {-1, 3, 4, 100, INT_MIN, INT_MAX};
      kind = bad[rn(6)];
      break;
    }
    case 7: { /* dtype for the kind */
      static const int bad01[] = {6, 2, 3, 4, 5, -1, 12}, bad2[] = {0, 1, 2, 4, 5, -1, 7};
      dtype = kind == 2 ? bad2[rn(7)] : bad01[rn(7)];
      break;
    }
    case 8: /* a position outside 0..=624, in any engine, used by the draw or not */ break;
    default: /* no engines to draw with */ ne = 0; break;
  }
  uint32_t *keys = null_k ? NULL : (uint32_t *)(void *)(blk + off_k);
  int64_t *pos = null_p ? NULL : (int64_t *)(void *)(blk + off_p);
  void *out = null_o ? NULL : blk + off_o;
  /* valid states where they are put (misaligned too; where they overlap,
     the positions are written last and stay valid) */
  memcpy(blk + off_k, g_mt_keys, kb);
  memcpy(blk + off_p, g_mt_pos, pb);
  if (defect == 8) {
    static const int64_t badp[] = {MT_N + 1, -1, INT64_MIN, INT64_MAX, 1000};
    int64_t b = badp[rn(5)];
    memcpy(blk + off_p + 8 * (size_t)rn((int)e), &b, 8);
  }
  memcpy(snap, blk, bsz);
  TRACE("MT%s defect %d kind %d dtype %d engines %llu num %llu offsets %zu %zu %zu", seed ? "Seed" : "Draw", defect, kind,
        dtype, (unsigned long long)ne, (unsigned long long)nn, off_k, off_p, off_o);
  if (seed) {
    MUST_FAIL(MXKVMTSeed((uint32_t)rnd(), keys, pos, ne));
    mt_err_names("MXKVMTSeed", "MXKVMTSeed");
  } else {
    MUST_FAIL(MXKVMTDraw(kind, dtype, keys, pos, ne, nn, out));
    mt_err_names("MXKVMTDraw", "MXKVMTDraw");
  }
  for (size_t i = 0; i < bsz; i++)
    if (blk[i] != snap[i]) FAIL("refused MT%s (defect %d) wrote byte %zu of its buffers", seed ? "Seed" : "Draw", defect, i);
  free(blk);
  free(snap);
}

static void op_mt(void) {
  g_what = "MT random";
  g_n_mt++;
  if (g_mt_e == 0 || chance(12)) {
    /* (re)seed the model's engines; bases near 2^32 wrap */
    uint64_t e = 1 + (uint64_t)rn(MT_E);
    uint32_t base = chance(25) ? UINT32_MAX - (uint32_t)rn(20) : (uint32_t)rnd();
    uint32_t *k = xmalloc((MT_E + 1) * MT_N * 4);
    int64_t *p = xmalloc((MT_E + 1) * 8);
    mt_seed_checked(base, k, p, e, MT_E + 1);
    memcpy(g_mt_keys, k, e * MT_N * 4);
    memcpy(g_mt_pos, p, e * 8);
    g_mt_e = e;
    free(k);
    free(p);
    return;
  }
  uint64_t e = g_mt_e;
  switch (rn(12)) {
    case 0: {
      /* any key words and positions are a valid state */
      int j = rn((int)e);
      if (chance(50))
        for (int i = 0; i < MT_N; i++) g_mt_keys[j * MT_N + i] = (uint32_t)rnd();
      g_mt_pos[j] = chance(30) ? (chance(50) ? 0 : MT_N) : rn(MT_N + 1);
      /* no engines, nothing to do: NULLs accepted */
      MUST_OK(MXKVMTSeed((uint32_t)rnd(), NULL, NULL, 0));
      int kind = rn(2), dtype = rn(2);
      MUST_OK(MXKVMTDraw(kind, dtype, NULL, NULL, 0, 0, NULL));
      MUST_OK(MXKVMTDraw(2, 6, NULL, NULL, 0, 0, NULL));
      break;
    }
    case 1:
    case 2:
    case 3:
    case 4: {
      /* a draw from the model's engines (sometimes fewer of them) */
      int kind, dtype;
      mt_rand_kd(&kind, &dtype);
      uint64_t ue = chance(80) ? e : 1 + (uint64_t)rn((int)e);
      uint64_t num = mt_rand_num(ue);
      void *out = xmalloc(num * 8 + MT_GUARD);
      mt_draw_checked(kind, dtype, g_mt_keys, g_mt_pos, ue, num, out);
      free(out);
      break;
    }
    case 5: {
      /* keys, positions and out touching in one block */
      int kind, dtype;
      mt_rand_kd(&kind, &dtype);
      uint64_t num = mt_rand_num(e);
      size_t kb = e * MT_N * 4, pb = e * 8;
      unsigned char *blk = xmalloc(kb + pb + num * 8 + MT_GUARD);
      memcpy(blk, g_mt_keys, kb);
      memcpy(blk + kb, g_mt_pos, pb);
      mt_draw_checked(kind, dtype, (uint32_t *)(void *)blk, (int64_t *)(void *)(blk + kb), e, num, blk + kb + pb);
      memcpy(g_mt_keys, blk, kb);
      memcpy(g_mt_pos, blk + kb, pb);
      free(blk);
      break;
    }
    case 6: {
      /* a then b numbers from one engine are a + b numbers */
      int kind, dtype;
      mt_rand_kd(&kind, &dtype);
      int j = rn((int)e);
      uint64_t a = (uint64_t)rn(400), b = (uint64_t)rn(400);
      size_t sz = mt_size(kind, dtype);
      static uint32_t k[2 * MT_N];
      int64_t p[2] = {g_mt_pos[j], g_mt_pos[j]};
      memcpy(k, g_mt_keys + j * MT_N, MT_N * 4);
      memcpy(k + MT_N, g_mt_keys + j * MT_N, MT_N * 4);
      unsigned char *o1 = xmalloc((a + b) * sz + MT_GUARD), *o2 = xmalloc((a + b) * sz + MT_GUARD);
      mt_draw_checked(kind, dtype, k, &p[0], 1, a, o1);
      mt_draw_checked(kind, dtype, k, &p[0], 1, b, o1 + a * sz);
      mt_draw_checked(kind, dtype, k + MT_N, &p[1], 1, a + b, o2);
      if (memcmp(o1, o2, (a + b) * sz) != 0 || p[0] != p[1] || memcmp(k, k + MT_N, MT_N * 4) != 0)
        FAIL("MTDraw kind %d dtype %d: %llu then %llu numbers are not %llu", kind, dtype, (unsigned long long)a, (unsigned long long)b, (unsigned long long)(a + b));
      free(o1);
      free(o2);
      break;
    }
    case 7: {
      int j = rn((int)e);
      mt_three_ways(g_mt_keys + j * MT_N, g_mt_pos[j], (uint64_t)rn(chance(50) ? 20 : 700));
      break;
    }
    case 8: {
      /* std::mt19937(5489)'s 10000th output is 4123659995 ([rand.predef]) */
      static uint32_t k[2 * MT_N];
      int64_t p[2];
      int64_t *w = xmalloc(5000 * 8 + MT_GUARD);
      float *f = xmalloc(10000 * 4 + MT_GUARD);
      mt_seed_checked(5489, k, p, 1, 1);
      memcpy(k + MT_N, k, MT_N * 4);
      p[1] = p[0];
      mt_draw_checked(2, 6, k, &p[0], 1, 5000, w);
      mt_draw_checked(0, 0, k + MT_N, &p[1], 1, 10000, f);
      uint64_t v = (uint64_t)w[4999];
      if (v < 4123659995ull || (v - 4123659995ull) % (1ull << 31) != 0 || (v - 4123659995ull) >> 31 > 0xFFFFFFFFull)
        FAIL("MTDraw: std::mt19937(5489)'s 5000th randint word %#llx has not 4123659995 as its second output", (unsigned long long)v);
      if (f[9999] != (float)4123659995u / 4294967296.0f) FAIL("MTDraw: std::mt19937(5489)'s 10000th uniform %.9g", (double)f[9999]);
      free(w);
      free(f);
      break;
    }
    default: op_mt_fail(); break;
  }
}

/* ------------------------------------------------------------ save / load */

static char g_tmpdir[256];

static void load_and_check(uint32_t n, NDArrayHandle *arr, uint32_t nn, const char **names, const int *src,
                           const char *const *want_names, bool with_names) {
  (void)want_names;
  if (with_names && nn != n) FAIL("load: %u arrays, %u names", n, nn);
  if (!with_names && nn != 0) FAIL("load: %u names for a save without keys", nn);
  /* copy the handles first: the arrays are valid until the next load */
  NDArrayHandle hs[16];
  memcpy(hs, arr, n * sizeof(NDArrayHandle));
  for (uint32_t i = 0; i < n; i++) {
    if (with_names && strcmp(names[i], want_names[i]) != 0) FAIL("load: name %u \"%s\", saved \"%s\"", i, names[i], want_names[i]);
    Arr tmp = g_arr[src[i]];
    tmp.h = hs[i];
    tmp.is_part = false;
    /* contexts: loaded arrays are on cpu, as MXNet's load gives them? (not checked) */
    int dt, st;
    MUST_OK(MXNDArrayGetDType(hs[i], &dt));
    MUST_OK(MXNDArrayGetStorageType(hs[i], &st));
    if (dt != tmp.dtype || st != tmp.stype) FAIL("load: array %u dtype %d stype %d, saved %d %d", i, dt, st, tmp.dtype, tmp.stype);
    int nd;
    const int64_t *sh;
    MUST_OK(MXNDArrayGetShapeEx64(hs[i], &nd, &sh));
    if (nd != tmp.ndim) FAIL("load: ndim %d, saved %d", nd, tmp.ndim);
    for (int d = 0; d < nd; d++)
      if (sh[d] != (int64_t)tmp.shape[d]) FAIL("load: dim %d", d);
    if ((tmp.stype == 0 || tmp.stype == 1) && tmp.known) {
      double got[MAXEL];
      read_arr(&tmp, got);
      for (size_t e = 0; e < arr_n(&tmp); e++)
        if (got[e] != tmp.v[e]) FAIL("load: array %u element %zu: %g, saved %g", i, e, got[e], tmp.v[e]);
    }
  }
  for (uint32_t i = 0; i < n; i++) MUST_OK(MXNDArrayFree(hs[i]));
}

static void free_loaded(uint32_t n, NDArrayHandle *arr) {
  NDArrayHandle hs[64];
  if (n > 64) FAIL("load of %u arrays", n);
  memcpy(hs, arr, n * sizeof(NDArrayHandle));
  for (uint32_t i = 0; i < n; i++) MUST_OK(MXNDArrayFree(hs[i]));
}

static unsigned char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) FAIL("open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long l = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)l + 1);
  if (fread(b, 1, (size_t)l, f) != (size_t)l) FAIL("read %s", path);
  fclose(f);
  *len = (size_t)l;
  return b;
}

static void op_save_load(void) {
  g_what = "save/load";
  char path[300];
  snprintf(path, sizeof path, "%s/f%d.params", g_tmpdir, rn(3));
  NDArrayHandle hs[8];
  int src[8];
  const char *names[8];
  char namebuf[8][16];
  int n = 0;
  for (int i = 0; i < 1 + rn(5); i++) {
    int s = pick_live_arr();
    if (s < 0) break;
    if (g_arr[s].stype == -1 || g_arr[s].stype == 2 || g_arr[s].is_part) continue;
    if (g_arr[s].ndim == 0) {
      /* an array of ndim 0 cannot be saved (the format reads ndim 0 as an
         empty array): refused before anything is written */
      hs[n] = g_arr[s].h;
      MUST_FAIL(MXNDArraySave(path, (uint32_t)n + 1, hs, NULL));
      continue;
    }
    hs[n] = g_arr[s].h;
    src[n] = s;
    snprintf(namebuf[n], sizeof namebuf[n], chance(20) ? "\xff%d" : "arg:%d", n);
    names[n] = namebuf[n];
    n++;
  }
  bool with_names = chance(60);
  int defect = chance(30) ? 1 + rn(5) : 0;
  if (defect) {
    switch (defect) {
      case 1:
        if (n == 0) return;
        hs[rn(n)] = bad_nd_handle(false);
        MUST_FAIL(MXNDArraySave(path, (uint32_t)n, hs, with_names ? names : NULL));
        return;
      case 2: MUST_FAIL(MXNDArraySave(NULL, (uint32_t)n, hs, NULL)); return;
      case 3: {
        /* a CreateNone array */
        NDArrayHandle none;
        MUST_OK(MXNDArrayCreateNone(&none));
        hs[n] = none;
        MUST_FAIL(MXNDArraySave(path, (uint32_t)n + 1, hs, NULL));
        MUST_OK(MXNDArrayFree(none));
        return;
      }
      case 4: {
        uint32_t sz, nn;
        NDArrayHandle *arr;
        const char **nm;
        char missing[300];
        snprintf(missing, sizeof missing, "%s/no-such-dir/x.params", g_tmpdir);
        MUST_FAIL(MXNDArrayLoad(missing, &sz, &arr, &nn, &nm));
        MUST_FAIL(MXNDArraySave(missing, (uint32_t)n, hs, NULL));
        return;
      }
      default:
        if (n == 0) return;
        MUST_FAIL(MXNDArraySave(path, (uint32_t)n, NULL, NULL));
        return;
    }
  }
  TRACE("save %d arrays (names %d)", n, with_names);
  MUST_OK(MXNDArraySave(path, (uint32_t)n, hs, with_names ? names : NULL));
  uint32_t sz = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **nm = NULL;
  if (chance(50)) {
    MUST_OK(MXNDArrayLoad(path, &sz, &arr, &nn, &nm));
    if (sz != (uint32_t)n) FAIL("load: %u arrays, saved %d", sz, n);
    load_and_check(sz, arr, nn, nm, src, names, with_names);
    return;
  }
  size_t len;
  unsigned char *b = read_file(path, &len);
  int what = rn(4);
  if (what == 0) {
    MUST_OK(MXNDArrayLoadFromBuffer(b, len, &sz, &arr, &nn, &nm));
    if (sz != (uint32_t)n) FAIL("load from buffer: %u arrays, saved %d", sz, n);
    load_and_check(sz, arr, nn, nm, src, names, with_names);
  } else if (what == 1 && len > 0) {
    /* truncated */
    size_t cut = (size_t)rn((int)len);
    TRACE("load truncated %zu of %zu", cut, len);
    MUST_FAIL(MXNDArrayLoadFromBuffer(b, cut, &sz, &arr, &nn, &nm));
    /* and a truncated file */
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, cut, f);
    fclose(f);
    MUST_FAIL(MXNDArrayLoad(path, &sz, &arr, &nn, &nm));
  } else if (what == 2 && len > 0) {
    /* corrupt bytes: 0 or -1 */
    for (int i = 0; i < 1 + rn(4); i++) b[rn((int)len)] ^= (unsigned char)(1 + rn(255));
    TRACE("load corrupt");
    if (ANY(MXNDArrayLoadFromBuffer(b, len, &sz, &arr, &nn, &nm)) == 0) free_loaded(sz, arr);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len, f);
    fclose(f);
    if (ANY(MXNDArrayLoad(path, &sz, &arr, &nn, &nm)) == 0) free_loaded(sz, arr);
  } else {
    MUST_FAIL(MXNDArrayLoadFromBuffer(NULL, len, &sz, &arr, &nn, &nm));
    MUST_FAIL(MXNDArrayLoadFromBuffer(b, len, NULL, &arr, &nn, &nm));
  }
  free(b);
}

/* Loads of mutated .params bytes: bit flips, extreme integers at random
   offsets, inserted and deleted bytes. 0 or -1; what loads must be usable
   (getters, a copy to CPU, a save) and freed. */
static void op_load_mutated(void) {
  g_what = "load mutated";
  NDArrayHandle hs[8];
  const char *names[8];
  char namebuf[8][16];
  int n = 0;
  for (int i = 0; i < 1 + rn(6); i++) {
    int s = pick_live_arr();
    if (s < 0) break;
    if (g_arr[s].stype == -1 || g_arr[s].is_part) continue;
    hs[n] = g_arr[s].h;
    snprintf(namebuf[n], sizeof namebuf[n], "n%d", n);
    names[n] = namebuf[n];
    n++;
  }
  char path[300];
  snprintf(path, sizeof path, "%s/m.params", g_tmpdir);
  if (MXNDArraySave(path, (uint32_t)n, hs, chance(50) ? names : NULL) != 0) {
    check_err_text("MXNDArraySave");
    return;
  }
  size_t len;
  unsigned char *b = read_file(path, &len);
  size_t cap = len + 64;
  b = realloc(b, cap);
  int muts = 1 + rn(4);
  for (int m = 0; m < muts && len > 0; m++) {
    size_t at = (size_t)rn((int)len);
    switch (rn(5)) {
      case 0: b[at] ^= (unsigned char)(1u << rn(8)); break;
      case 1: {
        static const uint64_t ext[] = {0, 1, 0xffffffffull, 0x7fffffffull, 0x80000000ull, UINT64_MAX,
                                       (uint64_t)INT64_MAX, 0x100000000ull, 2, 3, 0xF993FAC9ull, 0x112};
        uint64_t x = ext[rn(12)];
        size_t w = chance(50) ? 4 : 8;
        at &= ~(size_t)3;
        if (at + w <= len) memcpy(b + at, &x, w);
        break;
      }
      case 2:
        if (len + 4 < cap) {
          memmove(b + at + 4, b + at, len - at);
          for (int k = 0; k < 4; k++) b[at + k] = (unsigned char)rn(256);
          len += 4;
        }
        break;
      case 3: {
        size_t d = 1 + (size_t)rn(8);
        if (at + d <= len) {
          memmove(b + at, b + at + d, len - at - d);
          len -= d;
        }
        break;
      }
      default: len = at; break;
    }
  }
  uint32_t sz = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **nm = NULL;
  int rc = ANY(MXNDArrayLoadFromBuffer(b, len, &sz, &arr, &nn, &nm));
  free(b);
  if (rc != 0) return;
  if (sz > 64) FAIL("a mutated buffer of %zu bytes loaded %u arrays", len, sz);
  NDArrayHandle got[64];
  memcpy(got, arr, sz * sizeof(NDArrayHandle));
  for (uint32_t i = 0; i < nn; i++)
    if (nm[i] == NULL) FAIL("load: name %u is NULL", i);
  for (uint32_t i = 0; i < sz; i++) {
    int dt, st, devt, devid, nd;
    const int64_t *sh;
    MUST_OK(MXNDArrayGetDType(got[i], &dt));
    MUST_OK(MXNDArrayGetStorageType(got[i], &st));
    MUST_OK(MXNDArrayGetContext(got[i], &devt, &devid));
    MUST_OK(MXNDArrayGetShapeEx64(got[i], &nd, &sh));
    size_t ne = 1;
    for (int d = 0; d < nd; d++) ne = sh[d] > 0 && ne < (1u << 20) ? ne * (size_t)sh[d] : (sh[d] == 0 ? 0 : ne);
    if (st == 0 && ne <= MAXEL) {
      unsigned char buf[MAXEL * 8];
      (void)ANY(MXNDArraySyncCopyToCPU(got[i], buf, ne));
    }
    if (st > 0) (void)ANY(MXNDArraySyncCheckFormat(got[i], true));
  }
  char p2[300];
  snprintf(p2, sizeof p2, "%s/m2.params", g_tmpdir);
  (void)ANY(MXNDArraySave(p2, sz, got, NULL));
  for (uint32_t i = 0; i < sz; i++) MUST_OK(MXNDArrayFree(got[i]));
}

/* ------------------------------------------------------------ the driver */

static void full_check(void) {
  /* every live array's metadata and contents; every store key's value */
  for (int i = 0; i < NARR; i++)
    if (g_arr[i].live && !g_arr[i].is_part) {
      check_meta(&g_arr[i]);
      check_contents(&g_arr[i]);
    }
  for (int si = 0; si < NSTORE; si++) {
    Store *s = &g_st[si];
    if (!s->live) continue;
    for (int k = 0; k < NKEYS; k++) {
      Key *key = &s->keys[k];
      if (!key->inited || key->wild || key->stype == 1) continue;
      int a = free_slot();
      if (a < 0) return;
      a = new_dense(key->ndim, key->shape, key->dtype, DEV_CPU, 0);
      PullArgs q;
      memset(&q, 0, sizeof q);
      keys_set(s, &q.k, 0, k);
      q.k.n = q.n = 1;
      q.outs[0] = g_arr[a].h;
      q.dst[0] = a;
      MUST_OK(call_pull(s->h, &q.k, q.outs, 1, s->str, 0));
      apply_pull(s, &q);
      free_arr(a);
    }
  }
}

static void run_seed(uint64_t seed, long ops) {
  g_seed = seed;
  g_rng = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < 8; i++) rnd();
  memset(g_arr, 0, sizeof g_arr);
  memset(g_st, 0, sizeof g_st);
  memset(g_dead_nd, 0, sizeof g_dead_nd);
  memset(g_dead_kv, 0, sizeof g_dead_kv);
  g_mt_e = 0;
  live_t start = live_now();
  for (g_op = 0; g_op < ops; g_op++) {
    atomic_fetch_add(&g_beat, 1);
    /* each operation draws from its own stream, so that skipping some
       (MXKV_FUZZ_KEEP, to minimise a failure) leaves the others' draws */
    g_rng = (seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(g_op + 1) * 0xD1B54A32D192ED03ull);
    if (g_rng == 0) g_rng = 1;
    for (int i = 0; i < 4; i++) rnd();
    if (g_keep != NULL && !g_keep[g_op]) continue;
    /* MXKVMTSeed / MXKVMTDraw: about 3% of the operations, picked by a hash
       of the operation's stream that does not draw from it (the other
       operations of a seed are as they were before these were added) */
    bool mt = (g_rng * 0x2545F4914F6CDD1Dull) >> 57 < 4;
    int r = rn(100);
    if (mt) op_mt();
    else if (r < 10) op_new_array();
    else if (r < 12) op_new_array_chaos();
    else if (r < 18) op_free_array();
    else if (r < 22) op_copy_from_cpu();
    else if (r < 26) op_copy_to_cpu();
    else if (r < 30) op_getters();
    else if (r < 32) op_parts();
    else if (r < 35) op_copy_nd();
    else if (r < 38) op_new_store();
    else if (r < 40) op_free_store();
    else if (r < 48) op_init();
    else if (r < 60) op_push();
    else if (r < 70) op_pull();
    else if (r < 75) op_pushpull();
    else if (r < 79) op_broadcast();
    else if (r < 82) op_rsp_pull();
    else if (r < 84) op_store_chaos();
    else if (r < 87) op_updater();
    else if (r < 89) op_compression();
    else if (r < 93) op_store_misc();
    else if (r < 96) op_global();
    else if (r < 98) op_save_load();
    else op_load_mutated();
    if (g_trace > 1) fprintf(stderr, "[%ld] = %s\n", g_op, g_what);
    if (g_op % 200 == 199) full_check();
  }
  g_what = "final check";
  full_check();
  g_what = "cleanup";
  for (int i = 0; i < NARR; i++)
    if (g_arr[i].live) free_arr(i);
  for (int i = 0; i < NSTORE; i++)
    if (g_st[i].live) {
      MUST_OK(MXKVStoreFree(g_st[i].h));
      g_st[i].live = false;
    }
  live_t now = live_now();
  if (now.kvstores != start.kvstores || now.ndarrays != start.ndarrays)
    FAIL("live handles after cleanup: %d stores, %d arrays; before %d, %d", now.kvstores, now.ndarrays,
         start.kvstores, start.ndarrays);
}

/* ------------------------------------------------------------- threads */

#define TPOOL 32
#define TSTORES 3
static _Atomic(uintptr_t) t_arr[TPOOL];
static _Atomic(uintptr_t) t_kv[TSTORES];
static UpdCtx t_upd[TSTORES];
static long t_ops;
static atomic_long t_progress;

/* Two stores nobody frees during a threaded run, where each thread owns
   four keys and checks its exact sums while the other threads hammer
   everything: 0 without an updater, 1 with the adding updater. */
static KVStoreHandle t_stable[2];
static UpdCtx t_stable_upd;
/* a counter: every thread pushes 1 (float64) to one key of a store whose
   updater adds; at the end the key holds the number of accepted pushes */
static KVStoreHandle t_counter;
static UpdCtx t_counter_upd;
static atomic_long t_counted;
#define TKEYS 4
#define TEL 4

typedef struct {
  uint64_t rng;
  int id;
  bool inited[2][TKEYS];
  double v[2][TKEYS][TEL];
  long checked;
} TState;

static uint64_t trnd(TState *t) {
  t->rng ^= t->rng >> 12;
  t->rng ^= t->rng << 25;
  t->rng ^= t->rng >> 27;
  return t->rng * 2685821657736338717ull;
}
static int trn(TState *t, int n) { return n <= 0 ? 0 : (int)(trnd(t) % (uint64_t)n); }

static void t_check(int rc, const char *what) {
  if (rc == 0) return;
  if (rc != -1) {
    fprintf(stderr, "test_capi_fuzz threads: %s returned %d\n", what, rc);
    exit(1);
  }
  const char *m = MXGetLastError();
  if (m == NULL || m[0] != 'M') {
    fprintf(stderr, "test_capi_fuzz threads: %s: error text \"%s\"\n", what, m ? m : "(NULL)");
    exit(1);
  }
}
#define TC(call) t_check((call), #call)

static NDArrayHandle t_any_arr(TState *t) { return (NDArrayHandle)atomic_load(&t_arr[trn(t, TPOOL)]); }

static void t_new_arr(TState *t) {
  uint32_t shape[2] = {2, 2};
  NDArrayHandle h = NULL;
  int kind = trn(t, 6);
  int rc;
  if (kind < 4 || kind == 5) {
    static const int dts[] = {DT_F32, DT_F32, DT_F64, DT_I32, DT_F16};
    /* kind 5: a scalar (ndim 0), which saves refuse */
    rc = MXNDArrayCreateEx(shape, kind == 5 ? 0 : 2, DEV_CPU, 0, 0, dts[trn(t, 5)], &h);
    if (rc == 0) {
      float v[4] = {1, 1, 1, 1};
      int dt;
      TC(MXNDArrayGetDType(h, &dt));
      if (dt == DT_F32) TC(MXNDArraySyncCopyFromCPU(h, v, kind == 5 ? 1 : 4));
    }
  } else {
    uint32_t ash[1] = {0}, andim[1] = {1};
    int at[1] = {DT_I64};
    rc = MXNDArrayCreateSparseEx(1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, at, andim, ash, &h);
  }
  TC(rc);
  if (rc != 0) return;
  uintptr_t old = atomic_exchange(&t_arr[trn(t, TPOOL)], (uintptr_t)h);
  if (old) TC(MXNDArrayFree((NDArrayHandle)old));
}

#define T_MUST(call)                                                                     \
  do {                                                                                   \
    int rc_ = (call);                                                                    \
    if (rc_ != 0) {                                                                      \
      fprintf(stderr, "test_capi_fuzz threads: seed %llu thread %d: %s returned %d: %s\n", \
              (unsigned long long)g_seed, t->id, #call, rc_, MXGetLastError());          \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* One operation on the thread's own keys of a stable store, checked. */
static void t_private(TState *t) {
  int si = trn(t, 2), j = trn(t, TKEYS);
  KVStoreHandle kv = t_stable[si];
  int key = 100 + t->id * TKEYS + j;
  uint32_t n = TEL;
  float buf[TEL];
  double *v = t->v[si][j];
  if (!t->inited[si][j]) {
    NDArrayHandle h;
    T_MUST(MXNDArrayCreateEx(&n, 1, DEV_CPU, 0, 0, DT_F32, &h));
    for (int e = 0; e < TEL; e++) v[e] = buf[e] = (float)trn(t, 4);
    T_MUST(MXNDArraySyncCopyFromCPU(h, buf, TEL));
    T_MUST(MXKVStoreInit(kv, 1, &key, &h));
    T_MUST(MXNDArrayFree(h));
    t->inited[si][j] = true;
    return;
  }
  int what = trn(t, 3);
  if (what < 2) {
    /* push 1-3 values (or pushpull) */
    int nv = 1 + trn(t, 3);
    NDArrayHandle hs[3];
    int ks[3] = {key, key, key};
    double sum[TEL] = {0};
    for (int i = 0; i < nv; i++) {
      T_MUST(MXNDArrayCreateEx(&n, 1, trn(t, 2) ? DEV_CPU : DEV_CPU_PINNED, trn(t, 2), 0, DT_F32, &hs[i]));
      for (int e = 0; e < TEL; e++) {
        buf[e] = (float)trn(t, 4);
        sum[e] += buf[e];
      }
      T_MUST(MXNDArraySyncCopyFromCPU(hs[i], buf, TEL));
    }
    if (what == 0) {
      T_MUST(MXKVStorePush(kv, (uint32_t)nv, ks, hs, trn(t, 3)));
    } else {
      T_MUST(MXKVStorePushPull(kv, (uint32_t)nv, ks, 1, &key, hs, hs, 0));
    }
    for (int e = 0; e < TEL; e++) v[e] = upd_model(si == 0 ? 0 : 1, v[e], sum[e]);
    if (what == 1) {
      /* the first value is the output */
      T_MUST(MXNDArraySyncCopyToCPU(hs[0], buf, TEL));
      for (int e = 0; e < TEL; e++)
        if (buf[e] != (float)v[e]) {
          fprintf(stderr, "test_capi_fuzz threads: seed %llu thread %d: pushpull of key %d on store %d: "
                  "element %d is %g, expected %g\n", (unsigned long long)g_seed, t->id, key, si, e,
                  (double)buf[e], v[e]);
          exit(1);
        }
      t->checked++;
    }
    for (int i = 0; i < nv; i++) T_MUST(MXNDArrayFree(hs[i]));
    return;
  }
  NDArrayHandle o;
  T_MUST(MXNDArrayCreateEx(&n, 1, DEV_CPU, 0, 0, DT_F32, &o));
  T_MUST(MXKVStorePull(kv, 1, &key, &o, 0));
  T_MUST(MXNDArraySyncCopyToCPU(o, buf, TEL));
  T_MUST(MXNDArrayFree(o));
  for (int e = 0; e < TEL; e++)
    if (buf[e] != (float)v[e]) {
      fprintf(stderr, "test_capi_fuzz threads: seed %llu thread %d: pull of key %d on store %d: element "
              "%d is %g, expected %g\n", (unsigned long long)g_seed, t->id, key, si, e, (double)buf[e], v[e]);
      exit(1);
    }
  t->checked++;
}

static void t_count(TState *t) {
  int key = 9;
  uint32_t n = 1;
  int nv = 1 + trn(t, 3);
  NDArrayHandle hs[3];
  int ks[3] = {key, key, key};
  double one = 1;
  for (int i = 0; i < nv; i++) {
    T_MUST(MXNDArrayCreateEx(&n, 1, DEV_CPU, 0, 0, DT_F64, &hs[i]));
    T_MUST(MXNDArraySyncCopyFromCPU(hs[i], &one, 1));
  }
  T_MUST(MXKVStorePush(t_counter, (uint32_t)nv, ks, hs, 0));
  atomic_fetch_add(&t_counted, nv);
  for (int i = 0; i < nv; i++) T_MUST(MXNDArrayFree(hs[i]));
}

/* MXKVMTSeed + MXKVMTDraw from every thread at once, each on its own
   engines: the same numbers and states as one thread drew before the run
   (the draws share rayon's pool); and a refused call writes nothing. */
#define T_MT_E 4
#define T_MT_NUM 300
static const int T_MT_KD[5][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 6}};
static uint32_t t_mt_base;
static unsigned char t_mt_out[5][T_MT_NUM * 8];
static uint32_t t_mt_keys[5][T_MT_E * MT_N];
static int64_t t_mt_pos[5][T_MT_E];

static void t_mt_reference(void) {
  for (int c = 0; c < 5; c++) {
    MUST_OK(MXKVMTSeed(t_mt_base, t_mt_keys[c], t_mt_pos[c], T_MT_E));
    MUST_OK(MXKVMTDraw(T_MT_KD[c][0], T_MT_KD[c][1], t_mt_keys[c], t_mt_pos[c], T_MT_E, T_MT_NUM, t_mt_out[c]));
  }
}

static void t_mt(TState *t) {
  static _Thread_local uint32_t keys[T_MT_E * MT_N];
  static _Thread_local int64_t pos[T_MT_E];
  static _Thread_local unsigned char out[T_MT_NUM * 8];
  int c = trn(t, 5);
  T_MUST(MXKVMTSeed(t_mt_base, keys, pos, T_MT_E));
  T_MUST(MXKVMTDraw(T_MT_KD[c][0], T_MT_KD[c][1], keys, pos, T_MT_E, T_MT_NUM, out));
  size_t ob = T_MT_NUM * (T_MT_KD[c][0] == 2 || T_MT_KD[c][1] == 1 ? 8 : 4);
  if (memcmp(out, t_mt_out[c], ob) != 0 || memcmp(keys, t_mt_keys[c], sizeof keys) != 0 ||
      memcmp(pos, t_mt_pos[c], sizeof pos) != 0) {
    fprintf(stderr, "test_capi_fuzz threads: seed %llu thread %d: MTDraw kind %d dtype %d differs from the "
            "same draw before the threads\n", (unsigned long long)g_seed, t->id, T_MT_KD[c][0], T_MT_KD[c][1]);
    exit(1);
  }
  t->checked += T_MT_NUM;
  /* one defect: a position past 624, a kind, or an int32 randint */
  int64_t p0 = pos[T_MT_E - 1];
  int defect = trn(t, 3);
  if (defect == 0) pos[T_MT_E - 1] = MT_N + 1;
  unsigned char before[T_MT_NUM * 8];
  memcpy(before, out, sizeof out);
  int rc = MXKVMTDraw(defect == 1 ? 3 : 2, defect == 2 ? 4 : 6, keys, pos, T_MT_E, 10, out);
  const char *m = rc == -1 ? MXGetLastError() : NULL;
  if (rc != -1 || m == NULL || strncmp(m, "MXKVMTDraw", 10) != 0 || memcmp(before, out, sizeof out) != 0 ||
      memcmp(keys, t_mt_keys[c], sizeof keys) != 0) {
    fprintf(stderr, "test_capi_fuzz threads: seed %llu thread %d: MTDraw with defect %d returned %d (%s) or wrote\n",
            (unsigned long long)g_seed, t->id, defect, rc, m ? m : "");
    exit(1);
  }
  pos[T_MT_E - 1] = p0;
}

static void *t_main(void *arg) {
  TState *t = arg;
  for (long i = 0; i < t_ops; i++) {
    atomic_fetch_add(&t_progress, 1);
    if (trn(t, 100) < 5) {
      t_count(t);
      continue;
    }
    if (trn(t, 100) < 3) {
      t_mt(t);
      continue;
    }
    if (trn(t, 100) < 25) {
      t_private(t);
      continue;
    }
    int r = trn(t, 100);
    int key = trn(t, 4);
    char sk[8];
    snprintf(sk, sizeof sk, "s%d", key);
    const char *skp = sk;
    KVStoreHandle kv = (KVStoreHandle)atomic_load(&t_kv[trn(t, TSTORES)]);
    if (r >= 30 && r < 70 && trn(t, 5) == 0) kv = t_stable[trn(t, 2)];
    if (r < 15) {
      t_new_arr(t);
    } else if (r < 22) {
      /* free a pooled array (the slot keeps the stale handle sometimes) */
      int s = trn(t, TPOOL);
      uintptr_t old = trn(t, 3) ? atomic_exchange(&t_arr[s], 0) : atomic_load(&t_arr[s]);
      if (old) TC(MXNDArrayFree((NDArrayHandle)old));
    } else if (r < 30) {
      NDArrayHandle h = t_any_arr(t);
      int dt, st, devt, devid;
      uint32_t nd;
      const uint32_t *sh;
      TC(MXNDArrayGetDType(h, &dt));
      TC(MXNDArrayGetStorageType(h, &st));
      TC(MXNDArrayGetContext(h, &devt, &devid));
      int rc = MXNDArrayGetShape(h, &nd, &sh);
      TC(rc);
      if (rc == 0 && nd == 2 && sh[0] * sh[1] == 4) {
        uint64_t buf[4]; /* 4 elements of up to 8 bytes */
        TC(MXNDArraySyncCopyToCPU(h, buf, 4));
        TC(MXNDArraySyncCopyFromCPU(h, buf, 4));
      }
    } else if (r < 40) {
      NDArrayHandle v[3] = {t_any_arr(t), t_any_arr(t), t_any_arr(t)};
      int ks[3] = {key, key, trn(t, 4)};
      const char *sks[3] = {skp, skp, skp};
      int n = 1 + trn(t, 3);
      if (trn(t, 2)) TC(MXKVStorePush(kv, (uint32_t)n, ks, v, 0));
      else TC(MXKVStorePushEx(kv, (uint32_t)n, sks, v, 0));
    } else if (r < 52) {
      NDArrayHandle v[2] = {t_any_arr(t), t_any_arr(t)};
      int ks[2] = {key, trn(t, 4)};
      const char *sks[2] = {skp, skp};
      if (trn(t, 2)) TC(MXKVStorePull(kv, 1 + (uint32_t)trn(t, 2), ks, v, 0));
      else TC(MXKVStorePullEx(kv, 1 + (uint32_t)trn(t, 2), sks, v, 0));
    } else if (r < 60) {
      NDArrayHandle v = t_any_arr(t);
      if (trn(t, 2)) TC(MXKVStoreInit(kv, 1, &key, &v));
      else TC(MXKVStoreInitEx(kv, 1, &skp, &v));
    } else if (r < 66) {
      NDArrayHandle v = t_any_arr(t), o = t_any_arr(t);
      if (trn(t, 2)) TC(MXKVStorePushPull(kv, 1, &key, 1, &key, &v, &o, 0));
      else TC(MXKVStoreBroadcast(kv, 1, &key, 1, &key, &v, &o, 0));
    } else if (r < 70) {
      NDArrayHandle o = t_any_arr(t), rows = t_any_arr(t);
      TC(MXKVStorePullRowSparse(kv, 1, &key, &o, &rows, 0));
    } else if (r < 75) {
      UpdCtx *c = &t_upd[trn(t, TSTORES)];
      if (trn(t, 2)) TC(MXKVStoreSetUpdater(kv, fuzz_updater, c));
      else TC(MXKVStoreSetUpdaterEx(kv, fuzz_updater, fuzz_str_updater, c));
    } else if (r < 79) {
      /* replace a store */
      int s = trn(t, TSTORES);
      KVStoreHandle h = NULL;
      TC(MXKVStoreCreate(LOCAL_TYPES[trn(t, 5)], &h));
      uintptr_t old = atomic_exchange(&t_kv[s], (uintptr_t)h);
      if (old) TC(MXKVStoreFree((KVStoreHandle)old));
      else if (trn(t, 2)) TC(MXKVStoreFree((KVStoreHandle)atomic_load(&t_kv[trn(t, TSTORES)])));
    } else if (r < 82) {
      const char *k[2] = {"type", "threshold"}, *v[2] = {"2bit", "0.5"};
      TC(MXKVStoreSetGradientCompression(kv, 2, k, v));
    } else if (r < 86) {
      NDArrayHandle d = t_any_arr(t), s = t_any_arr(t);
      TC(MXNDArraySyncCopyFromNDArray(d, s, trn(t, 3) - 1));
    } else if (r < 90) {
      NDArrayHandle h = t_any_arr(t), o = NULL;
      if (MXNDArrayGetDataNDArray(h, &o) == 0) TC(MXNDArrayFree(o));
      if (MXNDArrayGetAuxNDArray(h, 0, &o) == 0) TC(MXNDArrayFree(o));
    } else if (r < 94) {
      NDArrayHandle hs[2] = {t_any_arr(t), t_any_arr(t)};
      char path[300];
      snprintf(path, sizeof path, "%s/t%d.params", g_tmpdir, t->id);
      if (MXNDArraySave(path, 2, hs, NULL) == 0) {
        uint32_t n, nn;
        NDArrayHandle *arr;
        const char **nm;
        if (MXNDArrayLoad(path, &n, &arr, &nn, &nm) == 0) {
          NDArrayHandle got[2];
          if (n != 2) {
            fprintf(stderr, "threads: load of 2 arrays gave %u\n", n);
            exit(1);
          }
          memcpy(got, arr, sizeof got);
          TC(MXNDArrayFree(got[0]));
          TC(MXNDArrayFree(got[1]));
        } else {
          t_check(-1, "MXNDArrayLoad");
        }
      } else {
        t_check(-1, "MXNDArraySave");
      }
    } else {
      const char *ty;
      int rk;
      TC(MXKVStoreGetType(kv, &ty));
      TC(MXKVStoreGetRank(kv, &rk));
      TC(MXKVStoreBarrier(kv));
      TC(MXNDArrayWaitAll());
    }
  }
  return NULL;
}

static void run_threads(uint64_t seed, int nthreads, long ops) {
  g_seed = seed;
  g_what = "threads";
  live_t start = live_now();
  for (int i = 0; i < TPOOL; i++) atomic_store(&t_arr[i], 0);
  for (int i = 0; i < TSTORES; i++) {
    KVStoreHandle h;
    MUST_OK(MXKVStoreCreate(LOCAL_TYPES[i % 5], &h));
    atomic_store(&t_kv[i], (uintptr_t)h);
    t_upd[i].mode = 1 + i % 3;
    t_upd[i].nested = i == 0;
    t_upd[i].kv = NULL;
  }
  t_ops = ops;
  static KVStoreHandle side;
  MUST_OK(MXKVStoreCreate(seed % 3 ? "local" : "device", &side));
  {
    int ks[4] = {0, 1, 2, 3};
    uint32_t sh[2] = {2, 2};
    NDArrayHandle h[4];
    for (int i = 0; i < 4; i++) MUST_OK(MXNDArrayCreateEx(sh, 2, DEV_CPU, 0, 0, DT_F32, &h[i]));
    MUST_OK(MXKVStoreInit(side, 4, ks, h));
    for (int i = 0; i < 4; i++) MUST_OK(MXNDArrayFree(h[i]));
  }
  for (int i = 0; i < TSTORES; i++) t_upd[i].side = i == 0 ? side : NULL;
  t_stable_upd.side = side;
  MUST_OK(MXKVStoreCreate("local", &t_stable[0]));
  MUST_OK(MXKVStoreCreate(seed % 2 ? "device" : "local", &t_stable[1]));
  t_stable_upd.mode = 1;
  t_stable_upd.nested = true;
  t_stable_upd.kv = t_stable[1];
  MUST_OK(MXKVStoreSetUpdater(t_stable[1], fuzz_updater, &t_stable_upd));
  /* fix their key type: int */
  {
    int k0 = 0;
    uint32_t two = 2;
    NDArrayHandle h;
    MUST_OK(MXNDArrayCreateEx(&two, 1, DEV_CPU, 0, 0, DT_F32, &h));
    MUST_OK(MXKVStoreInit(t_stable[0], 1, &k0, &h));
    MUST_OK(MXKVStoreInit(t_stable[1], 1, &k0, &h));
    MUST_OK(MXNDArrayFree(h));
  }
  MUST_OK(MXKVStoreCreate(seed % 2 ? "local" : "device", &t_counter));
  t_counter_upd.mode = 4;
  t_counter_upd.nested = false;
  MUST_OK(MXKVStoreSetUpdater(t_counter, fuzz_updater, &t_counter_upd));
  {
    int k9 = 9;
    uint32_t one = 1;
    NDArrayHandle h;
    MUST_OK(MXNDArrayCreateEx(&one, 1, DEV_CPU, 0, 0, DT_F64, &h));
    MUST_OK(MXKVStoreInit(t_counter, 1, &k9, &h));
    MUST_OK(MXNDArrayFree(h));
  }
  atomic_store(&t_counted, 0);
  t_mt_base = (uint32_t)(seed * 2654435761u);
  t_mt_reference();
  static pthread_t th[16];
  static TState ts[16];
  if (nthreads > 16) nthreads = 16;
  for (int i = 0; i < nthreads; i++) {
    memset(&ts[i], 0, sizeof ts[i]);
    ts[i].rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 7919 + 3;
    ts[i].id = i;
    if (pthread_create(&th[i], NULL, t_main, &ts[i]) != 0) FAIL("pthread_create");
  }
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  long checked = 0;
  for (int i = 0; i < nthreads; i++) checked += ts[i].checked;
  g_n_checked += checked;
  MUST_OK(MXKVStoreFree(t_stable[0]));
  MUST_OK(MXKVStoreFree(t_stable[1]));
  MUST_OK(MXKVStoreFree(side));
  {
    int k9 = 9;
    uint32_t one = 1;
    NDArrayHandle h;
    double got = -1;
    MUST_OK(MXNDArrayCreateEx(&one, 1, DEV_CPU, 0, 0, DT_F64, &h));
    MUST_OK(MXKVStorePull(t_counter, 1, &k9, &h, 0));
    MUST_OK(MXNDArraySyncCopyToCPU(h, &got, 1));
    MUST_OK(MXNDArrayFree(h));
    /* several values of one push are summed first: one update per push */
    if (got != (double)atomic_load(&t_counted))
      FAIL("threads: the counter key holds %g after %ld pushed ones", got, atomic_load(&t_counted));
    MUST_OK(MXKVStoreFree(t_counter));
  }
  for (int i = 0; i < TPOOL; i++) {
    uintptr_t h = atomic_exchange(&t_arr[i], 0);
    if (h) (void)MXNDArrayFree((NDArrayHandle)h); /* may be stale (freed, slot kept) */
  }
  for (int i = 0; i < TSTORES; i++) {
    uintptr_t h = atomic_exchange(&t_kv[i], 0);
    if (h) (void)MXKVStoreFree((KVStoreHandle)h);
  }
  live_t now = live_now();
  if (now.kvstores != start.kvstores || now.ndarrays != start.ndarrays)
    FAIL("threads: live handles after cleanup: %d stores, %d arrays; before %d, %d", now.kvstores,
         now.ndarrays, start.kvstores, start.ndarrays);
}

/* ------------------------------------------------------------ watchdog */

static int g_hang_s = 120;

static void *watchdog(void *arg) {
  (void)arg;
  long last = -1;
  int still = 0;
  for (;;) {
    sleep(1);
    long now = atomic_load(&g_beat) + atomic_load(&t_progress);
    if (now == last) {
      if (++still >= g_hang_s) {
        fprintf(stderr, "test_capi_fuzz: seed %llu: no progress for %d s at op %ld (%s): hang\n",
                (unsigned long long)g_seed, g_hang_s, g_op, g_what);
        _exit(3);
      }
    } else {
      still = 0;
      last = now;
    }
  }
  return NULL;
}

static void tick(void) { atomic_fetch_add(&g_beat, 1); }

int main(int argc, char **argv) {
  const char *tr = getenv("MXKV_FUZZ_TRACE");
  g_trace = tr && tr[0] && tr[0] != '0' ? atoi(tr) > 1 ? 2 : 1 : 0;
  const char *keep = getenv("MXKV_FUZZ_KEEP");
  if (keep != NULL && argc >= 3) {
    /* a file of operation numbers, one a line */
    long ops = atol(argv[2]);
    g_keep = calloc((size_t)ops + 1, 1);
    FILE *f = fopen(keep, "r");
    long i;
    while (f != NULL && fscanf(f, "%ld", &i) == 1)
      if (i >= 0 && i < ops) g_keep[i] = 1;
    if (f != NULL) fclose(f);
  }
  const char *hs = getenv("MXKV_FUZZ_HANG_S");
  if (hs) g_hang_s = atoi(hs);
  const char *td = getenv("TMPDIR");
  snprintf(g_tmpdir, sizeof g_tmpdir, "%s/mxkv_fuzz_XXXXXX", td && td[0] ? td : "/tmp");
  if (mkdtemp(g_tmpdir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  pthread_t wd;
  pthread_create(&wd, NULL, watchdog, NULL);
  pthread_detach(wd);

  struct {
    uint64_t seed;
    long ops;
    int threads;
    long tops;
  } runs[8];
  int nruns = 0;
  if (argc >= 3) {
    runs[0].seed = strtoull(argv[1], NULL, 0);
    runs[0].ops = atol(argv[2]);
    runs[0].threads = argc >= 4 ? atoi(argv[3]) : 0;
    runs[0].tops = argc >= 5 ? atol(argv[4]) : 2000;
    nruns = 1;
  } else {
    /* the bounded CI run (about 1 s; 2 s under ASan, 20 s under valgrind) */
    static const uint64_t seeds[] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) {
      runs[i].seed = seeds[i];
      runs[i].ops = 2000;
      runs[i].threads = i % 2 == 0 ? 4 : 0;
      runs[i].tops = 1500;
    }
    nruns = 4;
  }
  for (int i = 0; i < nruns; i++) {
    if (runs[i].ops > 0) {
      /* progress for the watchdog: one beat per op via g_op */
      run_seed(runs[i].seed, runs[i].ops);
      tick();
    }
    if (runs[i].threads > 0) {
      run_threads(runs[i].seed, runs[i].threads, runs[i].tops);
      tick();
    }
    printf("seed %llu: %ld ops (%ld of them MT draws; calls: %ld must succeed, %ld must fail, %ld either; "
           "%ld elements checked), %d threads x %ld ops: ok\n",
           (unsigned long long)runs[i].seed, runs[i].ops, g_n_mt, g_n_ok, g_n_fail, g_n_any, g_n_checked,
           runs[i].threads, runs[i].threads ? runs[i].tops : 0L);
    g_n_ok = g_n_fail = g_n_any = g_n_checked = g_n_mt = 0;
  }
  /* remove the temporary files */
  char cmd[400];
  for (int i = 0; i < 3; i++) {
    snprintf(cmd, sizeof cmd, "%s/f%d.params", g_tmpdir, i);
    unlink(cmd);
  }
  snprintf(cmd, sizeof cmd, "%s/m.params", g_tmpdir);
  unlink(cmd);
  snprintf(cmd, sizeof cmd, "%s/m2.params", g_tmpdir);
  unlink(cmd);
  for (int i = 0; i < 16; i++) {
    snprintf(cmd, sizeof cmd, "%s/t%d.params", g_tmpdir, i);
    unlink(cmd);
  }
  rmdir(g_tmpdir);
  printf("test_capi_fuzz: ok\n");
  return 0;
}
