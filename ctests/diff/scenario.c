/*
 * Differential scenario program for libmxkv.
 *
 *   scenario LIBRARY.so [FILTER]
 *
 * dlopens LIBRARY (MXNet 1.9.1's libmxnet.so or our libmxkv.so), drives only
 * its C API, and prints one deterministic fact per line, prefixed by the
 * scenario's name. Run it against both libraries and diff the outputs; see
 * README.md in this directory. With FILTER only the scenarios whose name
 * contains FILTER run.
 *
 * Output rules: no pointers, handles, timings or raw error texts. A failed
 * call prints `rc=-1 has("<substring>")=0/1` for one substring of MXNet's
 * message. Floats are printed as their bits in hex, integers in decimal.
 * Lines whose difference between the two libraries is intended start with a
 * distinct prefix:
 *   partial:  the state left behind by a failed call (MXNet applies Init,
 *             Broadcast, PushPull and Save partially; libmxkv's Init is
 *             all-or-nothing);
 *   deviate:  an error MXNet reports with other wording where libmxkv
 *             deliberately reports "key N has not been inited";
 *   dtype-extra/, pull-cast-extra/: dtype codes 8-11, which MXNet 1.9.1 cannot
 *             create at all.
 *
 * Set SCENARIO_DEBUG=1 to get the raw error messages on stderr, and
 * SCENARIO_TMP to choose the directory for the .params files (default /tmp).
 *
 * Build: gcc -std=c11 -Wall -Wextra -Werror -O1 scenario.c -o scenario -ldl
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------
 * The C API, resolved with dlsym. Signatures exactly as MXNet 1.9.1's c_api.h.
 * ------------------------------------------------------------------------- */

typedef void *NDArrayHandle;
typedef void *KVStoreHandle;
typedef uint32_t mx_uint;
typedef void(MXKVStoreUpdater)(int key, NDArrayHandle recv, NDArrayHandle local, void *handle);
typedef void(MXKVStoreStrUpdater)(const char *key, NDArrayHandle recv, NDArrayHandle local,
                                  void *handle);
typedef void(MXKVStoreServerController)(int head, const char *body, void *controller_handle);

#define API_LIST(X)                                                                           \
  X(const char *, MXGetLastError, (void))                                                     \
  X(int, MXGetVersion, (int *out))                                                            \
  X(int, MXNDArrayCreateNone, (NDArrayHandle * out))                                          \
  X(int, MXNDArrayCreateEx,                                                                   \
    (const uint32_t *shape, uint32_t ndim, int dev_type, int dev_id, int delay_alloc,         \
     int dtype, NDArrayHandle *out))                                                          \
  X(int, MXNDArraySyncCopyFromCPU, (NDArrayHandle handle, const void *data, size_t size))     \
  X(int, MXNDArraySyncCopyToCPU, (NDArrayHandle handle, void *data, size_t size))             \
  X(int, MXNDArrayGetShapeEx, (NDArrayHandle handle, int *out_dim, const int **out_pdata))    \
  X(int, MXNDArrayGetDType, (NDArrayHandle handle, int *out_dtype))                           \
  X(int, MXNDArrayGetContext, (NDArrayHandle handle, int *out_dev_type, int *out_dev_id))     \
  X(int, MXNDArrayGetStorageType, (NDArrayHandle handle, int *out_storage_type))              \
  X(int, MXNDArrayWaitAll, (void))                                                            \
  X(int, MXNDArrayWaitToRead, (NDArrayHandle handle))                                         \
  X(int, MXNDArraySave,                                                                       \
    (const char *fname, uint32_t num_args, NDArrayHandle *args, const char **keys))           \
  X(int, MXNDArrayLoad,                                                                       \
    (const char *fname, uint32_t *out_size, NDArrayHandle **out_arr, uint32_t *out_name_size, \
     const char ***out_names))                                                                \
  X(int, MXNDArrayFree, (NDArrayHandle handle))                                               \
  X(int, MXKVStoreCreate, (const char *type, KVStoreHandle *out))                             \
  X(int, MXKVStoreFree, (KVStoreHandle handle))                                               \
  X(int, MXKVStoreGetType, (KVStoreHandle handle, const char **type))                         \
  X(int, MXKVStoreInit,                                                                       \
    (KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals))               \
  X(int, MXKVStoreInitEx,                                                                     \
    (KVStoreHandle handle, uint32_t num, const char **keys, NDArrayHandle *vals))             \
  X(int, MXKVStorePush,                                                                       \
    (KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals, int priority)) \
  X(int, MXKVStorePushEx,                                                                     \
    (KVStoreHandle handle, uint32_t num, const char **keys, NDArrayHandle *vals,              \
     int priority))                                                                           \
  X(int, MXKVStorePull,                                                                       \
    (KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals, int priority)) \
  X(int, MXKVStorePullEx,                                                                     \
    (KVStoreHandle handle, uint32_t num, const char **keys, NDArrayHandle *vals,              \
     int priority))                                                                           \
  X(int, MXKVStorePullWithSparse,                                                             \
    (KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals, int priority,  \
     bool ignore_sparse))                                                                     \
  X(int, MXKVStorePullWithSparseEx,                                                           \
    (KVStoreHandle handle, uint32_t num, const char **keys, NDArrayHandle *vals,              \
     int priority, bool ignore_sparse))                                                       \
  X(int, MXKVStorePullRowSparse,                                                              \
    (KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals,                \
     const NDArrayHandle *row_ids, int priority))                                             \
  X(int, MXKVStorePushPull,                                                                   \
    (KVStoreHandle handle, mx_uint vnum, const int *vkeys, mx_uint onum, const int *okeys,    \
     NDArrayHandle *vals, NDArrayHandle *outs, int priority))                                 \
  X(int, MXKVStorePushPullEx,                                                                 \
    (KVStoreHandle handle, mx_uint vnum, const char **vkeys, mx_uint onum,                    \
     const char **okeys, NDArrayHandle *vals, NDArrayHandle *outs, int priority))             \
  X(int, MXKVStoreBroadcast,                                                                  \
    (KVStoreHandle handle, mx_uint vnum, const int *vkeys, mx_uint onum, const int *okeys,    \
     NDArrayHandle *vals, NDArrayHandle *outs, int priority))                                 \
  X(int, MXKVStoreBroadcastEx,                                                                \
    (KVStoreHandle handle, mx_uint vnum, const char **vkeys, mx_uint onum,                    \
     const char **okeys, NDArrayHandle *vals, NDArrayHandle *outs, int priority))             \
  X(int, MXKVStoreSetUpdater,                                                                 \
    (KVStoreHandle handle, MXKVStoreUpdater updater, void *updater_handle))                   \
  X(int, MXKVStoreSetUpdaterEx,                                                               \
    (KVStoreHandle handle, MXKVStoreUpdater updater, MXKVStoreStrUpdater str_updater,         \
     void *updater_handle))                                                                   \
  X(int, MXKVStoreGetRank, (KVStoreHandle handle, int *ret))                                  \
  X(int, MXKVStoreGetGroupSize, (KVStoreHandle handle, int *ret))                             \
  X(int, MXKVStoreIsWorkerNode, (int *ret))                                                   \
  X(int, MXKVStoreIsServerNode, (int *ret))                                                   \
  X(int, MXKVStoreIsSchedulerNode, (int *ret))                                                \
  X(int, MXKVStoreBarrier, (KVStoreHandle handle))                                            \
  X(int, MXKVStoreSetBarrierBeforeExit, (KVStoreHandle handle, const int barrier_before_exit)) \
  X(int, MXKVStoreRunServer,                                                                  \
    (KVStoreHandle handle, MXKVStoreServerController controller, void *controller_handle))    \
  X(int, MXKVStoreSendCommmandToServers,                                                      \
    (KVStoreHandle handle, int cmd_id, const char *cmd_body))                                 \
  X(int, MXKVStoreGetNumDeadNode,                                                             \
    (KVStoreHandle handle, const int node_id, int *number, const int timeout_sec))

#define DECLARE_API(ret, name, args) \
  typedef ret(*name##_fn) args;      \
  static name##_fn name;
API_LIST(DECLARE_API)
#undef DECLARE_API

static int load_api(const char *path) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "scenario: cannot load %s: %s\n", path, dlerror());
    return 0;
  }
  int ok = 1;
#define RESOLVE_API(ret, name, args)                                 \
  {                                                                  \
    void *sym = dlsym(lib, #name);                                   \
    if (!sym) {                                                      \
      fprintf(stderr, "scenario: %s lacks symbol %s\n", path, #name); \
      ok = 0;                                                        \
    }                                                                \
    memcpy(&name, &sym, sizeof sym);                                 \
  }
  API_LIST(RESOLVE_API)
#undef RESOLVE_API
  /* The library is never closed: MXNet's engine threads live until exit. */
  return ok;
}

/* ---------------------------------------------------------------------------
 * Output helpers
 * ------------------------------------------------------------------------- */

static char g_scn[160]; /* name of the running scenario, prefix of every line */
static bool g_debug;

static void set_scn(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_scn, sizeof g_scn, fmt, ap);
  va_end(ap);
}

/* One fact: "<scenario>: <text>". */
static void say(const char *fmt, ...) {
  va_list ap;
  printf("%s: ", g_scn);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
}

/* A fact expected to differ by design: "<prefix>:<scenario>: <text>". */
static void say_as(const char *prefix, const char *fmt, ...) {
  va_list ap;
  printf("%s:%s: ", prefix, g_scn);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
}

/* Text for a return code: "rc=0", or "rc=-1 has("...")=1" checking the last
   error for one substring of MXNet's wording. */
static const char *rc_text(int rc, const char *expect) {
  static char buf[512];
  if (rc == 0) {
    snprintf(buf, sizeof buf, "rc=0");
    return buf;
  }
  const char *msg = MXGetLastError();
  if (g_debug) fprintf(stderr, "[%s] rc=%d: %s\n", g_scn, rc, msg ? msg : "(null)");
  if (expect) {
    snprintf(buf, sizeof buf, "rc=%d has(\"%s\")=%d", rc, expect,
             msg && strstr(msg, expect) ? 1 : 0);
  } else {
    snprintf(buf, sizeof buf, "rc=%d", rc);
  }
  return buf;
}

/* A call result, finished with MXNDArrayWaitAll so that errors raised inside
   queued work (threaded engine) count like errors raised at the call
   (NaiveEngine). */
static int settle(int rc) {
  int w = MXNDArrayWaitAll();
  if (w != 0 && g_debug) fprintf(stderr, "[%s] WaitAll: %s\n", g_scn, MXGetLastError());
  return rc != 0 ? rc : w;
}

static void report(const char *what, int rc, const char *expect) {
  say("%s: %s", what, rc_text(rc, expect));
}

/* A string as printable ASCII with \xHH escapes, quoted. */
static const char *quoted(const char *s) {
  static char buf[4][256];
  static int slot;
  char *out = buf[slot++ & 3];
  size_t n = 0;
  out[n++] = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p && n < 240; ++p) {
    if (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
      out[n++] = (char)*p;
    else
      n += (size_t)snprintf(out + n, 8, "\\x%02x", *p);
  }
  out[n++] = '"';
  out[n] = 0;
  return out;
}

/* ---------------------------------------------------------------------------
 * dtypes and element conversion
 * ------------------------------------------------------------------------- */

enum {
  F32 = 0, F64 = 1, F16 = 2, U8 = 3, I32 = 4, I8 = 5, I64 = 6, BOOL = 7,
  I16 = 8, U16 = 9, U32 = 10, U64 = 11, BF16 = 12
};

static size_t dtype_size(int dt) {
  switch (dt) {
    case F64: case I64: case U64: return 8;
    case F32: case I32: case U32: return 4;
    case F16: case BF16: case I16: case U16: return 2;
    default: return 1;
  }
}

static bool dtype_is_float(int dt) { return dt == F32 || dt == F64 || dt == F16 || dt == BF16; }
static bool dtype_is_signed(int dt) { return dt == I8 || dt == I16 || dt == I32 || dt == I64; }
static int dtype_bits(int dt) { return (int)dtype_size(dt) * 8; }
/* int16/uint16/uint32/uint64: in the header, but MXNet 1.9.1 refuses to create
   them ("Unknown type enum 8"); their lines carry their own prefix. */
static bool dtype_is_extra(int dt) { return dt >= I16 && dt <= U64; }

static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

/* float -> IEEE half, round to nearest even (used only to make inputs). */
static uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1))) ++h;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;
  return (uint16_t)(sign | h);
}

/* float -> bfloat16, round to nearest even (finite inputs only). */
static uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Store a float value as element i of a dtype buffer (float dtypes). */
static void put_float(int dt, void *buf, size_t i, double v) {
  unsigned char *p = (unsigned char *)buf + i * dtype_size(dt);
  switch (dt) {
    case F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case F64: memcpy(p, &v, 8); break;
    case F16: { uint16_t h = f32_to_f16((float)v); memcpy(p, &h, 2); break; }
    case BF16: { uint16_t h = f32_to_bf16((float)v); memcpy(p, &h, 2); break; }
    default: { long long n = (long long)v; memcpy(p, &n, dtype_size(dt)); break; } /* LE */
  }
}

/* Store raw integer bits (truncated to the dtype's width) as element i. */
static void put_bits(int dt, void *buf, size_t i, uint64_t v) {
  memcpy((unsigned char *)buf + i * dtype_size(dt), &v, dtype_size(dt)); /* little endian */
}

/* Element i as text: floats as hex bits, integers in decimal. */
static void fmt_elem(int dt, const void *buf, size_t i, char *out, size_t n) {
  const unsigned char *p = (const unsigned char *)buf + i * dtype_size(dt);
  uint64_t u = 0;
  memcpy(&u, p, dtype_size(dt));
  if (dtype_is_float(dt)) {
    snprintf(out, n, "%0*llx", (int)dtype_size(dt) * 2, (unsigned long long)u);
  } else if (dtype_is_signed(dt)) {
    int bits = dtype_bits(dt);
    int64_t s = bits == 64 ? (int64_t)u
                           : (int64_t)(u << (64 - bits)) >> (64 - bits); /* sign-extend */
    snprintf(out, n, "%lld", (long long)s);
  } else {
    snprintf(out, n, "%llu", (unsigned long long)u);
  }
}

/* ---------------------------------------------------------------------------
 * Arrays: creation, tracking (freed at the end of each scenario), printing
 * ------------------------------------------------------------------------- */

#define MAX_TRACKED 8192
static NDArrayHandle g_arrays[MAX_TRACKED];
static size_t g_narrays;

static void track(NDArrayHandle h) {
  if (g_narrays == MAX_TRACKED) {
    fprintf(stderr, "scenario: too many arrays\n");
    exit(3);
  }
  g_arrays[g_narrays++] = h;
}

static void free_arrays(void) {
  int w = MXNDArrayWaitAll();
  if (w != 0) say("cleanup: waitall %s", rc_text(w, NULL));
  int bad = 0;
  for (size_t i = 0; i < g_narrays; ++i) bad |= MXNDArrayFree(g_arrays[i]);
  if (bad) say("cleanup: free rc=-1");
  g_narrays = 0;
}

/* A dense array of shape/dtype on (dev_type, dev_id), filled from `data`
   (raw elements of the dtype; NULL: left as allocated). NULL on failure, after
   printing the failing step under `what`. */
static NDArrayHandle mk_on(const char *what, int dt, int ndim, const uint32_t *shape,
                           int dev_type, int dev_id, const void *data) {
  NDArrayHandle h = NULL;
  int rc = MXNDArrayCreateEx(shape, (uint32_t)ndim, dev_type, dev_id, 0, dt, &h);
  if (rc != 0) {
    say("%s: create dtype=%d %s", what, dt, rc_text(rc, "Unknown type enum"));
    return NULL;
  }
  track(h);
  if (data) {
    size_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    rc = settle(MXNDArraySyncCopyFromCPU(h, data, n));
    if (rc != 0) {
      say("%s: fill dtype=%d %s", what, dt, rc_text(rc, "Unknown type enum"));
      return NULL;
    }
  }
  return h;
}

static NDArrayHandle mk(const char *what, int dt, int ndim, const uint32_t *shape,
                        const void *data) {
  return mk_on(what, dt, ndim, shape, 1, 0, data);
}

/* 1-D float32 array from values. */
static NDArrayHandle mkf(int dev_id, size_t n, const double *v) {
  float buf[64];
  uint32_t shape[1] = {(uint32_t)n};
  for (size_t i = 0; i < n; ++i) buf[i] = (float)v[i];
  return mk_on("mkf", F32, 1, shape, 1, dev_id, buf);
}

/* 1-D float32 array with every element `v`. */
static NDArrayHandle mkfill(int dev_id, size_t n, double v) {
  double vals[64];
  for (size_t i = 0; i < n; ++i) vals[i] = v;
  return mkf(dev_id, n, vals);
}

/* 1-D array of dtype dt from float values (converted on our side). */
static NDArrayHandle mkd(const char *what, int dt, size_t n, const double *v) {
  unsigned char buf[64 * 8];
  uint32_t shape[1] = {(uint32_t)n};
  for (size_t i = 0; i < n; ++i) put_float(dt, buf, i, v[i]);
  return mk(what, dt, 1, shape, buf);
}

/* 1-D array of dtype dt from raw integer bits. */
static NDArrayHandle mki(const char *what, int dt, size_t n, const uint64_t *v) {
  unsigned char buf[64 * 8];
  uint32_t shape[1] = {(uint32_t)n};
  for (size_t i = 0; i < n; ++i) put_bits(dt, buf, i, v[i]);
  return mk(what, dt, 1, shape, buf);
}

/* "shape=(2,3) dtype=0 out=[...]" for an array (waits for it). */
static const char *describe(NDArrayHandle h) {
  static char ring[8][8192]; /* several results may appear in one printf */
  static int slot;
  char *text = ring[slot++ & 7];
  const size_t text_size = sizeof ring[0];
  int ndim = 0, dt = -1;
  const int *dims = NULL;
  size_t len = 0;
  int rc = MXNDArrayGetShapeEx(h, &ndim, &dims);
  if (rc != 0) {
    snprintf(text, text_size, "shape %s", rc_text(rc, NULL));
    return text;
  }
  len += (size_t)snprintf(text + len, text_size - len, "shape=(");
  size_t n = 1;
  for (int i = 0; i < ndim; ++i) {
    len += (size_t)snprintf(text + len, text_size - len, "%s%d", i ? "," : "", dims[i]);
    n *= dims[i] > 0 ? (size_t)dims[i] : 0;
  }
  if (ndim < 0) n = 0;
  rc = MXNDArrayGetDType(h, &dt);
  len += (size_t)snprintf(text + len, text_size - len, ") dtype=%d", rc ? -99 : dt);
  if (rc != 0 || n > 1024) return text;
  unsigned char *data = malloc(n * dtype_size(dt) + 1);
  rc = MXNDArrayWaitToRead(h);
  if (rc == 0) rc = MXNDArraySyncCopyToCPU(h, data, n);
  if (rc != 0) {
    len += (size_t)snprintf(text + len, text_size - len, " read %s", rc_text(rc, NULL));
  } else {
    len += (size_t)snprintf(text + len, text_size - len, " out=[");
    for (size_t i = 0; i < n && len < text_size - 64; ++i) {
      char e[32];
      fmt_elem(dt, data, i, e, sizeof e);
      len += (size_t)snprintf(text + len, text_size - len, "%s%s", i ? " " : "", e);
    }
    snprintf(text + len, text_size - len, "]");
  }
  free(data);
  return text;
}

/* Only the values: "[...]" (the array's own dtype). */
static const char *values(NDArrayHandle h) {
  const char *d = describe(h);
  const char *o = strstr(d, "out=");
  return o ? o + 4 : d;
}

static const char *ctx_text(NDArrayHandle h) {
  static char buf[4][32];
  static int slot;
  char *out = buf[slot++ & 3];
  int t = -1, id = -1;
  int rc = MXNDArrayGetContext(h, &t, &id);
  if (rc != 0)
    snprintf(out, 32, "ctx-rc=%d", rc);
  else
    snprintf(out, 32, "(%d,%d)", t, id);
  return out;
}

/* ---------------------------------------------------------------------------
 * Stores
 * ------------------------------------------------------------------------- */

static KVStoreHandle new_store(const char *type) {
  KVStoreHandle kv = NULL;
  int rc = MXKVStoreCreate(type, &kv);
  if (rc != 0) {
    say("create %s: %s", quoted(type), rc_text(rc, NULL));
    return NULL;
  }
  return kv;
}

static void end_store(KVStoreHandle kv) {
  free_arrays();
  if (kv) {
    int rc = MXKVStoreFree(kv);
    if (rc != 0) say("free store: %s", rc_text(rc, NULL));
  }
}

/* Pull one int key into `out` and print "<what>: rc=0 out=[...]". */
static void pull_show(KVStoreHandle kv, const char *what, int key, NDArrayHandle out,
                      const char *expect) {
  int rc = settle(MXKVStorePull(kv, 1, &key, &out, 0));
  if (rc == 0)
    say("%s: rc=0 out=%s", what, values(out));
  else
    say("%s: %s", what, rc_text(rc, expect));
}

static void pull_show_ex(KVStoreHandle kv, const char *what, const char *key, NDArrayHandle out,
                         const char *expect) {
  int rc = settle(MXKVStorePullEx(kv, 1, &key, &out, 0));
  if (rc == 0)
    say("%s: rc=0 out=%s", what, values(out));
  else
    say("%s: %s", what, rc_text(rc, expect));
}

/* The same, as a line expected to differ ("partial:" state after a failed call). */
static void pull_show_as(const char *prefix, KVStoreHandle kv, const char *what, int key,
                         NDArrayHandle out, const char *expect) {
  int rc = settle(MXKVStorePull(kv, 1, &key, &out, 0));
  if (rc == 0)
    say_as(prefix, "%s: rc=0 out=%s", what, values(out));
  else
    say_as(prefix, "%s: %s", what, rc_text(rc, expect));
}

static void pull_show_ex_as(const char *prefix, KVStoreHandle kv, const char *what,
                            const char *key, NDArrayHandle out, const char *expect) {
  int rc = settle(MXKVStorePullEx(kv, 1, &key, &out, 0));
  if (rc == 0)
    say_as(prefix, "%s: rc=0 out=%s", what, values(out));
  else
    say_as(prefix, "%s: %s", what, rc_text(rc, expect));
}

/* ---------------------------------------------------------------------------
 * Updaters: local += 2 * recv on float32 arrays, through SyncCopy; they print
 * what they see and free both handles.
 * ------------------------------------------------------------------------- */

struct updater_ctx {
  int magic;
  bool show_ctx;               /* print recv/local contexts (local stores only) */
  NDArrayHandle caller[16];    /* handles the caller holds: updater handles must differ */
  size_t ncaller;
  double factor;               /* local += factor * recv; 0: leave local as it is */
};

#define UPDATER_MAGIC 0x1234

static void apply_update(const char *key_text, NDArrayHandle recv, NDArrayHandle local,
                         void *handle) {
  struct updater_ctx *u = (struct updater_ctx *)handle;
  bool handle_ok = u && u->magic == UPDATER_MAGIC;
  bool distinct = recv != local;
  if (handle_ok)
    for (size_t i = 0; i < u->ncaller; ++i)
      if (u->caller[i] == recv || u->caller[i] == local) distinct = false;
  char ctx[80] = "";
  if (handle_ok && u->show_ctx)
    snprintf(ctx, sizeof ctx, " recv_ctx=%s local_ctx=%s", ctx_text(recv), ctx_text(local));
  int ndim_r = 0, ndim_l = 0, dt_r = -1, dt_l = -1;
  const int *dims = NULL;
  size_t n = 1, nl = 1;
  MXNDArrayGetShapeEx(recv, &ndim_r, &dims);
  for (int i = 0; i < ndim_r; ++i) n *= (size_t)dims[i];
  MXNDArrayGetShapeEx(local, &ndim_l, &dims);
  for (int i = 0; i < ndim_l; ++i) nl *= (size_t)dims[i];
  MXNDArrayGetDType(recv, &dt_r);
  MXNDArrayGetDType(local, &dt_l);
  say("updater key=%s handle_ok=%d distinct=%d%s recv=%s local=%s", key_text, handle_ok,
      distinct, ctx, describe(recv), describe(local));
  if (handle_ok && u->factor != 0 && dt_r == F32 && dt_l == F32 && n == nl && n <= 64) {
    float r[64], l[64];
    int rc = MXNDArraySyncCopyToCPU(recv, r, n);
    rc |= MXNDArraySyncCopyToCPU(local, l, n);
    for (size_t i = 0; i < n; ++i) l[i] += (float)u->factor * r[i];
    rc |= MXNDArraySyncCopyFromCPU(local, l, n);
    if (rc != 0) say("updater key=%s: copy rc=-1", key_text);
  }
  int rc = MXNDArrayFree(recv);
  rc |= MXNDArrayFree(local);
  if (rc != 0) say("updater key=%s: free rc=-1", key_text);
}

static void int_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *handle) {
  char k[32];
  snprintf(k, sizeof k, "%d", key);
  apply_update(k, recv, local, handle);
}

static void str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local,
                        void *handle) {
  char k[300];
  snprintf(k, sizeof k, "str:%s", quoted(key));
  apply_update(k, recv, local, handle);
}

/* ---------------------------------------------------------------------------
 * Scenarios
 * ------------------------------------------------------------------------- */

static const char *const kStoreTypes[2] = {"local", "device"};

static void scn_version(void) {
  set_scn("version");
  int v = 0;
  int rc = MXGetVersion(&v);
  say("MXGetVersion %s value=%d", rc_text(rc, NULL), v);
}

/* The KVStore tutorial (examples/tutorial.py): local store, key 3 of 3x3. */
static void scn_tutorial(void) {
  set_scn("tutorial");
  KVStoreHandle kv = new_store("local");
  if (!kv) return;
  const uint32_t shape[2] = {3, 3};
  float buf[9];
  NDArrayHandle twos, a, eights, b[4], one, pulled[4];
#define FILL(h, dev, val)                                   \
  do {                                                      \
    for (int i = 0; i < 9; ++i) buf[i] = (float)(val);      \
    h = mk_on("tutorial", F32, 2, shape, 1, dev, buf);      \
    if (!h) goto done;                                      \
  } while (0)
  int key = 3;
  FILL(twos, 0, 2);
  report("init 3", settle(MXKVStoreInit(kv, 1, &key, &twos)), NULL);
  FILL(a, 0, 0);
  report("pull 3", settle(MXKVStorePull(kv, 1, &key, &a, 0)), NULL);
  say("a = %s", describe(a));
  FILL(eights, 0, 8);
  report("push 3 (8s)", settle(MXKVStorePush(kv, 1, &key, &eights, 0)), NULL);
  report("pull 3", settle(MXKVStorePull(kv, 1, &key, &a, 0)), NULL);
  say("a = %s", describe(a));
  int keys4[4] = {3, 3, 3, 3};
  for (int i = 0; i < 4; ++i) FILL(b[i], i, 1);
  report("push 3 (ones on cpu(0..3))", settle(MXKVStorePush(kv, 4, keys4, b, 0)), NULL);
  report("pull 3", settle(MXKVStorePull(kv, 1, &key, &a, 0)), NULL);
  say("a = %s", describe(a));
  struct updater_ctx u = {UPDATER_MAGIC, false, {0}, 0, 2.0};
  report("set_updater", MXKVStoreSetUpdater(kv, int_updater, &u), NULL);
  report("pull 3", settle(MXKVStorePull(kv, 1, &key, &a, 0)), NULL);
  say("a = %s", describe(a));
  FILL(one, 0, 1);
  report("push 3 (ones)", settle(MXKVStorePush(kv, 1, &key, &one, 0)), NULL);
  report("pull 3", settle(MXKVStorePull(kv, 1, &key, &a, 0)), NULL);
  say("a = %s", describe(a));
  for (int i = 0; i < 4; ++i) FILL(pulled[i], i, 1);
  report("pull 3 into 4", settle(MXKVStorePull(kv, 4, keys4, pulled, 0)), NULL);
  say("b[1] = %s ctx=%s", describe(pulled[1]), ctx_text(pulled[1]));
  {
    int keys[3] = {5, 7, 9};
    NDArrayHandle ones, ones2, zeros, per_ctx[4];
    FILL(ones, 0, 1);
    NDArrayHandle v1[3] = {ones, ones, ones};
    report("init [5,7,9]", settle(MXKVStoreInit(kv, 3, keys, v1)), NULL);
    FILL(ones2, 0, 1);
    NDArrayHandle v2[3] = {ones2, ones2, ones2};
    report("push [5,7,9]", settle(MXKVStorePush(kv, 3, keys, v2, 0)), NULL);
    FILL(zeros, 0, 0);
    NDArrayHandle v3[3] = {zeros, zeros, zeros};
    report("pull [5,7,9]", settle(MXKVStorePull(kv, 3, keys, v3, 0)), NULL);
    say("b[1] = %s", describe(v3[1]));
    for (int i = 0; i < 4; ++i) FILL(per_ctx[i], i, 1);
    int fk[12];
    NDArrayHandle fv[12];
    for (int k = 0; k < 3; ++k)
      for (int i = 0; i < 4; ++i) fk[k * 4 + i] = keys[k], fv[k * 4 + i] = per_ctx[i];
    report("push [5,7,9] x cpu(0..3)", settle(MXKVStorePush(kv, 12, fk, fv, 0)), NULL);
    report("pull [5,7,9] x cpu(0..3)", settle(MXKVStorePull(kv, 12, fk, fv, 0)), NULL);
    say("b[1][1] = %s", describe(fv[5]));
    for (int i = 0; i < 4; ++i) say("b[0][%d] ctx=%s", i, ctx_text(fv[i]));
  }
#undef FILL
done:
  end_store(kv);
}

/* Type strings: lower-cased by GetType; "device" selects device reduction. */
static void scn_types(void) {
  static const char *const types[] = {
      "local", "LOCAL", "Device_Sync", "foo", "", "local_allreduce_device", "device",
      "local_update_cpu", "local_allreduce_cpu", "xdevicex", "Local_Update_CPU"};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
    set_scn("types/%s", quoted(types[t]));
    KVStoreHandle kv = NULL;
    int rc = MXKVStoreCreate(types[t], &kv);
    report("create", rc, NULL);
    if (rc != 0) continue;
    const char *got = NULL;
    rc = MXKVStoreGetType(kv, &got);
    say("get_type: %s type=%s", rc_text(rc, NULL), rc == 0 && got ? quoted(got) : "-");
    /* which reduction: local gives 1 for [1, 1e8, -1e8], device gives 0 */
    int key = 3, keys[3] = {3, 3, 3};
    NDArrayHandle z = mkfill(0, 1, 0);
    double v[3] = {1, 1e8, -1e8};
    NDArrayHandle vals[3] = {mkf(0, 1, &v[0]), mkf(0, 1, &v[1]), mkf(0, 1, &v[2])};
    NDArrayHandle out = mkfill(0, 1, -5);
    if (z && vals[0] && vals[1] && vals[2] && out) {
      report("init 3", settle(MXKVStoreInit(kv, 1, &key, &z)), NULL);
      report("push [1,1e8,-1e8]", settle(MXKVStorePush(kv, 3, keys, vals, 0)), NULL);
      pull_show(kv, "pull 3", 3, out, NULL);
    }
    end_store(kv);
  }
  static const char *const bad[] = {"nccl", "NCCL", "local_nccl"};
  for (size_t t = 0; t < sizeof bad / sizeof bad[0]; ++t) {
    set_scn("types/%s", quoted(bad[t]));
    KVStoreHandle kv = NULL;
    char expect[96];
    char lower[32];
    size_t i = 0;
    for (; bad[t][i] && i < sizeof lower - 1; ++i)
      lower[i] = (char)(bad[t][i] >= 'A' && bad[t][i] <= 'Z' ? bad[t][i] + 32 : bad[t][i]);
    lower[i] = 0;
    snprintf(expect, sizeof expect, "compile with USE_NCCL=1 to use %s", lower);
    int rc = MXKVStoreCreate(bad[t], &kv);
    report("create", rc, expect);
    if (rc == 0) MXKVStoreFree(kv);
  }
}

static void controller(int head, const char *body, void *handle) {
  (void)handle;
  say("controller called head=%d body=%s", head, quoted(body ? body : ""));
}

/* Multi-machine entry points on local and device stores. */
static void scn_node(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("node/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int v = -7;
    int rc = MXKVStoreGetRank(kv, &v);
    say("rank: %s value=%d", rc_text(rc, NULL), v);
    v = -7;
    rc = MXKVStoreGetGroupSize(kv, &v);
    say("group_size: %s value=%d", rc_text(rc, NULL), v);
    report("barrier", MXKVStoreBarrier(kv), NULL);
    v = -7;
    rc = MXKVStoreIsWorkerNode(&v);
    say("is_worker: %s value=%d", rc_text(rc, NULL), v);
    v = -7;
    rc = MXKVStoreIsServerNode(&v);
    say("is_server: %s value=%d", rc_text(rc, NULL), v);
    v = -7;
    rc = MXKVStoreIsSchedulerNode(&v);
    say("is_scheduler: %s value=%d", rc_text(rc, NULL), v);
    static const int nodes[] = {1, 2, 4, 7, 0, -1};
    static const int timeouts[] = {60, 0, 1};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; ++i) {
      v = -7;
      rc = MXKVStoreGetNumDeadNode(kv, nodes[i], &v, timeouts[i % 3]);
      say("num_dead_node node=%d timeout=%d: %s value=%d", nodes[i], timeouts[i % 3],
          rc_text(rc, NULL), v);
    }
    report("set_barrier_before_exit 0", MXKVStoreSetBarrierBeforeExit(kv, 0), NULL);
    report("set_barrier_before_exit 1", MXKVStoreSetBarrierBeforeExit(kv, 1), NULL);
    report("send_command 0 \"\"", MXKVStoreSendCommmandToServers(kv, 0, ""), NULL);
    report("send_command 3 \"x\"", MXKVStoreSendCommmandToServers(kv, 3, "x"), NULL);
    report("run_server", MXKVStoreRunServer(kv, controller, NULL), NULL);
    report("barrier again", MXKVStoreBarrier(kv), NULL);
    end_store(kv);
  }
}

/* Per-dtype element values. Floats: e is half an ulp of 1 in the dtype, so
   1+e+e rounds differently as (1+e)+e (device) and 1+(e+e) (local). Integers:
   values whose sums wrap around. */
struct dtype_case {
  int dt;
  const char *name;
};

static const struct dtype_case kDtypes[] = {
    {F32, "f32"}, {F64, "f64"}, {F16, "f16"}, {U8, "u8"}, {I32, "i32"}, {I8, "i8"},
    {I64, "i64"}, {I16, "i16"}, {U16, "u16"}, {U32, "u32"}, {U64, "u64"}, {BF16, "bf16"}};

#define DT_N 5

static NDArrayHandle mk_dtype_values(int dt, int which) {
  if (dtype_is_float(dt)) {
    int mant = dt == F16 ? 10 : dt == BF16 ? 7 : dt == F32 ? 23 : 52;
    double e = 1.0;
    for (int i = 0; i <= mant; ++i) e /= 2;
    const double table[][DT_N] = {
        {1.5, -2, 0.25, 3, 100},    /* 0: init */
        {0.5, 7, -1, 2.5, -100},    /* 1: single push */
        {1, 2, -3, 0.5, 1},         /* 2..4: three-value push */
        {e, e, 4, 0.25, -1 + e},
        {e, e, -1, 0.125, e},
        {1, e, 3, -0.5, 2},         /* 5..6: two-value push */
        {e, 1, 5, 0.5, -2 + 4 * e},
    };
    return mkd("dtype values", dt, DT_N, table[which]);
  }
  int bits = dtype_bits(dt);
  bool sgn = dtype_is_signed(dt);
  uint64_t hi = bits == 64 ? (sgn ? (uint64_t)INT64_MAX : UINT64_MAX)
                           : (sgn ? (1ull << (bits - 1)) - 1 : (1ull << bits) - 1);
  uint64_t mid = hi / 2 + 1, m1 = sgn ? (uint64_t)-1 : 5;
  const uint64_t table[][DT_N] = {
      {1, 2, 3, hi, 0},      /* init */
      {5, hi, mid, 7, 1},    /* single push */
      {mid, hi, 1, 2, 3},    /* three-value push */
      {mid, 1, 2, m1, 4},
      {mid, 1, 3, 6, hi},
      {hi, 1, 2, 3, 4},      /* two-value push */
      {hi, 10, 20, 30, 40},
  };
  return mki("dtype values", dt, DT_N, table[which]);
}

static void scn_dtypes(void) {
  for (int s = 0; s < 2; ++s) {
    for (size_t d = 0; d < sizeof kDtypes / sizeof kDtypes[0]; ++d) {
      int dt = kDtypes[d].dt;
      set_scn("%s/%s/%s", dtype_is_extra(dt) ? "dtype-extra" : "dtype", kStoreTypes[s],
              kDtypes[d].name);
      KVStoreHandle kv = new_store(kStoreTypes[s]);
      if (!kv) continue;
      uint32_t shape[1] = {DT_N};
      NDArrayHandle init = mk_dtype_values(dt, 0);
      NDArrayHandle out = init ? mk("out", dt, 1, shape, NULL) : NULL;
      if (!init || !out) {
        end_store(kv);
        continue;
      }
      int key = 3, keys[3] = {3, 3, 3};
      int rc = settle(MXKVStoreInit(kv, 1, &key, &init));
      report("init", rc, "Unknown type enum");
      if (rc == 0) {
        pull_show(kv, "pull after init", 3, out, "Unknown type enum");
        NDArrayHandle one = mk_dtype_values(dt, 1);
        if (one) {
          report("push 1 value", settle(MXKVStorePush(kv, 1, &key, &one, 0)), "Unknown type enum");
          pull_show(kv, "pull after push 1", 3, out, "Unknown type enum");
        }
        NDArrayHandle three[3] = {mk_dtype_values(dt, 2), mk_dtype_values(dt, 3),
                                  mk_dtype_values(dt, 4)};
        if (three[0] && three[1] && three[2]) {
          report("push 3 values", settle(MXKVStorePush(kv, 3, keys, three, 0)),
                 "Unknown type enum");
          pull_show(kv, "pull after push 3", 3, out, "Unknown type enum");
        }
        NDArrayHandle two[2] = {mk_dtype_values(dt, 5), mk_dtype_values(dt, 6)};
        if (two[0] && two[1]) {
          report("push 2 values", settle(MXKVStorePush(kv, 2, keys, two, 0)),
                 "Unknown type enum");
          pull_show(kv, "pull after push 2", 3, out, "Unknown type enum");
        }
      }
      end_store(kv);
    }
  }
}

/* bool (7): init and pull only (MXNet cannot sum bools). */
static void scn_bool(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("dtype/%s/bool", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    const uint64_t v[4] = {1, 0, 1, 1};
    NDArrayHandle init = mki("bool", BOOL, 4, v);
    uint32_t shape[1] = {4};
    NDArrayHandle out = mk("bool out", BOOL, 1, shape, NULL);
    NDArrayHandle out2 = mk("bool out", BOOL, 1, shape, NULL);
    if (init && out && out2) {
      int key = 3, keys[2] = {3, 3};
      report("init", settle(MXKVStoreInit(kv, 1, &key, &init)), NULL);
      pull_show(kv, "pull", 3, out, NULL);
      NDArrayHandle outs[2] = {out, out2};
      report("pull [3,3]", settle(MXKVStorePull(kv, 2, keys, outs, 0)), NULL);
      say("outs = %s %s", values(out), values(out2));
    }
    end_store(kv);
  }
}

/* Int keys including negative ones and the extremes. */
static void scn_keys_int(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("keys/int/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int keys[6] = {0, -1, -7, INT_MIN, INT_MAX, 42};
    NDArrayHandle vals[6], outs[6];
    bool ok = true;
    for (int i = 0; i < 6; ++i) {
      vals[i] = mkfill(0, 2, i + 1);
      outs[i] = mkfill(0, 2, -1);
      ok = ok && vals[i] && outs[i];
    }
    if (ok) {
      report("init 6 keys", settle(MXKVStoreInit(kv, 6, keys, vals)), NULL);
      int order[6] = {INT_MAX, 42, -7, 0, INT_MIN, -1};
      report("pull 6 keys (other order)", settle(MXKVStorePull(kv, 6, order, outs, 0)), NULL);
      for (int i = 0; i < 6; ++i) say("key %d -> %s", order[i], values(outs[i]));
      int pk[4] = {INT_MIN, -1, INT_MIN, INT_MAX};
      NDArrayHandle pv[4] = {mkfill(0, 2, 10), mkfill(0, 2, 20), mkfill(0, 2, 30),
                             mkfill(0, 2, 40)};
      if (pv[0] && pv[1] && pv[2] && pv[3]) {
        report("push [MIN,-1,MIN,MAX]", settle(MXKVStorePush(kv, 4, pk, pv, 0)), NULL);
        report("pull 6 keys", settle(MXKVStorePull(kv, 6, keys, outs, 0)), NULL);
        for (int i = 0; i < 6; ++i) say("key %d -> %s", keys[i], values(outs[i]));
      }
    }
    end_store(kv);
  }
}

/* String keys including "", invalid UTF-8 and non-ASCII bytes. */
static void scn_keys_str(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("keys/str/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    const char *keys[6] = {"", "\xff\xfe", "\xc3\xa9t\xc3\xa9", "weight", "a b", "w\x01"};
    NDArrayHandle vals[6], outs[6];
    bool ok = true;
    for (int i = 0; i < 6; ++i) {
      vals[i] = mkfill(0, 2, i + 1);
      outs[i] = mkfill(0, 2, -1);
      ok = ok && vals[i] && outs[i];
    }
    if (ok) {
      report("init 6 keys", settle(MXKVStoreInitEx(kv, 6, keys, vals)), NULL);
      const char *order[6] = {"w\x01", "a b", "", "weight", "\xff\xfe", "\xc3\xa9t\xc3\xa9"};
      report("pull 6 keys (other order)", settle(MXKVStorePullEx(kv, 6, order, outs, 0)), NULL);
      for (int i = 0; i < 6; ++i) say("key %s -> %s", quoted(order[i]), values(outs[i]));
      const char *pk[4] = {"", "\xff\xfe", "", "a b"};
      NDArrayHandle pv[4] = {mkfill(0, 2, 10), mkfill(0, 2, 20), mkfill(0, 2, 30),
                             mkfill(0, 2, 40)};
      if (pv[0] && pv[1] && pv[2] && pv[3]) {
        report("push [\"\",ff fe,\"\",\"a b\"]", settle(MXKVStorePushEx(kv, 4, pk, pv, 0)), NULL);
        report("pull 6 keys", settle(MXKVStorePullEx(kv, 6, keys, outs, 0)), NULL);
        for (int i = 0; i < 6; ++i) say("key %s -> %s", quoted(keys[i]), values(outs[i]));
      }
      /* a key that only differs after a NUL is the same key */
      const char *prefix_key = "weight\0ignored";
      pull_show_ex(kv, "pull \"weight\\0ignored\"", prefix_key, outs[0], NULL);
      pull_show_ex(kv, "pull \"Weight\"", "Weight", outs[0], "key Weight doesn't exist");
    }
    end_store(kv);
  }
}

/* One store takes int keys or string keys, never both; the first keyed call
   decides, even when it fails. */
static void scn_mixed(void) {
  set_scn("mixed/int-then-str");
  KVStoreHandle kv = new_store("local");
  if (kv) {
    int key = 3;
    const char *skey = "w";
    const char *expect = "Mixed key types are not allowed";
    NDArrayHandle v = mkfill(0, 2, 1), o = mkfill(0, 2, 0);
    if (v && o) {
      report("init 3", settle(MXKVStoreInit(kv, 1, &key, &v)), NULL);
      report("init_ex w", settle(MXKVStoreInitEx(kv, 1, &skey, &v)), expect);
      report("push_ex w", settle(MXKVStorePushEx(kv, 1, &skey, &v, 0)), expect);
      report("pull_ex w", settle(MXKVStorePullEx(kv, 1, &skey, &o, 0)), expect);
      report("pushpull_ex w", settle(MXKVStorePushPullEx(kv, 1, &skey, 1, &skey, &v, &o, 0)),
             expect);
      report("broadcast_ex x", settle(MXKVStoreBroadcastEx(kv, 1, &skey, 1, &skey, &v, &o, 0)),
             expect);
      pull_show(kv, "pull 3 still works", 3, o, NULL);
    }
    end_store(kv);
  }
  set_scn("mixed/str-then-int");
  kv = new_store("local");
  if (kv) {
    int key = 3;
    const char *skey = "w";
    const char *expect = "Mixed key types are not allowed";
    NDArrayHandle v = mkfill(0, 2, 1), o = mkfill(0, 2, 0);
    if (v && o) {
      report("init_ex w", settle(MXKVStoreInitEx(kv, 1, &skey, &v)), NULL);
      report("init 3", settle(MXKVStoreInit(kv, 1, &key, &v)), expect);
      report("push 3", settle(MXKVStorePush(kv, 1, &key, &v, 0)), expect);
      report("pull 3", settle(MXKVStorePull(kv, 1, &key, &o, 0)), expect);
      report("pushpull 3", settle(MXKVStorePushPull(kv, 1, &key, 1, &key, &v, &o, 0)), expect);
      report("broadcast 3", settle(MXKVStoreBroadcast(kv, 1, &key, 1, &key, &v, &o, 0)), expect);
      pull_show_ex(kv, "pull_ex w still works", "w", o, NULL);
    }
    end_store(kv);
  }
  set_scn("mixed/failed-first-call-locks");
  kv = new_store("local");
  if (kv) {
    int key = 3;
    const char *skey = "nope";
    NDArrayHandle v = mkfill(0, 2, 1), o = mkfill(0, 2, 0);
    if (v && o) {
      report("pull_ex nope", settle(MXKVStorePullEx(kv, 1, &skey, &o, 0)),
             "key nope doesn't exist. Did you init?");
      report("init 3", settle(MXKVStoreInit(kv, 1, &key, &v)),
             "Mixed key types are not allowed");
    }
    end_store(kv);
  }
  set_scn("mixed/failed-first-int-call-locks");
  kv = new_store("local");
  if (kv) {
    int key = 99;
    const char *skey = "w";
    NDArrayHandle v = mkfill(0, 2, 1), o = mkfill(0, 2, 0);
    if (v && o) {
      report("pull 99", settle(MXKVStorePull(kv, 1, &key, &o, 0)), "key 99 has not been inited");
      report("init_ex w", settle(MXKVStoreInitEx(kv, 1, &skey, &v)),
             "Mixed key types are not allowed");
    }
    end_store(kv);
  }
}

/* ---- aggregation ---- */

static uint32_t g_rng;
static uint32_t rnd(void) {
  g_rng = g_rng * 1664525u + 1013904223u;
  return g_rng >> 8;
}

static const double kPoolF32[] = {1, 1e8, -1e8, 1e-8, 3.3e7, -3.3e7, 1.00000011920928955,
                                  1.0000002384185791, 1.000244140625, 5.9604644775390625e-08,
                                  0.1, -0.3, 16777216, -1, 0.5, 7, 1.5, -2.5e-8};
static const double kPoolF64[] = {1, 1e17, -1e17, 1e-17, 3.3e16, -3.3e16,
                                  1.0000000000000002220446, 1.1102230246251565e-16, 0.1, -0.3,
                                  9007199254740992.0, -1, 0.5, 7};
static const double kPoolF16[] = {1, 0.00048828125, 0.0009765625, 1024, -1024, 0.1, 3, 2048,
                                  1.5, -1, 1.0009765625, 0.333, -0.00048828125, 7};

/* Sum `n` values on one key (shape (4,), element j gets its own arrangement)
   and print the result. `vals[i*4+j]` is value i of element j. */
static void agg_run(const char *type, int dt, const char *label, int n, const double *vals,
                    const int *dev) {
  KVStoreHandle kv = new_store(type);
  if (!kv) return;
  double zero[4] = {0, 0, 0, 0};
  NDArrayHandle init = mkd("agg init", dt, 4, zero);
  NDArrayHandle out = mkd("agg out", dt, 4, zero);
  int key = 3;
  int keys[64];
  NDArrayHandle hv[64];
  bool ok = init && out && n <= 64;
  for (int i = 0; ok && i < n; ++i) {
    keys[i] = 3;
    unsigned char buf[4 * 8];
    for (int j = 0; j < 4; ++j) put_float(dt, buf, (size_t)j, vals[i * 4 + j]);
    uint32_t shape[1] = {4};
    hv[i] = mk_on("agg value", dt, 1, shape, 1, dev ? dev[i] : 0, buf);
    ok = hv[i] != NULL;
  }
  if (ok) {
    int rc = settle(MXKVStoreInit(kv, 1, &key, &init));
    if (rc == 0) rc = settle(MXKVStorePush(kv, (uint32_t)n, keys, hv, 0));
    if (rc == 0) rc = settle(MXKVStorePull(kv, 1, &key, &out, 0));
    if (rc == 0)
      say("%s: rc=0 sum=%s", label, values(out));
    else
      say("%s: %s", label, rc_text(rc, NULL));
  }
  end_store(kv);
}

static void fill_random(double *vals, int n, const double *pool, size_t npool) {
  for (int i = 0; i < n * 4; ++i) vals[i] = pool[rnd() % npool];
}

static void scn_agg(void) {
  double vals[64 * 4];
  int dev[64];
  char label[64];
  for (int s = 0; s < 2; ++s) {
    /* the two sequences from the spec */
    set_scn("agg/%s/f32/spec", kStoreTypes[s]);
    {
      const double a[3] = {1, 1e8, -1e8};
      const double b[5] = {1e8, 1, 1, -1e8, 1};
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 4; ++j) vals[i * 4 + j] = a[(i + j) % 3];
      agg_run(kStoreTypes[s], F32, "[1,1e8,-1e8] rotated per element", 3, vals, NULL);
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 4; ++j) vals[i * 4 + j] = j == 0 ? b[i] : b[(i + j) % 5];
      agg_run(kStoreTypes[s], F32, "[1e8,1,1,-1e8,1] rotated per element", 5, vals, NULL);
    }
    /* 2..16 values: random arrangements from an order-sensitive pool */
    for (int n = 2; n <= 16; ++n) {
      set_scn("agg/%s/f32/n=%d", kStoreTypes[s], n);
      g_rng = (uint32_t)(1000 * n + 7);
      for (int r = 0; r < 4; ++r) {
        fill_random(vals, n, kPoolF32, sizeof kPoolF32 / sizeof kPoolF32[0]);
        snprintf(label, sizeof label, "r=%d", r);
        agg_run(kStoreTypes[s], F32, label, n, vals, NULL);
      }
      /* 1e8 first, ones, -1e8 last; and the values spread over cpu(0..3) */
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < 4; ++j) {
          double big = j & 1 ? 3.3e7 : 1e8;
          double small = j < 2 ? 1 : 1.00000011920928955;
          vals[i * 4 + j] = i == 0 ? big : i == n - 1 ? -big : small;
        }
        dev[i] = i % 4;
      }
      agg_run(kStoreTypes[s], F32, "big,1...,-big", n, vals, NULL);
      agg_run(kStoreTypes[s], F32, "big,1...,-big on cpu(i%4)", n, vals, dev);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < 4; ++j) vals[i * 4 + j] = i == 0 ? 1 : (j + 1) * 5.9604644775390625e-08;
      agg_run(kStoreTypes[s], F32, "1,tiny...", n, vals, NULL);
    }
    for (int n = 2; n <= 16; ++n) {
      set_scn("agg/%s/f64/n=%d", kStoreTypes[s], n);
      g_rng = (uint32_t)(2000 * n + 11);
      for (int r = 0; r < 2; ++r) {
        fill_random(vals, n, kPoolF64, sizeof kPoolF64 / sizeof kPoolF64[0]);
        snprintf(label, sizeof label, "r=%d", r);
        agg_run(kStoreTypes[s], F64, label, n, vals, NULL);
      }
      set_scn("agg/%s/f16/n=%d", kStoreTypes[s], n);
      g_rng = (uint32_t)(3000 * n + 13);
      for (int r = 0; r < 2; ++r) {
        fill_random(vals, n, kPoolF16, sizeof kPoolF16 / sizeof kPoolF16[0]);
        snprintf(label, sizeof label, "r=%d", r);
        agg_run(kStoreTypes[s], F16, label, n, vals, NULL);
      }
    }
  }
}

/* More than 16 values on one key: the order within a key is libstdc++
   introsort's, not list order. */
static void scn_agg_long(void) {
  double vals[64 * 4];
  char label[64];
  for (int s = 0; s < 2; ++s) {
    for (int n = 17; n <= 40; ++n) {
      set_scn("agg-long/%s/f32/n=%d", kStoreTypes[s], n);
      g_rng = (uint32_t)(5000 * n + 17);
      for (int r = 0; r < 3; ++r) {
        fill_random(vals, n, kPoolF32, sizeof kPoolF32 / sizeof kPoolF32[0]);
        snprintf(label, sizeof label, "r=%d", r);
        agg_run(kStoreTypes[s], F32, label, n, vals, NULL);
      }
      /* 1e8 at position p, -1e8 at position q, ones elsewhere: the sum counts
         the ones that come after 1e8 and before -1e8 (or all/none), so it
         shows where introsort put the two big values. */
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < 4; ++j) {
          int p = (j * 7) % n, q = (n - 1 - j * 5 % n + n) % n;
          if (q == p) q = (p + 1) % n;
          vals[i * 4 + j] = i == p ? 1e8 : i == q ? -1e8 : 1;
        }
      }
      agg_run(kStoreTypes[s], F32, "1e8@p,-1e8@q,ones", n, vals, NULL);
      /* distinct values 1+2^-k: every arrangement sums differently */
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < 4; ++j) {
          double v = 1;
          int k = 1 + (i * (j + 3)) % 24;
          for (int t = 0; t < k; ++t) v /= 2;
          vals[i * 4 + j] = (i % 3 == 0 ? 1e7 : 1) * (1 + v);
        }
      agg_run(kStoreTypes[s], F32, "(1+2^-k)*{1,1e7}", n, vals, NULL);
    }
  }
}

/* Long push lists that mix keys (the introsort permutation depends on them). */
static void scn_agg_multikey(void) {
  for (int s = 0; s < 2; ++s) {
    for (int n = 10; n <= 40; n += 3) {
      set_scn("agg-multikey/%s/n=%d", kStoreTypes[s], n);
      KVStoreHandle kv = new_store(kStoreTypes[s]);
      if (!kv) continue;
      g_rng = (uint32_t)(7000 * n + 19);
      int ikeys[4] = {-2, 1, 3, 8};
      NDArrayHandle outs[4];
      bool ok = true;
      for (int k = 0; k < 4; ++k) {
        NDArrayHandle z = mkfill(0, 2, 0);
        outs[k] = mkfill(0, 2, -9);
        ok = ok && z && outs[k];
        if (ok) ok = settle(MXKVStoreInit(kv, 1, &ikeys[k], &z)) == 0;
      }
      int keys[64];
      NDArrayHandle vals[64];
      char klist[256];
      size_t kl = 0;
      for (int i = 0; ok && i < n; ++i) {
        keys[i] = ikeys[rnd() % (i % 5 == 0 ? 2 : 4)];
        double v[2] = {kPoolF32[rnd() % 18], kPoolF32[rnd() % 18]};
        vals[i] = mkf(0, 2, v);
        ok = vals[i] != NULL;
        kl += (size_t)snprintf(klist + kl, sizeof klist - kl, "%s%d", i ? "," : "", keys[i]);
      }
      if (ok) {
        say("keys=[%s]", klist);
        report("push", settle(MXKVStorePush(kv, (uint32_t)n, keys, vals, 0)), NULL);
        for (int k = 0; k < 4; ++k) {
          char what[32];
          snprintf(what, sizeof what, "pull %d", ikeys[k]);
          pull_show(kv, what, ikeys[k], outs[k], NULL);
        }
      }
      end_store(kv);
    }
  }
}

/* Duplicate keys in one push list. */
static void scn_dupkeys(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("dupkeys/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int ik[2] = {3, 5};
    NDArrayHandle iv[2] = {mkfill(0, 2, 0), mkfill(0, 2, 0)};
    NDArrayHandle o3 = mkfill(0, 2, -1), o5 = mkfill(0, 2, -1);
    if (iv[0] && iv[1] && o3 && o5) {
      report("init [3,5]", settle(MXKVStoreInit(kv, 2, ik, iv)), NULL);
      /* MXNet (local and device) sizes its per-key copy buffers at the first
         multi-value push and crashes when a later push on that key has more
         values, so every key's largest push comes first. */
      int qk[4] = {3, 5, 3, 3};
      double a[2] = {1, 1e8}, b[2] = {7, 7}, c[2] = {1e8, 1}, d[2] = {-1e8, -1e8};
      NDArrayHandle qv[4] = {mkf(0, 2, a), mkf(0, 2, b), mkf(0, 2, c), mkf(0, 2, d)};
      if (qv[0] && qv[1] && qv[2] && qv[3]) {
        report("push [3,5,3,3]", settle(MXKVStorePush(kv, 4, qk, qv, 0)), NULL);
        pull_show(kv, "pull 3", 3, o3, NULL);
        pull_show(kv, "pull 5", 5, o5, NULL);
      }
      int pk[3] = {3, 5, 3};
      NDArrayHandle pv[3] = {mkfill(0, 2, 1.5), mkfill(0, 2, 2), mkfill(0, 2, 4)};
      if (pv[0] && pv[1] && pv[2]) {
        report("push [3,5,3]", settle(MXKVStorePush(kv, 3, pk, pv, 0)), NULL);
        pull_show(kv, "pull 3", 3, o3, NULL);
        pull_show(kv, "pull 5", 5, o5, NULL);
      }
      int rk[5] = {5, 3, 5, 3, 5};
      NDArrayHandle rv[5] = {mkfill(0, 2, 1), mkfill(1, 2, 2), mkfill(2, 2, 3), mkfill(3, 2, 4),
                             mkfill(0, 2, 5)};
      if (rv[0] && rv[1] && rv[2] && rv[3] && rv[4]) {
        report("push [5,3,5,3,5]", settle(MXKVStorePush(kv, 5, rk, rv, 0)), NULL);
        pull_show(kv, "pull 3", 3, o3, NULL);
        pull_show(kv, "pull 5", 5, o5, NULL);
      }
    }
    end_store(kv);
  }
}

/* Updaters: int updater, string updater, int updater on a string store. */
static void scn_updater_int(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("updater/int/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    struct updater_ctx u = {UPDATER_MAGIC, s == 0, {0}, 0, 2.0};
    int ik[3] = {9, 3, 5};
    NDArrayHandle iv[3] = {mkfill(0, 3, 100), mkfill(0, 3, 10), mkfill(0, 3, 50)};
    NDArrayHandle out = mkfill(0, 3, -1);
    if (iv[0] && iv[1] && iv[2] && out) {
      report("init [9,3,5]", settle(MXKVStoreInit(kv, 3, ik, iv)), NULL);
      report("set_updater", MXKVStoreSetUpdater(kv, int_updater, &u), NULL);
      /* single values, one of them on cpu(1) */
      int pk[3] = {9, 3, 5};
      NDArrayHandle pv[3] = {mkfill(0, 3, 1), mkfill(1, 3, 2), mkfill(2, 3, 3)};
      if (pv[0] && pv[1] && pv[2]) {
        for (int i = 0; i < 3; ++i) u.caller[u.ncaller++] = pv[i];
        report("push [9,3,5]", settle(MXKVStorePush(kv, 3, pk, pv, 0)), NULL);
        for (int i = 0; i < 3; ++i) {
          char what[32];
          snprintf(what, sizeof what, "pull %d", pk[i]);
          pull_show(kv, what, pk[i], out, NULL);
        }
      }
      /* several values per key */
      int mk5[5] = {5, 3, 3, 5, 3};
      NDArrayHandle mv[5] = {mkfill(0, 3, 0.5), mkfill(1, 3, 1), mkfill(2, 3, 2),
                             mkfill(3, 3, 0.25), mkfill(0, 3, 4)};
      if (mv[0] && mv[1] && mv[2] && mv[3] && mv[4]) {
        for (int i = 0; i < 5; ++i) u.caller[u.ncaller++] = mv[i];
        report("push [5,3,3,5,3]", settle(MXKVStorePush(kv, 5, mk5, mv, 0)), NULL);
        pull_show(kv, "pull 3", 3, out, NULL);
        pull_show(kv, "pull 5", 5, out, NULL);
      }
      /* pushpull with the updater */
      NDArrayHandle ppv = mkfill(0, 3, 1);
      int k9 = 9;
      if (ppv) {
        report("pushpull 9", settle(MXKVStorePushPull(kv, 1, &k9, 1, &k9, &ppv, &out, 0)), NULL);
        say("out = %s", values(out));
      }
      /* a second SetUpdater replaces the first; this one leaves local alone */
      struct updater_ctx noop = {UPDATER_MAGIC, false, {0}, 0, 0.0};
      report("set_updater (no-op)", MXKVStoreSetUpdater(kv, int_updater, &noop), NULL);
      NDArrayHandle one = mkfill(0, 3, 1000);
      if (one) {
        report("push 3", settle(MXKVStorePush(kv, 1, &ik[1], &one, 0)), NULL);
        pull_show(kv, "pull 3", 3, out, NULL);
      }
      /* SetUpdaterEx on an int store calls the int updater */
      report("set_updater_ex", MXKVStoreSetUpdaterEx(kv, int_updater, str_updater, &u), NULL);
      NDArrayHandle two = mkfill(0, 3, 2);
      if (two) {
        report("push 5", settle(MXKVStorePush(kv, 1, &ik[2], &two, 0)), NULL);
        pull_show(kv, "pull 5", 5, out, NULL);
      }
    }
    end_store(kv);
  }
}

static void scn_updater_str(void) {
  for (int s = 0; s < 2; ++s) {
    for (int mode = 0; mode < 2; ++mode) {
      /* mode 0: SetUpdaterEx (string updater gets the strings);
         mode 1: SetUpdater only (int updater gets internal ids 0,1,2...) */
      set_scn("updater/%s/%s", mode == 0 ? "str" : "str-store-int-updater", kStoreTypes[s]);
      KVStoreHandle kv = new_store(kStoreTypes[s]);
      if (!kv) continue;
      struct updater_ctx u = {UPDATER_MAGIC, s == 0, {0}, 0, 2.0};
      const char *ik[3] = {"b", "a", "\xc3\xa9"};
      NDArrayHandle iv[3] = {mkfill(0, 2, 10), mkfill(0, 2, 20), mkfill(0, 2, 30)};
      NDArrayHandle out = mkfill(0, 2, -1);
      if (iv[0] && iv[1] && iv[2] && out) {
        report("init_ex [b,a,\\xc3\\xa9]", settle(MXKVStoreInitEx(kv, 3, ik, iv)), NULL);
        const char *k2 = "";
        NDArrayHandle v2 = mkfill(0, 2, 40);
        if (v2) report("init_ex [\"\"]", settle(MXKVStoreInitEx(kv, 1, &k2, &v2)), NULL);
        if (mode == 0)
          report("set_updater_ex", MXKVStoreSetUpdaterEx(kv, int_updater, str_updater, &u), NULL);
        else
          report("set_updater", MXKVStoreSetUpdater(kv, int_updater, &u), NULL);
        const char *pk[5] = {"", "\xc3\xa9", "a", "b", "a"};
        NDArrayHandle pv[5] = {mkfill(0, 2, 1), mkfill(0, 2, 2), mkfill(1, 2, 3), mkfill(0, 2, 4),
                               mkfill(0, 2, 5)};
        if (pv[0] && pv[1] && pv[2] && pv[3] && pv[4]) {
          for (int i = 0; i < 5; ++i) u.caller[u.ncaller++] = pv[i];
          report("push_ex [\"\",\\xc3\\xa9,a,b,a]", settle(MXKVStorePushEx(kv, 5, pk, pv, 0)),
                 NULL);
          const char *all[4] = {"a", "b", "\xc3\xa9", ""};
          for (int i = 0; i < 4; ++i) {
            char what[48];
            snprintf(what, sizeof what, "pull_ex %s", quoted(all[i]));
            pull_show_ex(kv, what, all[i], out, NULL);
          }
        }
      }
      end_store(kv);
    }
  }
}

/* PushPull: vkeys and okeys independent; outs may be the pushed arrays. */
static void scn_pushpull(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("pushpull/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int ik[3] = {3, 5, 7};
    NDArrayHandle iv[3] = {mkfill(0, 2, 1), mkfill(0, 2, 2), mkfill(0, 2, 3)};
    NDArrayHandle o1 = mkfill(0, 2, -1), o2 = mkfill(0, 2, -1), o3 = mkfill(0, 2, -1);
    if (iv[0] && iv[1] && iv[2] && o1 && o2 && o3) {
      report("init [3,5,7]", settle(MXKVStoreInit(kv, 3, ik, iv)), NULL);
      /* two values on key 3, one output */
      int vk[2] = {3, 3};
      double a[2] = {1, 1e8}, b[2] = {1e8, 2};
      NDArrayHandle vv[2] = {mkf(0, 2, a), mkf(0, 2, b)};
      if (vv[0] && vv[1]) {
        report("pushpull v=[3,3] o=[3]", settle(MXKVStorePushPull(kv, 2, vk, 1, vk, vv, &o1, 0)),
               NULL);
        say("o=[3] -> %s", values(o1));
      }
      /* in place: outs = vals */
      int pk[2] = {3, 5};
      double c[2] = {10, 20}, d[2] = {30, 40};
      NDArrayHandle pv[2] = {mkf(0, 2, c), mkf(0, 2, d)};
      if (pv[0] && pv[1]) {
        report("pushpull v=[3,5] outs=vals",
               settle(MXKVStorePushPull(kv, 2, pk, 2, pk, pv, pv, 0)), NULL);
        say("vals -> %s %s", values(pv[0]), values(pv[1]));
      }
      /* in place with two values on one key */
      double e[2] = {1.5, -1}, f[2] = {2.25, 1e8};
      NDArrayHandle qv[2] = {mkf(0, 2, e), mkf(0, 2, f)};
      if (qv[0] && qv[1]) {
        report("pushpull v=[3,3] outs=vals",
               settle(MXKVStorePushPull(kv, 2, vk, 2, vk, qv, qv, 0)), NULL);
        say("vals -> %s %s", values(qv[0]), values(qv[1]));
        pull_show(kv, "pull 3", 3, o1, NULL);
        int vk7[2] = {7, 7};
        double g[2] = {-3, 4}, h[2] = {0.5, 0.5};
        NDArrayHandle rv[2] = {mkf(0, 2, g), mkf(0, 2, h)};
        if (rv[0] && rv[1]) {
          report("pushpull v=[7,7] outs=vals (key 7)",
                 settle(MXKVStorePushPull(kv, 2, vk7, 2, vk7, rv, rv, 0)), NULL);
          say("vals -> %s %s", values(rv[0]), values(rv[1]));
        }
      }
      /* onum = 0: push only */
      NDArrayHandle only = mkfill(0, 2, 77);
      if (only) {
        report("pushpull v=[5] onum=0",
               settle(MXKVStorePushPull(kv, 1, &ik[1], 0, NULL, &only, NULL, 0)), NULL);
        pull_show(kv, "pull 5", 5, o1, NULL);
      }
      /* different okeys */
      NDArrayHandle nv = mkfill(0, 2, 6);
      int ok2[3] = {5, 3, 7};
      NDArrayHandle oo[3] = {o1, o2, o3};
      if (nv) {
        report("pushpull v=[3] o=[5,3,7]",
               settle(MXKVStorePushPull(kv, 1, &ik[0], 3, ok2, &nv, oo, 0)), NULL);
        say("o=[5,3,7] -> %s %s %s", values(o1), values(o2), values(o3));
      }
      /* vnum = 0: pull only */
      report("pushpull vnum=0 o=[7]",
             settle(MXKVStorePushPull(kv, 0, NULL, 1, &ik[2], NULL, &o1, 0)), NULL);
      say("o=[7] -> %s", values(o1));
    }
    end_store(kv);
  }
  /* string keys */
  set_scn("pushpull/str");
  KVStoreHandle kv = new_store("local");
  if (kv) {
    const char *ik[2] = {"x", "y"};
    NDArrayHandle iv[2] = {mkfill(0, 2, 1), mkfill(0, 2, 2)};
    NDArrayHandle o1 = mkfill(0, 2, -1), o2 = mkfill(0, 2, -1);
    if (iv[0] && iv[1] && o1 && o2) {
      report("init_ex [x,y]", settle(MXKVStoreInitEx(kv, 2, ik, iv)), NULL);
      const char *vk[2] = {"y", "y"};
      const char *okk[2] = {"x", "y"};
      NDArrayHandle vv[2] = {mkfill(0, 2, 3), mkfill(0, 2, 4)};
      NDArrayHandle oo[2] = {o1, o2};
      if (vv[0] && vv[1]) {
        report("pushpull_ex v=[y,y] o=[x,y]",
               settle(MXKVStorePushPullEx(kv, 2, vk, 2, okk, vv, oo, 0)), NULL);
        say("o=[x,y] -> %s %s", values(o1), values(o2));
      }
    }
    end_store(kv);
  }
}

/* Broadcast = Init(vkeys) then Pull(okeys). */
static void scn_broadcast(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("broadcast/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int vk[2] = {3, 5};
    NDArrayHandle vv[2] = {mkfill(0, 2, 1.25), mkfill(1, 2, 2.5)};
    NDArrayHandle o1 = mkfill(0, 2, -1), o2 = mkfill(1, 2, -1), o3 = mkfill(2, 2, -1);
    if (vv[0] && vv[1] && o1 && o2 && o3) {
      int okk[3] = {5, 3, 3};
      NDArrayHandle oo[3] = {o1, o2, o3};
      report("broadcast v=[3,5] o=[5,3,3]",
             settle(MXKVStoreBroadcast(kv, 2, vk, 3, okk, vv, oo, 0)), NULL);
      say("o -> %s %s %s", values(o1), values(o2), values(o3));
      int k8 = 8;
      NDArrayHandle v8 = mkfill(0, 2, 8);
      if (v8) {
        report("broadcast v=[8] o=[3]",
               settle(MXKVStoreBroadcast(kv, 1, &k8, 1, &vk[0], &v8, &o1, 0)), NULL);
        say("o=[3] -> %s", values(o1));
        pull_show(kv, "pull 8", 8, o2, NULL);
      }
      report("broadcast v=[3] again",
             settle(MXKVStoreBroadcast(kv, 1, &vk[0], 1, &vk[0], &vv[1], &o1, 0)),
             "duplicate init of key 3");
      pull_show(kv, "pull 3 after failed broadcast", 3, o1, NULL);
      int dk[2] = {11, 11};
      NDArrayHandle dv[2] = {mkfill(0, 2, 111), mkfill(0, 2, 222)};
      if (dv[0] && dv[1]) {
        report("broadcast v=[11,11]", settle(MXKVStoreBroadcast(kv, 2, dk, 1, dk, dv, &o1, 0)),
               "duplicate init of key 11");
        pull_show_as("partial", kv, "pull 11 after failed broadcast", 11, o2,
                     "key 11 has not been inited");
      }
      /* okeys empty: init only */
      int k12 = 12;
      NDArrayHandle v12 = mkfill(0, 2, 12);
      if (v12) {
        report("broadcast v=[12] onum=0",
               settle(MXKVStoreBroadcast(kv, 1, &k12, 0, NULL, &v12, NULL, 0)), NULL);
        pull_show(kv, "pull 12", 12, o1, NULL);
      }
    }
    end_store(kv);
  }
  set_scn("broadcast/str");
  KVStoreHandle kv = new_store("local");
  if (kv) {
    const char *vk[2] = {"w", "b"};
    NDArrayHandle vv[2] = {mkfill(0, 2, 1), mkfill(0, 2, 2)};
    NDArrayHandle o1 = mkfill(0, 2, -1), o2 = mkfill(0, 2, -1);
    if (vv[0] && vv[1] && o1 && o2) {
      const char *okk[2] = {"b", "w"};
      NDArrayHandle oo[2] = {o1, o2};
      report("broadcast_ex v=[w,b] o=[b,w]",
             settle(MXKVStoreBroadcastEx(kv, 2, vk, 2, okk, vv, oo, 0)), NULL);
      say("o -> %s %s", values(o1), values(o2));
      report("broadcast_ex v=[w] again", settle(MXKVStoreBroadcastEx(kv, 1, vk, 1, vk, vv, oo, 0)),
             "duplicate init of key w");
      const char *nk = "n";
      const char *missing = "missing";
      report("broadcast_ex v=[n] o=[missing]",
             settle(MXKVStoreBroadcastEx(kv, 1, &nk, 1, &missing, vv, oo, 0)),
             "key missing doesn't exist. Did you init?");
      pull_show_ex_as("partial", kv, "pull_ex n after failed broadcast", "n", o1,
                      "key 2 has not been inited");
    }
    end_store(kv);
  }
}

/* Pull into several outputs, and into outputs of other dtypes. */
static void scn_pull_multi(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("pull-multi/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int ik[2] = {3, 5};
    NDArrayHandle iv[2] = {mkfill(0, 2, 3), mkfill(0, 2, 5)};
    NDArrayHandle o[4] = {mkfill(0, 2, -1), mkfill(1, 2, -1), mkfill(2, 2, -1), mkfill(3, 2, -1)};
    if (iv[0] && iv[1] && o[0] && o[1] && o[2] && o[3]) {
      report("init [3,5]", settle(MXKVStoreInit(kv, 2, ik, iv)), NULL);
      int pk[2] = {3, 3};
      report("pull [3,3]", settle(MXKVStorePull(kv, 2, pk, o, 0)), NULL);
      say("outs -> %s %s", values(o[0]), values(o[1]));
      int qk[4] = {5, 3, 5, 3};
      report("pull [5,3,5,3]", settle(MXKVStorePull(kv, 4, qk, o, 0)), NULL);
      say("outs -> %s %s %s %s", values(o[0]), values(o[1]), values(o[2]), values(o[3]));
      say("ctx -> %s %s %s %s", ctx_text(o[0]), ctx_text(o[1]), ctx_text(o[2]), ctx_text(o[3]));
      /* after a multi-value push (device store fills outputs via the merge buffer) */
      int mk2[2] = {3, 3};
      NDArrayHandle mv[2] = {mkfill(0, 2, 0.5), mkfill(1, 2, 0.25)};
      if (mv[0] && mv[1]) {
        report("push [3,3]", settle(MXKVStorePush(kv, 2, mk2, mv, 0)), NULL);
        report("pull [5,3,5,3]", settle(MXKVStorePull(kv, 4, qk, o, 0)), NULL);
        say("outs -> %s %s %s %s", values(o[0]), values(o[1]), values(o[2]), values(o[3]));
      }
      report("pull_with_sparse [3,5] ignore=1",
             settle(MXKVStorePullWithSparse(kv, 2, ik, o, 0, true)), NULL);
      say("outs -> %s %s", values(o[0]), values(o[1]));
      report("pull_with_sparse [5,3] ignore=0",
             settle(MXKVStorePullWithSparse(kv, 2, qk, o, 0, false)), NULL);
      say("outs -> %s %s", values(o[0]), values(o[1]));
      int stype = -9;
      int rc = MXNDArrayGetStorageType(o[0], &stype);
      say("out storage type: %s stype=%d", rc_text(rc, NULL), stype);
    }
    end_store(kv);
  }
  set_scn("pull-multi/str");
  KVStoreHandle kv = new_store("local");
  if (kv) {
    const char *k = "p";
    NDArrayHandle v = mkfill(0, 2, 9), o1 = mkfill(0, 2, -1), o2 = mkfill(0, 2, -1);
    if (v && o1 && o2) {
      report("init_ex p", settle(MXKVStoreInitEx(kv, 1, &k, &v)), NULL);
      const char *pk[2] = {"p", "p"};
      NDArrayHandle oo[2] = {o1, o2};
      report("pull_with_sparse_ex [p,p] ignore=1",
             settle(MXKVStorePullWithSparseEx(kv, 2, pk, oo, 0, true)), NULL);
      say("outs -> %s %s", values(o1), values(o2));
    }
    end_store(kv);
  }
}

/* Pull converts to the output's dtype. */
struct cast_case {
  const char *label;
  int src;
  int n;
  double vals[8];     /* float sources */
  uint64_t ivals[8];  /* integer sources (raw bits) */
  int dsts[12];
  int ndst;
};

static void scn_pull_cast(void) {
  const double e11 = 1.0 / 2048, e12 = 1.0 / 4096, e8 = 1.0 / 256, e9 = 1.0 / 512;
  const struct cast_case cases[] = {
      {"f32 1.7,-2.7,3.5", F32, 5, {1.7, -2.7, 3.5, 0, 100.25}, {0},
       {I32, I8, I64, F64, F16, BF16, F32, I16}, 8},
      {"f32 non-negative", F32, 5, {1.7, 2.7, 3.5, 0, 200.9}, {0},
       {U8, I32, U16, U32, U64}, 5},
      {"f32 to half rounding", F32, 8,
       {1 + e11, 1 + 3 * e12, 1e-8, 6e-8, 70000, 65519, 65520, -1 - e11}, {0}, {F16}, 1},
      {"f32 to bf16 rounding", F32, 6, {1 + e8, 1 + 3 * e9, 1 - e9 / 2, 3.0e38, -1 - e8, 1e-40},
       {0}, {BF16}, 1},
      {"f64 to f32/f16", F64, 5,
       {1 + e11 + 1.0 / 1099511627776.0, 0.1, 1.0000000596046448, 1e300 / 1e300, -2.5}, {0},
       {F32, F16, I32}, 3},
      {"f16 to others", F16, 5, {1.5, -2.5, 0.0009765625, 100, 3.140625}, {0},
       {F32, F64, I32, I8}, 4},
      {"i32 to floats", I32, 5, {0},
       {16777217, (uint64_t)-16777217, 2049, 7, (uint64_t)-3}, {F32, F64, F16, I64, I8}, 5},
      {"i32 narrowing", I32, 4, {0}, {300, (uint64_t)-200, 127, 65537}, {I8, U8, I16}, 3},
      {"i64 narrowing", I64, 4, {0}, {4294967301ull, (uint64_t)-1, 1ull << 40, 9}, {I32, F32}, 2},
      {"u8 to signed", U8, 4, {0}, {200, 0, 255, 127}, {I8, I32, F32}, 3},
      {"i8 to others", I8, 4, {0}, {(uint64_t)-128, 127, (uint64_t)-1, 0}, {I32, F16, I64}, 3},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
    const struct cast_case *cc = &cases[c];
    set_scn("pull-cast/%s", cc->label);
    KVStoreHandle kv = new_store("local");
    if (!kv) continue;
    size_t n = (size_t)cc->n;
    NDArrayHandle src = dtype_is_float(cc->src) ? mkd("cast src", cc->src, n, cc->vals)
                                                : mki("cast src", cc->src, n, cc->ivals);
    int key = 3;
    if (src && settle(MXKVStoreInit(kv, 1, &key, &src)) == 0) {
      say("src %s", describe(src));
      for (int d = 0; d < cc->ndst; ++d) {
        set_scn("%s/%s", dtype_is_extra(cc->dsts[d]) ? "pull-cast-extra" : "pull-cast", cc->label);
        uint32_t shape[1] = {(uint32_t)cc->n};
        NDArrayHandle out = mk("cast out", cc->dsts[d], 1, shape, NULL);
        if (!out) continue;
        int rc = settle(MXKVStorePull(kv, 1, &key, &out, 0));
        if (rc == 0)
          say("into dtype=%d: rc=0 %s", cc->dsts[d], describe(out));
        else
          say("into dtype=%d: %s", cc->dsts[d], rc_text(rc, "Unknown type enum"));
      }
    }
    end_store(kv);
  }
}

/* .params files written by MXNDArraySave, and read back. */
static void hexdump_file_as(const char *prefix, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (prefix)
      say_as(prefix, "file: missing");
    else
      say("file: missing");
    return;
  }
  unsigned char buf[4096];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  char line[8300];
  size_t len = 0;
  for (size_t i = 0; i < n; ++i)
    len += (size_t)snprintf(line + len, sizeof line - len, "%02x", buf[i]);
  if (prefix)
    say_as(prefix, "file size=%zu bytes=%s", n, line);
  else
    say("file size=%zu bytes=%s", n, line);
}

static void hexdump_file(const char *path) { hexdump_file_as(NULL, path); }

static void show_loaded(const char *path) {
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arrs = NULL;
  const char **names = NULL;
  int rc = MXNDArrayLoad(path, &n, &arrs, &nn, &names);
  say("load: %s count=%u names=%u", rc_text(rc, NULL), rc ? 0 : n, rc ? 0 : nn);
  if (rc != 0) return;
  NDArrayHandle copy[64];
  char namebuf[64][64];
  for (uint32_t i = 0; i < n && i < 64; ++i) copy[i] = arrs[i];
  for (uint32_t i = 0; i < nn && i < 64; ++i) snprintf(namebuf[i], 64, "%s", quoted(names[i]));
  for (uint32_t i = 0; i < n && i < 64; ++i) {
    track(copy[i]);
    int stype = -9;
    int src = MXNDArrayGetStorageType(copy[i], &stype);
    int ndim = -9;
    const int *dims = NULL;
    MXNDArrayGetShapeEx(copy[i], &ndim, &dims);
    if (ndim <= 0) {
      say("loaded[%u] name=%s stype=%d(rc=%d) ndim=%d", i, i < nn ? namebuf[i] : "-", stype, src,
          ndim);
      continue;
    }
    say("loaded[%u] name=%s stype=%d ctx=%s %s", i, i < nn ? namebuf[i] : "-", stype,
        ctx_text(copy[i]), describe(copy[i]));
  }
}

static void scn_params(void) {
  const char *dir = getenv("SCENARIO_TMP");
  if (!dir || !*dir) dir = "/tmp";
  char path[1024];
  set_scn("params/named");
  {
    snprintf(path, sizeof path, "%s/mxkv-scenario-%ld-named.params", dir, (long)getpid());
    const uint32_t s23[2] = {2, 3};
    const float w[6] = {1, -2, 3.5f, 0.1f, 1e8f, -0.0f};
    NDArrayHandle a = mk("params", F32, 2, s23, w);
    const uint64_t bias[1] = {(uint64_t)-5};
    NDArrayHandle b = mki("params", I64, 1, bias);
    const double h[3] = {1.5, -0.25, 65504};
    uint32_t s3[1] = {3};
    unsigned char hb[6];
    for (int i = 0; i < 3; ++i) put_float(F16, hb, (size_t)i, h[i]);
    NDArrayHandle c = mk_on("params", F16, 1, s3, 1, 1, hb); /* on cpu(1) */
    if (a && b && c) {
      NDArrayHandle arrs[3] = {a, b, c};
      const char *names[3] = {"w", "bias", "\xc3\xa9t\xc3\xa9"};
      report("save", settle(MXNDArraySave(path, 3, arrs, names)), NULL);
      hexdump_file(path);
      show_loaded(path);
    }
    remove(path);
    free_arrays();
  }
  set_scn("params/unnamed");
  {
    snprintf(path, sizeof path, "%s/mxkv-scenario-%ld-unnamed.params", dir, (long)getpid());
    const uint64_t u[4] = {0, 255, 7, 128};
    NDArrayHandle a = mki("params", U8, 4, u);
    const double d[2] = {0.1, -1e300};
    NDArrayHandle b = mkd("params", F64, 2, d);
    const uint32_t s221[3] = {2, 2, 1};
    int32_t iv[4] = {1, -1, 2147483647, -2147483647 - 1};
    NDArrayHandle c = mk("params", I32, 3, s221, iv);
    if (a && b && c) {
      NDArrayHandle arrs[3] = {a, b, c};
      report("save", settle(MXNDArraySave(path, 3, arrs, NULL)), NULL);
      hexdump_file(path);
      show_loaded(path);
    }
    remove(path);
    free_arrays();
  }
  set_scn("params/single");
  {
    snprintf(path, sizeof path, "%s/mxkv-scenario-%ld-single.params", dir, (long)getpid());
    const double d[1] = {42};
    NDArrayHandle a = mkd("params", F32, 1, d);
    if (a) {
      const char *names[1] = {"only"};
      report("save", settle(MXNDArraySave(path, 1, &a, names)), NULL);
      hexdump_file(path);
      show_loaded(path);
    }
    remove(path);
    free_arrays();
  }
  set_scn("params/pulled");
  {
    /* save what a store hands back */
    snprintf(path, sizeof path, "%s/mxkv-scenario-%ld-pulled.params", dir, (long)getpid());
    KVStoreHandle kv = new_store("local");
    if (kv) {
      int keys[2] = {3, 3};
      NDArrayHandle init = mkfill(0, 3, 1), out = mkfill(0, 3, 0);
      NDArrayHandle pv[2] = {mkfill(0, 3, 0.5), mkfill(0, 3, 0.25)};
      if (init && out && pv[0] && pv[1]) {
        settle(MXKVStoreInit(kv, 1, keys, &init));
        settle(MXKVStorePush(kv, 2, keys, pv, 0));
        settle(MXKVStorePull(kv, 1, keys, &out, 0));
        const char *names[1] = {"arg:w"};
        report("save", settle(MXNDArraySave(path, 1, &out, names)), NULL);
        hexdump_file(path);
        show_loaded(path);
      }
      remove(path);
      end_store(kv);
    }
  }
  set_scn("params/none");
  {
    /* a none array (MXNDArrayCreateNone) between two real ones */
    snprintf(path, sizeof path, "%s/mxkv-scenario-%ld-none.params", dir, (long)getpid());
    NDArrayHandle none = NULL;
    int rc = MXNDArrayCreateNone(&none);
    report("create_none", rc, NULL);
    if (rc == 0) {
      track(none);
      const double d[2] = {1, 2};
      NDArrayHandle a = mkd("params", F32, 2, d);
      const uint64_t u[1] = {9};
      NDArrayHandle b = mki("params", I32, 1, u);
      if (a && b) {
        NDArrayHandle arrs[3] = {a, none, b};
        const char *names[3] = {"a", "none", "b"};
        /* MXNet 1.9.1 refuses it, after writing the records before it */
        rc = settle(MXNDArraySave(path, 3, arrs, names));
        report("save", rc, "Unknown storage type-1");
        if (rc == 0) {
          hexdump_file(path);
          show_loaded(path);
        } else {
          hexdump_file_as("partial", path);
        }
      }
    }
    remove(path);
    free_arrays();
  }
  set_scn("params/bad-file");
  {
    snprintf(path, sizeof path, "%s/mxkv-scenario-%ld-bad.params", dir, (long)getpid());
    FILE *f = fopen(path, "wb");
    if (f) {
      const unsigned char junk[16] = {0x13, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      fwrite(junk, 1, sizeof junk, f);
      fclose(f);
      uint32_t n = 0, nn = 0;
      NDArrayHandle *arrs = NULL;
      const char **names = NULL;
      report("load", MXNDArrayLoad(path, &n, &arrs, &nn, &names), "Invalid NDArray file format");
      remove(path);
    }
  }
}

/* Errors MXNet reports cleanly. */
static void scn_errors(void) {
  set_scn("errors/dup-init");
  KVStoreHandle kv = new_store("local");
  if (kv) {
    int k3 = 3;
    NDArrayHandle v = mkfill(0, 2, 1), w = mkfill(0, 2, 2), out = mkfill(0, 2, -1);
    if (v && w && out) {
      report("init 3", settle(MXKVStoreInit(kv, 1, &k3, &v)), NULL);
      report("init 3 again", settle(MXKVStoreInit(kv, 1, &k3, &w)),
             "duplicate init of key 3. Please double check if you called kv.init or "
             "kv.broadcast with this key multiple times");
      pull_show(kv, "pull 3", 3, out, NULL);
    }
    end_store(kv);
  }
  set_scn("errors/dup-init-within-call");
  kv = new_store("local");
  if (kv) {
    int keys[3] = {1, 2, 1};
    NDArrayHandle vals[3] = {mkfill(0, 2, 1), mkfill(0, 2, 2), mkfill(0, 2, 3)};
    NDArrayHandle out = mkfill(0, 2, -1);
    if (vals[0] && vals[1] && vals[2] && out) {
      report("init [1,2,1]", settle(MXKVStoreInit(kv, 3, keys, vals)), "duplicate init of key 1");
      pull_show_as("partial", kv, "pull 1", 1, out, "key 1 has not been inited");
      pull_show_as("partial", kv, "pull 2", 2, out, "key 2 has not been inited");
      int rc = settle(MXKVStoreInit(kv, 1, &keys[1], &vals[2]));
      say_as("partial", "init 2 again: %s", rc_text(rc, "duplicate init of key 2"));
    }
    end_store(kv);
  }
  set_scn("errors/dup-init-pair");
  kv = new_store("local");
  if (kv) {
    int keys[2] = {5, 5};
    NDArrayHandle vals[2] = {mkfill(0, 2, 1), mkfill(0, 2, 2)};
    NDArrayHandle out = mkfill(0, 2, -1);
    if (vals[0] && vals[1] && out) {
      report("init [5,5]", settle(MXKVStoreInit(kv, 2, keys, vals)), "duplicate init of key 5");
      pull_show_as("partial", kv, "pull 5", 5, out, "key 5 has not been inited");
    }
    end_store(kv);
  }
  set_scn("errors/dup-init-ex");
  kv = new_store("local");
  if (kv) {
    const char *w = "w";
    const char *keys[3] = {"p", "q", "p"};
    NDArrayHandle vals[3] = {mkfill(0, 2, 1), mkfill(0, 2, 2), mkfill(0, 2, 3)};
    NDArrayHandle out = mkfill(0, 2, -1);
    if (vals[0] && vals[1] && vals[2] && out) {
      report("init_ex w", settle(MXKVStoreInitEx(kv, 1, &w, vals)), NULL);
      report("init_ex w again", settle(MXKVStoreInitEx(kv, 1, &w, &vals[1])),
             "duplicate init of key w");
      pull_show_ex(kv, "pull_ex w", "w", out, NULL);
      report("init_ex [p,q,p]", settle(MXKVStoreInitEx(kv, 3, keys, vals)),
             "duplicate init of key p");
      pull_show_ex_as("partial", kv, "pull_ex p", "p", out, "key 1 has not been inited");
      pull_show_ex_as("partial", kv, "pull_ex q", "q", out, "key 2 has not been inited");
      int rc = settle(MXKVStoreInitEx(kv, 1, &keys[1], &vals[1]));
      say_as("partial", "init_ex q again: %s", rc_text(rc, "duplicate init of key q"));
    }
    end_store(kv);
  }
  for (int s = 0; s < 2; ++s) {
    set_scn("errors/uninit-and-unknown/%s", kStoreTypes[s]);
    kv = new_store(kStoreTypes[s]);
    if (kv) {
      int k3 = 3, k99 = 99;
      NDArrayHandle v = mkfill(0, 2, 1), out = mkfill(0, 2, -1);
      if (v && out) {
        report("init 3", settle(MXKVStoreInit(kv, 1, &k3, &v)), NULL);
        pull_show(kv, "pull 99", 99, out, "key 99 has not been inited");
        int two[2] = {3, 99};
        NDArrayHandle o2[2] = {out, mkfill(0, 2, -1)};
        if (o2[1]) {
          int rc = settle(MXKVStorePull(kv, 2, two, o2, 0));
          report("pull [3,99]", rc, "key 99 has not been inited");
        }
        report("pushpull v=[3] o=[99]",
               settle(MXKVStorePushPull(kv, 1, &k3, 1, &k99, &v, &out, 0)),
               "key 99 has not been inited");
        pull_show_as("partial", kv, "pull 3 after failed pushpull", 3, out, NULL);
      }
      end_store(kv);
    }
    set_scn("errors/unknown-string/%s", kStoreTypes[s]);
    kv = new_store(kStoreTypes[s]);
    if (kv) {
      const char *w = "w", *nope = "nope";
      NDArrayHandle v = mkfill(0, 2, 1), out = mkfill(0, 2, -1);
      if (v && out) {
        report("init_ex w", settle(MXKVStoreInitEx(kv, 1, &w, &v)), NULL);
        report("pull_ex nope", settle(MXKVStorePullEx(kv, 1, &nope, &out, 0)),
               "key nope doesn't exist. Did you init?");
        report("push_ex nope", settle(MXKVStorePushEx(kv, 1, &nope, &v, 0)),
               "key nope doesn't exist. Did you init?");
        const char *two[2] = {"w", "nope"};
        NDArrayHandle v2[2] = {v, v};
        report("push_ex [w,nope]", settle(MXKVStorePushEx(kv, 2, two, v2, 0)),
               "key nope doesn't exist. Did you init?");
        pull_show_ex(kv, "pull_ex w (nothing pushed)", "w", out, NULL);
        report("pushpull_ex v=[nope] o=[w]",
               settle(MXKVStorePushPullEx(kv, 1, &nope, 1, &w, &v, &out, 0)),
               "key nope doesn't exist. Did you init?");
        report("pushpull_ex v=[w] o=[nope]",
               settle(MXKVStorePushPullEx(kv, 1, &w, 1, &nope, &v, &out, 0)),
               "key nope doesn't exist. Did you init?");
        const char *empty = "";
        report("pull_ex \"\"", settle(MXKVStorePullEx(kv, 1, &empty, &out, 0)),
               "key  doesn't exist. Did you init?");
      }
      end_store(kv);
    }
    set_scn("errors/shape/%s", kStoreTypes[s]);
    kv = new_store(kStoreTypes[s]);
    if (kv) {
      int k3 = 3, k5 = 5;
      NDArrayHandle v = mkfill(0, 3, 1), v5 = mkfill(0, 2, 5);
      NDArrayHandle o2 = mkfill(0, 2, -1), o3 = mkfill(0, 3, -1);
      const uint32_t s13[2] = {1, 3};
      float m13[3] = {0, 0, 0};
      NDArrayHandle o13 = mk("o13", F32, 2, s13, m13);
      if (v && v5 && o2 && o3 && o13) {
        report("init 3 shape (3,)", settle(MXKVStoreInit(kv, 1, &k3, &v)), NULL);
        report("init 5 shape (2,)", settle(MXKVStoreInit(kv, 1, &k5, &v5)), NULL);
        pull_show(kv, "pull 3 into (2,)", 3, o2,
                  "operands shape mismatch from.shape = [3] to.shape=[2]");
        pull_show(kv, "pull 3 into (1,3)", 3, o13,
                  "operands shape mismatch from.shape = [3] to.shape=[1,3]");
        int two[2] = {5, 3};
        NDArrayHandle oo[2] = {o3, o3};
        report("pull [5,3] into (3,),(3,)", settle(MXKVStorePull(kv, 2, two, oo, 0)),
               "operands shape mismatch from.shape = [2] to.shape=[3]");
        pull_show(kv, "pull 3 into (3,)", 3, o3, NULL);
        int kk[2] = {3, 3};
        NDArrayHandle w1 = mkfill(0, 2, 1), w2 = mkfill(0, 2, 2);
        NDArrayHandle wv[2] = {w1, w2};
        if (w1 && w2) {
          report("push [3,3] of shape (2,)", settle(MXKVStorePush(kv, 2, kk, wv, 0)),
                 "operands shape mismatch");
          pull_show(kv, "pull 3 after failed push", 3, o3, NULL);
        }
      }
      end_store(kv);
    }
  }
  set_scn("errors/rowsparse-on-dense");
  kv = new_store("local");
  if (kv) {
    int k3 = 3;
    NDArrayHandle v = mkfill(0, 2, 1), out = mkfill(0, 2, -1);
    const uint64_t rows[1] = {0};
    NDArrayHandle rid = mki("rowid", I64, 1, rows);
    if (v && out && rid) {
      report("init 3", settle(MXKVStoreInit(kv, 1, &k3, &v)), NULL);
      report("pull_row_sparse into dense",
             settle(MXKVStorePullRowSparse(kv, 1, &k3, &out, &rid, 0)),
             "Expected row_sparse storage type for row_sparse_pull values, "
             "but detected storage type 0");
    }
    end_store(kv);
  }
  set_scn("errors/none-array");
  {
    NDArrayHandle none = NULL;
    int rc = MXNDArrayCreateNone(&none);
    report("create_none", rc, NULL);
    if (rc == 0) {
      track(none);
      int stype = -9, ndim = -9;
      const int *dims = NULL;
      rc = MXNDArrayGetStorageType(none, &stype);
      say("storage type: %s stype=%d", rc_text(rc, NULL), stype);
      rc = MXNDArrayGetShapeEx(none, &ndim, &dims);
      say("shape: %s ndim=%d", rc_text(rc, NULL), ndim);
    }
    free_arrays();
  }
}

/* num == 0 with NULL arrays: accepted everywhere. */
static void scn_num0(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("num0/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    report("init", settle(MXKVStoreInit(kv, 0, NULL, NULL)), NULL);
    report("push", settle(MXKVStorePush(kv, 0, NULL, NULL, 0)), NULL);
    report("pull", settle(MXKVStorePull(kv, 0, NULL, NULL, 0)), NULL);
    report("pull_with_sparse", settle(MXKVStorePullWithSparse(kv, 0, NULL, NULL, 0, false)), NULL);
    report("pushpull", settle(MXKVStorePushPull(kv, 0, NULL, 0, NULL, NULL, NULL, 0)), NULL);
    report("broadcast", settle(MXKVStoreBroadcast(kv, 0, NULL, 0, NULL, NULL, NULL, 0)), NULL);
    end_store(kv);
    set_scn("num0-ex/%s", kStoreTypes[s]);
    kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    report("init_ex", settle(MXKVStoreInitEx(kv, 0, NULL, NULL)), NULL);
    report("push_ex", settle(MXKVStorePushEx(kv, 0, NULL, NULL, 0)), NULL);
    report("pull_ex", settle(MXKVStorePullEx(kv, 0, NULL, NULL, 0)), NULL);
    report("pull_with_sparse_ex", settle(MXKVStorePullWithSparseEx(kv, 0, NULL, NULL, 0, true)),
           NULL);
    report("pushpull_ex", settle(MXKVStorePushPullEx(kv, 0, NULL, 0, NULL, NULL, NULL, 0)), NULL);
    report("broadcast_ex", settle(MXKVStoreBroadcastEx(kv, 0, NULL, 0, NULL, NULL, NULL, 0)), NULL);
    end_store(kv);
  }
  /* does a num == 0 call fix the key type? */
  set_scn("num0/locks-key-type");
  KVStoreHandle kv = new_store("local");
  if (kv) {
    const char *w = "w";
    NDArrayHandle v = mkfill(0, 2, 1);
    if (v) {
      report("init num=0", settle(MXKVStoreInit(kv, 0, NULL, NULL)), NULL);
      report("init_ex w", settle(MXKVStoreInitEx(kv, 1, &w, &v)),
             "Mixed key types are not allowed");
    }
    end_store(kv);
  }
}

/* Errors whose wording libmxkv changes on purpose. */
static void scn_deviations(void) {
  for (int s = 0; s < 2; ++s) {
    set_scn("push-uninit/%s", kStoreTypes[s]);
    KVStoreHandle kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    int k3 = 3, k99 = 99;
    NDArrayHandle v = mkfill(0, 2, 1), out = mkfill(0, 2, -1);
    if (v && out) {
      report("init 3", settle(MXKVStoreInit(kv, 1, &k3, &v)), NULL);
      int rc = settle(MXKVStorePush(kv, 1, &k99, &v, 0));
      say_as("deviate", "push 99 (1 value): %s", rc_text(rc, "key 99 has not been inited"));
      if (s == 1) {
        int kk[2] = {77, 77};
        NDArrayHandle vv[2] = {v, v};
        rc = settle(MXKVStorePush(kv, 2, kk, vv, 0));
        say_as("deviate", "push [77,77]: %s", rc_text(rc, "key 77 has not been inited"));
      }
    }
    end_store(kv);
    set_scn("push-uninit-updater/%s", kStoreTypes[s]);
    kv = new_store(kStoreTypes[s]);
    if (!kv) continue;
    struct updater_ctx u = {UPDATER_MAGIC, false, {0}, 0, 2.0};
    v = mkfill(0, 2, 1);
    if (v) {
      report("init 3", settle(MXKVStoreInit(kv, 1, &k3, &v)), NULL);
      report("set_updater", MXKVStoreSetUpdater(kv, int_updater, &u), NULL);
      /* with an updater set MXNet already says "has not been inited" */
      report("push 99 (1 value)", settle(MXKVStorePush(kv, 1, &k99, &v, 0)),
             "key 99 has not been inited");
    }
    end_store(kv);
  }
}

/* ------------------------------------------------------------------------- */

struct scenario {
  const char *name;
  void (*run)(void);
};

static const struct scenario kScenarios[] = {
    {"version", scn_version},
    {"tutorial", scn_tutorial},
    {"types", scn_types},
    {"node", scn_node},
    {"dtype", scn_dtypes},
    {"bool", scn_bool},
    {"keys-int", scn_keys_int},
    {"keys-str", scn_keys_str},
    {"mixed", scn_mixed},
    {"agg", scn_agg},
    {"agg-long", scn_agg_long},
    {"agg-multikey", scn_agg_multikey},
    {"dupkeys", scn_dupkeys},
    {"updater-int", scn_updater_int},
    {"updater-str", scn_updater_str},
    {"pushpull", scn_pushpull},
    {"broadcast", scn_broadcast},
    {"pull-multi", scn_pull_multi},
    {"pull-cast", scn_pull_cast},
    {"params", scn_params},
    {"errors", scn_errors},
    {"num0", scn_num0},
    {"deviations", scn_deviations},
};

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s LIBRARY.so [FILTER]\n", argv[0]);
    return 2;
  }
  const char *dbg = getenv("SCENARIO_DEBUG");
  g_debug = dbg && *dbg && strcmp(dbg, "0") != 0;
  if (!load_api(argv[1])) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (size_t i = 0; i < sizeof kScenarios / sizeof kScenarios[0]; ++i) {
    if (argc == 3 && !strstr(kScenarios[i].name, argv[2])) continue;
    kScenarios[i].run();
    fflush(stdout);
  }
  return 0;
}
