/*
 * kvbench: libmxkv against MXNet 1.9.1, side by side, through MXNet's C API.
 *
 *   kvbench [--smoke] [--only SUBSTR] [--csv FILE] LIB_A.so LIB_B.so
 *   kvbench --rss-child LIB.so BYTES_PER_KEY NKEYS      (internal: peak-RSS child)
 *
 * Both libraries are dlopen'ed (RTLD_NOW | RTLD_LOCAL) into this one process
 * and every function is resolved with dlsym, with our own typedefs of MXNet
 * 1.9.1's signatures (c_api.h). Every figure is set up in both libraries, warmed
 * up (A, B), calibrated (iterations per repetition so that one repetition lasts
 * about a fixed time), then timed A B A B ... for several repetitions. Each
 * timed region is `iters` operations followed by MXNDArrayWaitAll. After the
 * timing the values the store hands back are read and compared exactly with
 * the expected ones (all test values are small integers or halves, exact in
 * float32 under any summation order); a wrong value is a failure and the
 * program exits 1.
 *
 * Figures (float32, CPU contexts, `local` store, no updater):
 *   push       k = 1, 2, 4, 8 inputs on cpu(0..k-1), one key
 *   pull       n = 1, 2, 8 outputs on cpu(0..n-1), one key
 *   pushpull   k = 2, 8 inputs and k outputs
 *   init       one fresh key per operation
 *   pair       1-element push + pull (async: N pairs then WaitAll;
 *              sync: each pull followed by WaitToRead of its output)
 *   keys1000   1000 keys x 256 floats, one Push call vs 1000 Push calls
 *   rss        peak RSS of a child process (fork + exec of this program, before
 *              the libraries are loaded here: Linux keeps a child's RSS high-water
 *              mark across exec, so forking a big process would inflate it):
 *              init 16 keys x 64 MB on cpu(0), push 2 values to each, pull each
 *   rsp_pull   MXKVStorePullRowSparse of m rows from an R x 64 row_sparse key
 *   rsp_push   push of one (or two) row_sparse values of 1000 rows
 * and the machine limits (plain C, pthreads, 1 and 2 threads, at the start and
 * at the end of the run): memcpy (the faster of one glibc memcpy per thread and
 * 64 KB memcpy's), one-pass k-input float32 sum, broadcast copy (read once,
 * write n outputs).
 *
 * Bytes moved per operation = bytes of every input read + every output
 * written (the stored value counts as an output of push and init, as the
 * input of pull): push (k+1)S, pull (n+1)S, pushpull 2kS, init 2S,
 * memcpy 2S, k-sum (k+1)S, broadcast (n+1)S; row_sparse: rows x 264 B read +
 * rows x 264 B written (256 B of data + 8 B of row index per row).
 *
 * Output: CSV (one row per figure and library) on --csv FILE or stdout;
 * progress on stderr. Exit status: 0, 1 if any value was wrong or a dense call
 * failed, 2 on usage/load errors. A sparse figure a library refuses (a call
 * returns -1) is reported with status "na" and does not fail the run.
 *
 * Build: gcc -std=gnu11 -O3 -Wall -Wextra -Werror kvbench.c -o kvbench -ldl -lpthread -lm
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * The C API (MXNet 1.9.1 signatures), resolved per library with dlsym.
 * ---------------------------------------------------------------------- */
typedef void *NDArrayHandle;
typedef void *KVStoreHandle;

#define API_REQUIRED(X)                                                                        \
  X(const char *, MXGetLastError, (void))                                                      \
  X(int, MXGetVersion, (int *out))                                                             \
  X(int, MXNDArrayCreateEx,                                                                    \
    (const uint32_t *shape, uint32_t ndim, int dev_type, int dev_id, int delay_alloc,          \
     int dtype, NDArrayHandle *out))                                                           \
  X(int, MXNDArraySyncCopyFromCPU, (NDArrayHandle handle, const void *data, size_t size))      \
  X(int, MXNDArraySyncCopyToCPU, (NDArrayHandle handle, void *data, size_t size))              \
  X(int, MXNDArrayWaitAll, (void))                                                             \
  X(int, MXNDArrayWaitToRead, (NDArrayHandle handle))                                          \
  X(int, MXNDArrayFree, (NDArrayHandle handle))                                                \
  X(int, MXKVStoreCreate, (const char *type, KVStoreHandle *out))                              \
  X(int, MXKVStoreFree, (KVStoreHandle handle))                                                \
  X(int, MXKVStoreInit, (KVStoreHandle handle, uint32_t num, const int *keys,                  \
                         NDArrayHandle *vals))                                                 \
  X(int, MXKVStorePush, (KVStoreHandle handle, uint32_t num, const int *keys,                  \
                         NDArrayHandle *vals, int priority))                                   \
  X(int, MXKVStorePull, (KVStoreHandle handle, uint32_t num, const int *keys,                  \
                         NDArrayHandle *vals, int priority))                                   \
  X(int, MXKVStorePushPull,                                                                    \
    (KVStoreHandle handle, uint32_t vnum, const int *vkeys, uint32_t onum, const int *okeys,   \
     NDArrayHandle *vals, NDArrayHandle *outs, int priority))

/* Sparse entry points: a library lacking one gets "n/a" for the sparse figures. */
#define API_OPTIONAL(X)                                                                        \
  X(int, MXNDArrayCreateSparseEx,                                                              \
    (int storage_type, const uint32_t *shape, uint32_t ndim, int dev_type, int dev_id,         \
     int delay_alloc, int dtype, uint32_t num_aux, int *aux_type, uint32_t *aux_ndims,         \
     const uint32_t *aux_shape, NDArrayHandle *out))                                           \
  X(int, MXNDArrayGetDataNDArray, (NDArrayHandle handle, NDArrayHandle *out))                  \
  X(int, MXNDArrayGetAuxNDArray, (NDArrayHandle handle, uint32_t i, NDArrayHandle *out))       \
  X(int, MXNDArraySyncCopyFromNDArray,                                                         \
    (NDArrayHandle handle_dst, const NDArrayHandle handle_src, const int i))                   \
  X(int, MXNDArrayGetShapeEx, (NDArrayHandle handle, int *out_dim, const int **out_pdata))     \
  X(int, MXKVStorePullRowSparse,                                                               \
    (KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals,                 \
     const NDArrayHandle *row_ids, int priority))

typedef struct Lib {
  const char *path;
  char label[32]; /* "mxnet" or "mxkv" (from the file name) */
  int version;
  bool has_sparse_api;
  char err[600]; /* last failure, one line */
#define DECLARE_FN(ret, name, args) ret(*name) args;
  API_REQUIRED(DECLARE_FN)
  API_OPTIONAL(DECLARE_FN)
#undef DECLARE_FN
} Lib;

static void lib_label(const char *path, char *out, size_t n) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  if (strncmp(b, "lib", 3) == 0) b += 3;
  size_t len = strcspn(b, ".");
  if (len >= n) len = n - 1;
  memcpy(out, b, len);
  out[len] = 0;
}

static int lib_load(Lib *L, const char *path) {
  memset(L, 0, sizeof *L);
  L->path = path;
  lib_label(path, L->label, sizeof L->label);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "kvbench: cannot load %s: %s\n", path, dlerror());
    return -1;
  }
  int ok = 1;
#define RESOLVE_REQ(ret, name, args)                                       \
  {                                                                        \
    void *sym = dlsym(h, #name);                                           \
    if (!sym) {                                                            \
      fprintf(stderr, "kvbench: %s lacks symbol %s\n", path, #name);       \
      ok = 0;                                                              \
    }                                                                      \
    memcpy(&L->name, &sym, sizeof sym);                                    \
  }
  API_REQUIRED(RESOLVE_REQ)
#undef RESOLVE_REQ
  L->has_sparse_api = true;
#define RESOLVE_OPT(ret, name, args)                                       \
  {                                                                        \
    void *sym = dlsym(h, #name);                                           \
    if (!sym) L->has_sparse_api = false;                                   \
    memcpy(&L->name, &sym, sizeof sym);                                    \
  }
  API_OPTIONAL(RESOLVE_OPT)
#undef RESOLVE_OPT
  if (!ok) return -1;
  L->MXGetVersion(&L->version);
  /* never dlclose: MXNet's engine threads live until exit */
  return 0;
}

/* Record the library's error message (first line) for a failed call. */
static int fail_call(Lib *L, const char *what, int rc) {
  const char *m = L->MXGetLastError ? L->MXGetLastError() : "";
  if (!m) m = "";
  size_t len = strcspn(m, "\n");
  if (len > 400) len = 400;
  if (strncmp(what, "L->", 3) == 0) what += 3; /* TRY(L, L->Fn(args)): keep "Fn" */
  int wlen = (int)strcspn(what, "(");
  snprintf(L->err, sizeof L->err, "%.*s: rc=%d: %.*s", wlen, what, rc, (int)len, m);
  for (char *p = L->err; *p; p++)
    if (*p == ',' || *p == '"') *p = ';';
  return -1;
}

#define TRY(L, call)                                      \
  do {                                                    \
    int rc_ = (call);                                     \
    if (rc_ != 0) return fail_call((L), #call, rc_);      \
  } while (0)

/* ------------------------------------------------------------------------
 * Small helpers
 * ---------------------------------------------------------------------- */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void pause_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_of(const double *v, int n, double *mn, double *mx) {
  double *t = malloc(sizeof(double) * (size_t)n);
  memcpy(t, v, sizeof(double) * (size_t)n);
  qsort(t, (size_t)n, sizeof(double), cmp_double);
  *mn = t[0];
  *mx = t[n - 1];
  double m = (n % 2) ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  free(t);
  return m;
}

static void *xmalloc(size_t n) {
  void *p = NULL;
  /* page-aligned from 64 KB, like libmxkv's buffers: copies keep their page offset */
  if (posix_memalign(&p, n >= 65536 ? 4096 : 64, n ? n : 64) != 0) {
    fprintf(stderr, "kvbench: out of memory (%zu bytes)\n", n);
    _exit(2);
  }
  return p;
}

/* Test pattern: element j of a value = (j % 1000) * a + b (exact in float32). */
static float pat(size_t j, float a, float b) { return (float)(j % 1000) * a + b; }

static int g_corrupt; /* KVBENCH_CORRUPT=1: expect wrong values (tests the checks) */

static float *g_host;     /* host staging buffer, g_host_n floats */
static size_t g_host_n;

static float *host(size_t n) {
  if (n > g_host_n) {
    free(g_host);
    g_host = xmalloc(n * sizeof(float));
    g_host_n = n;
  }
  return g_host;
}

static int dense_new(Lib *L, size_t n, int dev_id, NDArrayHandle *out) {
  uint32_t shape[1] = {(uint32_t)n};
  TRY(L, L->MXNDArrayCreateEx(shape, 1, 1, dev_id, 0, 0, out));
  return 0;
}

static int dense_fill(Lib *L, NDArrayHandle h, size_t n, float a, float b) {
  float *p = host(n);
  for (size_t j = 0; j < n; j++) p[j] = pat(j, a, b);
  TRY(L, L->MXNDArraySyncCopyFromCPU(h, p, n));
  return 0;
}

/* 0: equal; 1: wrong value (message in L->err); -1: call failed. */
static int dense_check(Lib *L, NDArrayHandle h, size_t n, float a, float b, const char *what) {
  float *p = host(n);
  memset(p, 0xff, n * sizeof(float));
  TRY(L, L->MXNDArraySyncCopyToCPU(h, p, n));
  if (g_corrupt) b += 1.0f;
  for (size_t j = 0; j < n; j++) {
    float e = pat(j, a, b);
    if (memcmp(&p[j], &e, sizeof e) != 0) {
      snprintf(L->err, sizeof L->err, "%s: element %zu is %.9g; expected %.9g", what, j,
               (double)p[j], (double)e);
      return 1;
    }
  }
  return 0;
}

/* CPU seconds the whole machine spent busy (incl. steal), from /proc/stat. */
static double machine_busy_s(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return 0;
  unsigned long long v[10] = {0};
  int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                 &v[4], &v[5], &v[6], &v[7]);
  fclose(f);
  if (n < 8) return 0;
  unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]; /* minus idle, iowait */
  return (double)busy / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds used by this process and its waited-for children. */
static double own_cpu_s(void) {
  struct rusage a, b;
  getrusage(RUSAGE_SELF, &a);
  getrusage(RUSAGE_CHILDREN, &b);
  return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec + b.ru_stime.tv_sec) +
         1e-6 * (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec +
                         b.ru_stime.tv_usec);
}

/* ------------------------------------------------------------------------
 * Output
 * ---------------------------------------------------------------------- */
static FILE *g_csv;
static int g_failed;

static void csv_row(const char *figure, const char *variant, double size, const char *lib,
                    const char *unit, double med, double mn, double mx, int reps, long iters,
                    double bytes, const char *status, const char *note) {
  fprintf(g_csv, "c,%s,%s,%.0f,%s,%s,%.9g,%.9g,%.9g,%d,%ld,%.0f,%s,\"%s\"\n", figure, variant,
          size, lib, unit, med, mn, mx, reps, iters, bytes, status, note ? note : "");
  fflush(g_csv);
}

static void csv_meta(const char *key, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  for (char *p = buf; *p; p++)
    if (*p == '"') *p = '\'';
  fprintf(g_csv, "c,meta,%s,0,,,0,0,0,0,0,0,ok,\"%s\"\n", key, buf);
  fflush(g_csv);
}

static const char *human_size(size_t bytes, char *buf, size_t n) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    snprintf(buf, n, "%zuMB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    snprintf(buf, n, "%zuKB", bytes >> 10);
  else
    snprintf(buf, n, "%zuB", bytes);
  return buf;
}

/* ------------------------------------------------------------------------
 * Benchmark driver
 * ---------------------------------------------------------------------- */
#define MAXK 8
#define NKEYS_MANY 1000
#define MANY_ELEMS 256

typedef struct Shared Shared;

typedef struct St {
  KVStoreHandle kv;
  bool own_kv;
  NDArrayHandle in[MAXK], out[MAXK], val;
  size_t n; /* elements per value */
  int next_key;
  NDArrayHandle *many_in, *many_out;
  int *keys;
  /* sparse */
  Shared *sh;
  NDArrayHandle rids, rsp_out, rsp_val[2], check_ids;
  int64_t *ids;      /* ids of the figure (pull: requested; push: pushed union) */
  size_t nids;
} St;

typedef struct Fig Fig;
struct Fig {
  char figure[24];
  char variant[48];
  size_t size;  /* bytes of one value (0: not a size figure) */
  double bytes; /* bytes moved per operation (0: latency figure) */
  const char *unit;
  int k;
  int reps;
  double rep_time; /* seconds one timed region should last */
  long max_iters;
  int (*setup)(Lib *, St *, const Fig *);  /* 0 ok, 1 n/a, -1 failed */
  int (*run)(Lib *, St *, const Fig *, long iters);
  int (*check)(Lib *, St *, const Fig *); /* 0 ok, 1 wrong, -1 failed */
  bool sparse;
  /* the machine limit of this figure, timed in turn with the libraries in each
     repetition: lim_kind 0 memcpy, 1 k-input sum, 2 broadcast copy, 3 sum copied
     to k outputs, 4 copy into fresh memory; on 1..lim_threads threads (0: none) */
  int lim_kind, lim_k, lim_threads;
};

static Lib g_lib[2];
static int g_nlib;
static const char *g_only;
static bool g_smoke;

static void st_free(Lib *L, St *s) {
  L->MXNDArrayWaitAll();
  for (int i = 0; i < MAXK; i++) {
    if (s->in[i]) L->MXNDArrayFree(s->in[i]);
    if (s->out[i]) L->MXNDArrayFree(s->out[i]);
  }
  if (s->val) L->MXNDArrayFree(s->val);
  if (s->many_in)
    for (int i = 0; i < NKEYS_MANY; i++) {
      if (s->many_in[i]) L->MXNDArrayFree(s->many_in[i]);
      if (s->many_out[i]) L->MXNDArrayFree(s->many_out[i]);
    }
  free(s->many_in);
  free(s->many_out);
  free(s->keys);
  NDArrayHandle sp[] = {s->rids, s->rsp_out, s->rsp_val[0], s->rsp_val[1], s->check_ids};
  for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
    if (sp[i]) L->MXNDArrayFree(sp[i]);
  free(s->ids);
  if (s->kv && s->own_kv) L->MXKVStoreFree(s->kv);
  memset(s, 0, sizeof *s);
}

static double timed(Lib *L, St *s, const Fig *f, long iters, int *rc) {
  double t0 = now();
  *rc = f->run(L, s, f, iters);
  int w = L->MXNDArrayWaitAll();
  double t1 = now();
  if (*rc == 0 && w != 0) *rc = fail_call(L, "MXNDArrayWaitAll", w);
  return t1 - t0;
}

static bool selected(const char *figure) { return !g_only || strstr(figure, g_only); }

static void print_progress(const Fig *f, const char *lib, const char *status, double med,
                           const char *note) {
  if (strcmp(status, "ok") != 0) {
    fprintf(stderr, "  %-8s %-10s %-22s %s  %s\n", f->figure, f->variant, lib, status,
            note ? note : "");
    return;
  }
  if (f->bytes > 0)
    fprintf(stderr, "  %-8s %-22s %-6s %9.3f GB/s  (%.3g ms/op)\n", f->figure, f->variant,
            lib, f->bytes / med / 1e9, med * 1e3);
  else
    fprintf(stderr, "  %-8s %-22s %-6s %9.3f us/op\n", f->figure, f->variant, lib, med * 1e6);
}

/* A figure's limit kernel timed in turn with the libraries (defined with the limits
   below): on a VM, memory bandwidth and the cost of memory never touched before
   change from minute to minute with the neighbours' load and the hypervisor's
   reclaim, so a limit is only comparable with what was measured beside it. */
typedef struct Inline Inline;
static Inline *inline_new(const Fig *f, const long *lib_iters);
static void inline_rep(Inline *in, const Fig *f, int r);
static void inline_finish(Inline *in, const Fig *f);

/* Set up, warm up, calibrate, time A B A B ..., check, tear down. With a
   limit (f->lim_threads > 0), its kernel takes a turn after the libraries in
   every repetition, on 1 .. lim_threads threads. */
static void run_fig(const Fig *f) {
  if (!selected(f->figure)) return;
  St st[2];
  int status[2]; /* 0 ok, 1 n/a, -1 failed */
  long iters[2] = {1, 1};
  double *t[2];
  memset(st, 0, sizeof st);
  for (int l = 0; l < g_nlib; l++) {
    Lib *L = &g_lib[l];
    L->err[0] = 0;
    t[l] = calloc((size_t)f->reps, sizeof(double));
    if (f->sparse && !L->has_sparse_api) {
      snprintf(L->err, sizeof L->err, "library lacks the sparse C API symbols");
      status[l] = 1;
      continue;
    }
    int rc = f->setup(L, &st[l], f);
    status[l] = rc == 0 ? 0 : (rc > 0 || f->sparse) ? 1 : -1;
  }
  /* warm-up (one op each), then calibration */
  for (int pass = 0; pass < 2; pass++)
    for (int l = 0; l < g_nlib; l++) {
      if (status[l]) continue;
      int rc;
      double dt = timed(&g_lib[l], &st[l], f, 1, &rc);
      if (rc) {
        status[l] = f->sparse ? 1 : -1;
        continue;
      }
      if (pass == 1) {
        double want = f->rep_time / (dt > 1e-9 ? dt : 1e-9);
        long it = (long)ceil(want);
        if (it < 1) it = 1;
        if (it > f->max_iters) it = f->max_iters;
        iters[l] = it;
      }
    }
  /* warm-up at the calibrated count when it is larger than 1, and recalibrate */
  for (int l = 0; l < g_nlib; l++) {
    if (status[l] || iters[l] == 1) continue;
    int rc;
    double dt = timed(&g_lib[l], &st[l], f, iters[l], &rc);
    if (rc) {
      status[l] = f->sparse ? 1 : -1;
      continue;
    }
    long it = (long)ceil((double)iters[l] * f->rep_time / (dt > 1e-9 ? dt : 1e-9));
    if (it < 1) it = 1;
    if (it > f->max_iters) it = f->max_iters;
    iters[l] = it;
  }
  Inline *lim = f->lim_threads > 0 ? inline_new(f, iters) : NULL;
  /* timed repetitions, alternating the libraries */
  for (int r = 0; r < f->reps; r++) {
    for (int l = 0; l < g_nlib; l++) {
      if (status[l]) continue;
      pause_ms(2); /* let the other library's spinning pool threads go idle */
      int rc;
      t[l][r] = timed(&g_lib[l], &st[l], f, iters[l], &rc) / (double)iters[l];
      if (rc) status[l] = -1;
    }
    if (lim) inline_rep(lim, f, r);
  }
  if (lim) inline_finish(lim, f);
  /* check the values the store hands back */
  for (int l = 0; l < g_nlib; l++) {
    Lib *L = &g_lib[l];
    if (status[l] == 0) {
      int rc = f->check(L, &st[l], f);
      if (rc != 0) status[l] = -2;
    }
    const char *stat = status[l] == 0 ? "ok" : status[l] == 1 ? "na" : "FAIL";
    if (status[l] < 0) g_failed = 1;
    double med = 0, mn = 0, mx = 0;
    if (status[l] == 0) med = median_of(t[l], f->reps, &mn, &mx);
    csv_row(f->figure, f->variant, (double)f->size, L->label, f->unit, med, mn, mx, f->reps,
            iters[l], f->bytes, stat, status[l] ? L->err : "");
    print_progress(f, L->label, stat, med, L->err);
    st_free(L, &st[l]);
    free(t[l]);
  }
}

/* ------------------------------------------------------------------------
 * Dense figures
 * ---------------------------------------------------------------------- */
static const int ZERO_KEYS[MAXK] = {0};

static int kv_new(Lib *L, St *s) {
  TRY(L, L->MXKVStoreCreate("local", &s->kv));
  s->own_kv = true;
  return 0;
}

/* push: key 0, inputs in[i] = pat(1, i+1) on cpu(i); stored = sum. */
static int push_setup(Lib *L, St *s, const Fig *f) {
  s->n = f->size / 4;
  if (kv_new(L, s)) return -1;
  if (dense_new(L, s->n, 0, &s->val) || dense_fill(L, s->val, s->n, 0, 0)) return -1;
  TRY(L, L->MXKVStoreInit(s->kv, 1, ZERO_KEYS, &s->val));
  for (int i = 0; i < f->k; i++)
    if (dense_new(L, s->n, i, &s->in[i]) || dense_fill(L, s->in[i], s->n, 1, (float)(i + 1)))
      return -1;
  if (dense_new(L, s->n, 0, &s->out[0])) return -1;
  TRY(L, L->MXNDArrayWaitAll());
  return 0;
}
static int push_run(Lib *L, St *s, const Fig *f, long iters) {
  for (long i = 0; i < iters; i++)
    TRY(L, L->MXKVStorePush(s->kv, (uint32_t)f->k, ZERO_KEYS, s->in, 0));
  return 0;
}
static int push_check(Lib *L, St *s, const Fig *f) {
  TRY(L, L->MXKVStorePull(s->kv, 1, ZERO_KEYS, &s->out[0], 0));
  TRY(L, L->MXNDArrayWaitAll());
  return dense_check(L, s->out[0], s->n, (float)f->k, (float)(f->k * (f->k + 1) / 2),
                     "pulled sum");
}

/* pull: key 0 = pat(0.5, 3); n outputs on cpu(0..n-1). */
static int pull_setup(Lib *L, St *s, const Fig *f) {
  s->n = f->size / 4;
  if (kv_new(L, s)) return -1;
  if (dense_new(L, s->n, 0, &s->val) || dense_fill(L, s->val, s->n, 0.5f, 3)) return -1;
  TRY(L, L->MXKVStoreInit(s->kv, 1, ZERO_KEYS, &s->val));
  for (int i = 0; i < f->k; i++)
    if (dense_new(L, s->n, i, &s->out[i])) return -1;
  TRY(L, L->MXNDArrayWaitAll());
  return 0;
}
static int pull_run(Lib *L, St *s, const Fig *f, long iters) {
  for (long i = 0; i < iters; i++)
    TRY(L, L->MXKVStorePull(s->kv, (uint32_t)f->k, ZERO_KEYS, s->out, 0));
  return 0;
}
static int pull_check(Lib *L, St *s, const Fig *f) {
  for (int i = 0; i < f->k; i++) {
    int rc = dense_check(L, s->out[i], s->n, 0.5f, 3, "pulled output");
    if (rc) return rc;
  }
  return 0;
}

/* pushpull: k inputs (as push), k outputs. */
static int pushpull_setup(Lib *L, St *s, const Fig *f) {
  if (push_setup(L, s, f)) return -1;
  for (int i = 1; i < f->k; i++)
    if (dense_new(L, s->n, i, &s->out[i])) return -1;
  return 0;
}
static int pushpull_run(Lib *L, St *s, const Fig *f, long iters) {
  for (long i = 0; i < iters; i++)
    TRY(L, L->MXKVStorePushPull(s->kv, (uint32_t)f->k, ZERO_KEYS, (uint32_t)f->k, ZERO_KEYS,
                                s->in, s->out, 0));
  return 0;
}
static int pushpull_check(Lib *L, St *s, const Fig *f) {
  for (int i = 0; i < f->k; i++) {
    int rc = dense_check(L, s->out[i], s->n, (float)f->k, (float)(f->k * (f->k + 1) / 2),
                         "pushpull output");
    if (rc) return rc;
  }
  return 0;
}

/* init: one fresh key per operation, value pat(1, 7). */
static int init_setup(Lib *L, St *s, const Fig *f) {
  s->n = f->size / 4;
  if (kv_new(L, s)) return -1;
  if (dense_new(L, s->n, 0, &s->val) || dense_fill(L, s->val, s->n, 1, 7)) return -1;
  if (dense_new(L, s->n, 0, &s->out[0])) return -1;
  TRY(L, L->MXNDArrayWaitAll());
  return 0;
}
static int init_run(Lib *L, St *s, const Fig *f, long iters) {
  (void)f;
  for (long i = 0; i < iters; i++) {
    int key = s->next_key++;
    TRY(L, L->MXKVStoreInit(s->kv, 1, &key, &s->val));
  }
  return 0;
}
static int init_check(Lib *L, St *s, const Fig *f) {
  (void)f;
  int probe[2] = {0, s->next_key - 1};
  for (int i = 0; i < 2; i++) {
    TRY(L, L->MXKVStorePull(s->kv, 1, &probe[i], &s->out[0], 0));
    TRY(L, L->MXNDArrayWaitAll());
    int rc = dense_check(L, s->out[0], s->n, 1, 7, "pulled initialised key");
    if (rc) return rc;
  }
  return 0;
}

/* pair: 1-element key 0 (value 42 pushed), push then pull. */
static int pair_setup(Lib *L, St *s, const Fig *f) {
  (void)f;
  s->n = 1;
  if (kv_new(L, s)) return -1;
  if (dense_new(L, 1, 0, &s->val) || dense_fill(L, s->val, 1, 0, 0)) return -1;
  TRY(L, L->MXKVStoreInit(s->kv, 1, ZERO_KEYS, &s->val));
  if (dense_new(L, 1, 0, &s->in[0]) || dense_fill(L, s->in[0], 1, 0, 42)) return -1;
  if (dense_new(L, 1, 0, &s->out[0])) return -1;
  TRY(L, L->MXNDArrayWaitAll());
  return 0;
}
static int pair_run(Lib *L, St *s, const Fig *f, long iters) {
  for (long i = 0; i < iters; i++) {
    TRY(L, L->MXKVStorePush(s->kv, 1, ZERO_KEYS, s->in, 0));
    TRY(L, L->MXKVStorePull(s->kv, 1, ZERO_KEYS, s->out, 0));
    if (f->k) TRY(L, L->MXNDArrayWaitToRead(s->out[0]));
  }
  return 0;
}
static int pair_check(Lib *L, St *s, const Fig *f) {
  (void)f;
  return dense_check(L, s->out[0], 1, 0, 42, "pulled 1-element value");
}

/* keys1000: keys 0..999 of MANY_ELEMS floats; key i pushed pat(1, i). */
static int many_setup(Lib *L, St *s, const Fig *f) {
  (void)f;
  s->n = MANY_ELEMS;
  if (kv_new(L, s)) return -1;
  s->many_in = calloc(NKEYS_MANY, sizeof(NDArrayHandle));
  s->many_out = calloc(NKEYS_MANY, sizeof(NDArrayHandle));
  s->keys = calloc(NKEYS_MANY, sizeof(int));
  if (dense_new(L, s->n, 0, &s->val) || dense_fill(L, s->val, s->n, 0, 0)) return -1;
  for (int i = 0; i < NKEYS_MANY; i++) {
    s->keys[i] = i;
    TRY(L, L->MXKVStoreInit(s->kv, 1, &s->keys[i], &s->val));
    if (dense_new(L, s->n, 0, &s->many_in[i]) ||
        dense_fill(L, s->many_in[i], s->n, 1, (float)i) ||
        dense_new(L, s->n, 0, &s->many_out[i]))
      return -1;
  }
  TRY(L, L->MXNDArrayWaitAll());
  return 0;
}
static int many_run(Lib *L, St *s, const Fig *f, long iters) {
  for (long it = 0; it < iters; it++) {
    if (f->k == 1) {
      TRY(L, L->MXKVStorePush(s->kv, NKEYS_MANY, s->keys, s->many_in, 0));
    } else {
      for (int i = 0; i < NKEYS_MANY; i++)
        TRY(L, L->MXKVStorePush(s->kv, 1, &s->keys[i], &s->many_in[i], 0));
    }
  }
  return 0;
}
static int many_check(Lib *L, St *s, const Fig *f) {
  (void)f;
  TRY(L, L->MXKVStorePull(s->kv, NKEYS_MANY, s->keys, s->many_out, 0));
  TRY(L, L->MXNDArrayWaitAll());
  for (int i = 0; i < NKEYS_MANY; i++) {
    int rc = dense_check(L, s->many_out[i], s->n, 1, (float)i, "pulled key of 1000");
    if (rc) return rc;
  }
  return 0;
}

/* ------------------------------------------------------------------------
 * row_sparse figures
 *
 * Filling a row_sparse array: MXNet 1.9.1's MXNDArrayGetDataNDArray and
 * MXNDArrayGetAuxNDArray return deep copies, so SyncCopyFromCPU into them
 * returns 0 but never reaches the sparse array. What works (and what
 * Python's row_sparse_array does) is MXNDArraySyncCopyFromNDArray(dst, src, -1)
 * for the data and (dst, src, 0) for aux 0 (int64 row indices) from dense
 * arrays. Reading back goes through those copies (GetDataNDArray then
 * SyncCopyToCPU); SyncCopyToCPU on the sparse array itself fails in MXNet.
 * ---------------------------------------------------------------------- */
#define RSP_COLS 64

struct Shared { /* one per library: the table key (key 0, R x 64 rows) */
  KVStoreHandle kv;
  int status; /* 0 ok, 1 n/a */
  char err[600];
};
static Shared g_rsp[2];
static size_t g_rsp_rows; /* R */

static float table_val(int64_t r, int c) { return (float)(r * 7 + c); }

static int rsp_make(Lib *L, size_t nnz, const int64_t *ids, const float *data,
                    NDArrayHandle *out) {
  uint32_t shape[2] = {(uint32_t)g_rsp_rows, RSP_COLS};
  int aux_type[1] = {6};
  uint32_t aux_ndims[1] = {1};
  uint32_t aux_shape[1] = {(uint32_t)nnz};
  TRY(L, L->MXNDArrayCreateSparseEx(1, shape, 2, 1, 0, 0, 0, 1, aux_type, aux_ndims, aux_shape,
                                    out));
  NDArrayHandle d = NULL, x = NULL;
  uint32_t dshape[2] = {(uint32_t)nnz, RSP_COLS};
  uint32_t xshape[1] = {(uint32_t)nnz};
  int rc = 0;
  if (L->MXNDArrayCreateEx(dshape, 2, 1, 0, 0, 0, &d) ||
      L->MXNDArraySyncCopyFromCPU(d, data, nnz * RSP_COLS) ||
      L->MXNDArrayCreateEx(xshape, 1, 1, 0, 0, 6, &x) ||
      L->MXNDArraySyncCopyFromCPU(x, ids, nnz) ||
      L->MXNDArraySyncCopyFromNDArray(*out, d, -1) ||
      L->MXNDArraySyncCopyFromNDArray(*out, x, 0))
    rc = fail_call(L, "building a row_sparse value", -1);
  if (d) L->MXNDArrayFree(d);
  if (x) L->MXNDArrayFree(x);
  return rc;
}

static int ids_new(Lib *L, const int64_t *ids, size_t n, NDArrayHandle *out) {
  uint32_t shape[1] = {(uint32_t)n};
  TRY(L, L->MXNDArrayCreateEx(shape, 1, 1, 0, 0, 6, out));
  TRY(L, L->MXNDArraySyncCopyFromCPU(*out, ids, n));
  return 0;
}

static int rsp_empty(Lib *L, NDArrayHandle *out) {
  uint32_t shape[2] = {(uint32_t)g_rsp_rows, RSP_COLS};
  int aux_type[1] = {6};
  uint32_t aux_ndims[1] = {1};
  uint32_t aux_shape[1] = {0};
  TRY(L, L->MXNDArrayCreateSparseEx(1, shape, 2, 1, 0, 1, 0, 1, aux_type, aux_ndims, aux_shape,
                                    out));
  return 0;
}

/* Read a row_sparse array: nnz, indices, data (rows x 64). 0 ok, -1 failed. */
static int rsp_read(Lib *L, NDArrayHandle h, size_t *nnz, int64_t **ids, float **data) {
  NDArrayHandle d = NULL, x = NULL;
  *ids = NULL;
  *data = NULL;
  TRY(L, L->MXNDArrayWaitAll());
  TRY(L, L->MXNDArrayGetAuxNDArray(h, 0, &x));
  int nd = 0;
  const int *sh = NULL;
  int rc = 0;
  if (L->MXNDArrayGetShapeEx(x, &nd, &sh) || nd != 1) {
    rc = fail_call(L, "MXNDArrayGetShapeEx(aux)", -1);
    goto out;
  }
  *nnz = (size_t)sh[0];
  *ids = xmalloc(*nnz * 8 + 8);
  *data = xmalloc(*nnz * RSP_COLS * 4 + 4);
  if (L->MXNDArraySyncCopyToCPU(x, *ids, *nnz) || L->MXNDArrayGetDataNDArray(h, &d) ||
      L->MXNDArraySyncCopyToCPU(d, *data, *nnz * RSP_COLS))
    rc = fail_call(L, "reading a row_sparse array", -1);
out:
  if (d) L->MXNDArrayFree(d);
  if (x) L->MXNDArrayFree(x);
  return rc;
}

/* Compare a row_sparse array with rows ids[0..n) whose element (k, c) is val(k, c). */
static int rsp_check(Lib *L, NDArrayHandle h, const int64_t *ids, size_t n,
                     float (*val)(const int64_t *ids, size_t k, int c), const char *what) {
  size_t nnz = 0;
  int64_t *got_ids;
  float *got;
  if (rsp_read(L, h, &nnz, &got_ids, &got)) return -1;
  int rc = 0;
  if (nnz != n) {
    snprintf(L->err, sizeof L->err, "%s: %zu rows; expected %zu", what, nnz, n);
    rc = 1;
  }
  for (size_t k = 0; !rc && k < n; k++) {
    if (got_ids[k] != ids[k]) {
      snprintf(L->err, sizeof L->err, "%s: row index %zu is %lld; expected %lld", what, k,
               (long long)got_ids[k], (long long)ids[k]);
      rc = 1;
      break;
    }
    for (int c = 0; c < RSP_COLS; c++) {
      float e = val(ids, k, c) + (g_corrupt ? 1.0f : 0.0f);
      if (memcmp(&got[k * RSP_COLS + c], &e, 4) != 0) {
        snprintf(L->err, sizeof L->err, "%s: row %lld col %d is %.9g; expected %.9g", what,
                 (long long)ids[k], c, (double)got[k * RSP_COLS + c], (double)e);
        rc = 1;
        break;
      }
    }
  }
  free(got_ids);
  free(got);
  return rc;
}

static float table_row(const int64_t *ids, size_t k, int c) { return table_val(ids[k], c); }

/* Build the R x 64 table (all rows) as key 0 of a store, once per library. */
static int64_t *g_tab_ids;
static float *g_tab_data;

static int table_setup(Lib *L, Shared *sh) {
  if (sh->kv || sh->status) return sh->status;
  size_t R = g_rsp_rows;
  if (!g_tab_ids) {
    g_tab_ids = xmalloc(R * 8);
    g_tab_data = xmalloc(R * RSP_COLS * 4);
    for (size_t r = 0; r < R; r++) {
      g_tab_ids[r] = (int64_t)r;
      for (int c = 0; c < RSP_COLS; c++) g_tab_data[r * RSP_COLS + c] = table_val((int64_t)r, c);
    }
  }
  NDArrayHandle tab = NULL;
  int rc = 0;
  if (L->MXKVStoreCreate("local", &sh->kv)) {
    rc = fail_call(L, "MXKVStoreCreate", -1);
  } else if (rsp_make(L, R, g_tab_ids, g_tab_data, &tab) == 0) {
    if (L->MXKVStoreInit(sh->kv, 1, ZERO_KEYS, &tab) || L->MXNDArrayWaitAll())
      rc = fail_call(L, "MXKVStoreInit(row_sparse table)", -1);
  } else {
    rc = -1;
  }
  if (tab) L->MXNDArrayFree(tab);
  L->MXNDArrayWaitAll();
  if (rc) {
    sh->status = 1;
    snprintf(sh->err, sizeof sh->err, "%s", L->err);
  }
  return sh->status;
}

static Shared *shared_for(Lib *L) { return &g_rsp[L == &g_lib[0] ? 0 : 1]; }

/* rsp_pull: m = f->k rows, ids i * (R / m), into a delay-allocated row_sparse output. */
static int rsp_pull_setup(Lib *L, St *s, const Fig *f) {
  Shared *sh = shared_for(L);
  if (table_setup(L, sh)) {
    snprintf(L->err, sizeof L->err, "%s", sh->err);
    return 1;
  }
  s->sh = sh;
  s->kv = sh->kv;
  s->nids = (size_t)f->k;
  s->ids = xmalloc(s->nids * 8);
  for (size_t i = 0; i < s->nids; i++) s->ids[i] = (int64_t)(i * (g_rsp_rows / s->nids));
  if (ids_new(L, s->ids, s->nids, &s->rids) || rsp_empty(L, &s->rsp_out)) return 1;
  return 0;
}
static int rsp_pull_run(Lib *L, St *s, const Fig *f, long iters) {
  (void)f;
  for (long i = 0; i < iters; i++)
    TRY(L, L->MXKVStorePullRowSparse(s->kv, 1, ZERO_KEYS, &s->rsp_out, &s->rids, 0));
  return 0;
}
static int rsp_pull_check(Lib *L, St *s, const Fig *f) {
  (void)f;
  return rsp_check(L, s->rsp_out, s->ids, s->nids, table_row, "row_sparse_pull output");
}

/* rsp_push: key 1 (own store), values of 1000 rows; f->k = number of values (1 or 2).
   value 0: rows a_i = i * (R/1000) + 2, element (i, c) = (i % 5) + 1 + c;
   value 1: rows a_i (i even) or a_i + 1 (i odd), element = 2 + (c % 3).
   Expected (no updater = assign): the union of rows, summed. */
#define PUSH_ROWS 1000
static size_t push_rows(void) { return g_smoke ? 100 : PUSH_ROWS; }

static int64_t push_id(int v, size_t i) {
  int64_t a = (int64_t)(i * (g_rsp_rows / push_rows()) + 2);
  return (v == 1 && (i % 2)) ? a + 1 : a;
}
static float push_val(int v, size_t i, int c) {
  return v == 0 ? (float)((i % 5) + 1 + (size_t)c) : (float)(2 + c % 3);
}
/* expected rows of the union, in order: for each i, a_i (and a_i+1 when i odd and k == 2) */
static int g_push_k;
static float push_expect(const int64_t *ids, size_t k, int c) {
  (void)k;
  size_t m = push_rows(), step = g_rsp_rows / m;
  int64_t id = ids[k];
  size_t i = (size_t)((id - 2) / (int64_t)step);
  bool shifted = id != push_id(0, i);
  float e = 0;
  if (!shifted) e += push_val(0, i, c);
  if (g_push_k == 2 && (i % 2 == 0 || shifted)) e += push_val(1, i, c);
  return e;
}

static int rsp_push_setup(Lib *L, St *s, const Fig *f) {
  size_t m = push_rows();
  if (kv_new(L, s)) return 1;
  int64_t *ids = xmalloc(m * 8);
  float *data = xmalloc(m * RSP_COLS * 4);
  for (int v = 0; v < f->k; v++) {
    for (size_t i = 0; i < m; i++) {
      ids[i] = push_id(v, i);
      for (int c = 0; c < RSP_COLS; c++) data[i * RSP_COLS + c] = push_val(v, i, c);
    }
    if (rsp_make(L, m, ids, data, &s->rsp_val[v])) {
      free(ids);
      free(data);
      return 1;
    }
  }
  free(ids);
  free(data);
  int key = 1;
  TRY(L, L->MXKVStoreInit(s->kv, 1, &key, &s->rsp_val[0]));
  /* the expected union of rows */
  s->ids = xmalloc(2 * m * 8);
  s->nids = 0;
  for (size_t i = 0; i < m; i++) {
    s->ids[s->nids++] = push_id(0, i);
    if (f->k == 2 && (i % 2)) s->ids[s->nids++] = push_id(1, i);
  }
  if (ids_new(L, s->ids, s->nids, &s->check_ids) || rsp_empty(L, &s->rsp_out)) return 1;
  TRY(L, L->MXNDArrayWaitAll());
  return 0;
}
static int rsp_push_run(Lib *L, St *s, const Fig *f, long iters) {
  int keys[2] = {1, 1};
  for (long i = 0; i < iters; i++)
    TRY(L, L->MXKVStorePush(s->kv, (uint32_t)f->k, keys, s->rsp_val, 0));
  return 0;
}
static int rsp_push_check(Lib *L, St *s, const Fig *f) {
  int key = 1;
  g_push_k = f->k;
  TRY(L, L->MXKVStorePullRowSparse(s->kv, 1, &key, &s->rsp_out, &s->check_ids, 0));
  return rsp_check(L, s->rsp_out, s->ids, s->nids, push_expect, "pushed rows pulled back");
}

/* ------------------------------------------------------------------------
 * Peak RSS: a child process per library (fork + exec of this program)
 * ---------------------------------------------------------------------- */
static int rss_child(const char *path, size_t bytes, int nkeys) {
  Lib L;
  if (lib_load(&L, path)) return 2;
  g_csv = stderr;
  KVStoreHandle kv;
  if (L.MXKVStoreCreate("local", &kv)) return 4;
  if (nkeys == 0) {
    L.MXNDArrayWaitAll();
    return 0;
  }
  size_t n = bytes / 4;
  NDArrayHandle v, in[2], out;
  int rc = 0;
  if (dense_new(&L, n, 0, &v) || dense_fill(&L, v, n, 0.5f, 1)) rc = 4;
  for (int key = 0; !rc && key < nkeys; key++)
    if (L.MXKVStoreInit(kv, 1, &key, &v)) rc = 4;
  for (int i = 0; !rc && i < 2; i++)
    if (dense_new(&L, n, 0, &in[i]) || dense_fill(&L, in[i], n, 1, (float)(i + 1))) rc = 4;
  if (!rc && dense_new(&L, n, 0, &out)) rc = 4;
  if (!rc && L.MXNDArrayWaitAll()) rc = 4;
  for (int key = 0; !rc && key < nkeys; key++) {
    int keys[2] = {key, key};
    if (L.MXKVStorePush(kv, 2, keys, in, 0)) rc = 4;
  }
  if (!rc && L.MXNDArrayWaitAll()) rc = 4;
  for (int key = 0; !rc && key < nkeys; key++) {
    if (L.MXKVStorePull(kv, 1, &key, &out, 0) || L.MXNDArrayWaitAll()) {
      rc = 4;
      break;
    }
    int c = dense_check(&L, out, n, 2, 3, "rss: pulled sum");
    if (c) rc = c < 0 ? 4 : 3;
  }
  if (rc == 4) fail_call(&L, "rss child", -1);
  if (rc) fprintf(stderr, "kvbench rss child (%s): %s\n", L.label, L.err);
  return rc;
}

/* Returns peak RSS in bytes of a child running the RSS sequence, or -1. */
static double rss_measure(Lib *L, size_t bytes, int nkeys, int *child_rc) {
  char sz[32], nk[32];
  snprintf(sz, sizeof sz, "%zu", bytes);
  snprintf(nk, sizeof nk, "%d", nkeys);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    char *argv[] = {"kvbench", "--rss-child", (char *)L->path, sz, nk, NULL};
    if (g_corrupt) setenv("KVBENCH_CORRUPT", "1", 1);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  int status = 0;
  struct rusage ru;
  if (wait4(pid, &status, 0, &ru) < 0) return -1;
  *child_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return (double)ru.ru_maxrss * 1024.0;
}

static void run_rss(size_t bytes, int nkeys, int reps) {
  if (!selected("rss")) return;
  char variant[64], hs[32];
  snprintf(variant, sizeof variant, "%dx%s", nkeys, human_size(bytes, hs, sizeof hs));
  double v[2][4], base[2][4];
  int status[2] = {0, 0};
  char note[2][200] = {"", ""};
  for (int r = 0; r < reps; r++)
    for (int l = 0; l < g_nlib; l++) {
      int rc = 0;
      base[l][r] = rss_measure(&g_lib[l], 0, 0, &rc);
      if (rc) {
        status[l] = -1;
        snprintf(note[l], sizeof note[l], "baseline child exited with %d", rc);
      }
      v[l][r] = rss_measure(&g_lib[l], bytes, nkeys, &rc);
      if (rc) {
        status[l] = -1;
        snprintf(note[l], sizeof note[l], "child exited with %d (3 = wrong value)", rc);
      }
    }
  for (int l = 0; l < g_nlib; l++) {
    double mn, mx, med = median_of(v[l], reps, &mn, &mx);
    double bmn, bmx, bmed = median_of(base[l], reps, &bmn, &bmx);
    const char *stat = status[l] ? "FAIL" : "ok";
    if (status[l]) g_failed = 1;
    csv_row("rss", variant, (double)bytes, g_lib[l].label, "bytes", med, mn, mx, reps, 1,
            (double)bytes * nkeys, stat, note[l]);
    csv_row("rss", "baseline", 0, g_lib[l].label, "bytes", bmed, bmn, bmx, reps, 1, 0, stat,
            "dlopen + MXKVStoreCreate only");
    fprintf(stderr, "  rss      %-22s %-6s %9.3f GiB peak (baseline %.3f GiB) %s %s\n", variant,
            g_lib[l].label, med / (1 << 30), bmed / (1 << 30), stat, note[l]);
  }
}

/* ------------------------------------------------------------------------
 * Machine limits: memcpy, k-input sum, broadcast copy, k-input sum copied to k outputs,
 * copy into fresh memory; 1 and 2 threads (and memcpy, broadcast at 256 KB in cache).
 * ---------------------------------------------------------------------- */
typedef struct Job {
  int kind; /* 0 memcpy, 1 sum, 2 broadcast, 3 sum and copy (pushpull) */
  int k;
  size_t blk; /* memcpy: 0 = one memcpy per thread chunk, else elements per memcpy */
  float *src[MAXK];
  float *dst[MAXK + 1];
  size_t lo, hi;
} Job;

static void sum_range(float *restrict o, float *const *in, int k, size_t lo, size_t hi) {
  switch (k) {
  case 2: {
    const float *restrict a = in[0], *restrict b = in[1];
    for (size_t i = lo; i < hi; i++) o[i] = a[i] + b[i];
    break;
  }
  case 4: {
    const float *restrict a = in[0], *restrict b = in[1], *restrict c = in[2],
                          *restrict d = in[3];
    for (size_t i = lo; i < hi; i++) o[i] = a[i] + b[i] + c[i] + d[i];
    break;
  }
  case 8: {
    const float *restrict a = in[0], *restrict b = in[1], *restrict c = in[2],
                          *restrict d = in[3], *restrict e = in[4], *restrict f = in[5],
                          *restrict g = in[6], *restrict h = in[7];
    for (size_t i = lo; i < hi; i++)
      o[i] = a[i] + b[i] + c[i] + d[i] + e[i] + f[i] + g[i] + h[i];
    break;
  }
  default:
    for (size_t i = lo; i < hi; i++) {
      float s = in[0][i];
      for (int j = 1; j < k; j++) s += in[j][i];
      o[i] = s;
    }
  }
}

static void *job_run(void *arg) {
  Job *j = arg;
  switch (j->kind) {
  case 0:
    if (!j->blk) {
      memcpy(j->dst[0] + j->lo, j->src[0] + j->lo, (j->hi - j->lo) * 4);
    } else {
      for (size_t b = j->lo; b < j->hi; b += j->blk) {
        size_t e = b + j->blk < j->hi ? b + j->blk : j->hi;
        memcpy(j->dst[0] + b, j->src[0] + b, (e - b) * 4);
      }
    }
    break;
  case 1:
    sum_range(j->dst[0], j->src, j->k, j->lo, j->hi);
    break;
  case 3: { /* sum into dst[0], then copy each 16 KB block to dst[1..k] while in cache */
    const size_t B = 4096;
    for (size_t b = j->lo; b < j->hi; b += B) {
      size_t e = b + B < j->hi ? b + B : j->hi;
      sum_range(j->dst[0], j->src, j->k, b, e);
      for (int o = 1; o <= j->k; o++) memcpy(j->dst[o] + b, j->dst[0] + b, (e - b) * 4);
    }
    break;
  }
  case 2: {
    const size_t B = 8192; /* 32 KB blocks: the source block stays in cache */
    for (size_t b = j->lo; b < j->hi; b += B) {
      size_t e = b + B < j->hi ? b + B : j->hi;
      for (int o = 0; o < j->k; o++) memcpy(j->dst[o] + b, j->src[0] + b, (e - b) * 4);
    }
    break;
  }
  }
  return NULL;
}

/* Helper threads that stay (as a library's pool does): each waits on a condition
   variable for its next job, so a 2-thread op costs one wake-up, not a thread
   start. */
#define MAXT 8
static struct {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  int started;      /* helper threads running */
  long round;       /* incremented for every posted op */
  int pending;      /* helpers still busy with this round */
  Job jobs[MAXT];
} g_pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static void *pool_main(void *arg) {
  int t = (int)(intptr_t)arg;
  long seen = 0;
  pthread_mutex_lock(&g_pool.mu);
  for (;;) {
    while (g_pool.round == seen) pthread_cond_wait(&g_pool.go, &g_pool.mu);
    seen = g_pool.round;
    Job j = g_pool.jobs[t];
    pthread_mutex_unlock(&g_pool.mu);
    if (j.hi > j.lo) job_run(&j);
    pthread_mutex_lock(&g_pool.mu);
    if (--g_pool.pending == 0) pthread_cond_signal(&g_pool.done);
  }
  return NULL;
}

static void par_job(const Job *proto, size_t n, int threads) {
  size_t chunk = (n / (size_t)threads + 1023) & ~(size_t)1023;
  Job jobs[MAXT];
  for (int t = 0; t < threads; t++) {
    jobs[t] = *proto;
    jobs[t].lo = (size_t)t * chunk < n ? (size_t)t * chunk : n;
    jobs[t].hi = (size_t)(t + 1) * chunk < n ? (size_t)(t + 1) * chunk : n;
  }
  if (threads > 1) {
    pthread_mutex_lock(&g_pool.mu);
    while (g_pool.started < threads - 1) {
      pthread_t tid;
      if (pthread_create(&tid, NULL, pool_main, (void *)(intptr_t)(g_pool.started + 1)) != 0)
        abort();
      pthread_detach(tid);
      g_pool.started++;
    }
    for (int t = 1; t < MAXT; t++) {
      g_pool.jobs[t] = t < threads ? jobs[t] : *proto;
      if (t >= threads) g_pool.jobs[t].lo = g_pool.jobs[t].hi = 0; /* idle this round */
    }
    g_pool.pending = g_pool.started;
    g_pool.round++;
    pthread_cond_broadcast(&g_pool.go);
    pthread_mutex_unlock(&g_pool.mu);
  }
  job_run(&jobs[0]);
  if (threads > 1) {
    pthread_mutex_lock(&g_pool.mu);
    while (g_pool.pending > 0) pthread_cond_wait(&g_pool.done, &g_pool.mu);
    pthread_mutex_unlock(&g_pool.mu);
  }
}

/* Median seconds per operation of one limit kernel (warm-up, calibration, reps). */
static double limit_time(const Job *j, size_t n, int threads, int reps, double *mn, double *mx,
                         long *iters_out) {
  double dt0 = 0;
  for (int w = 0; w < 2; w++) { /* warm-up + calibration */
    double t0 = now();
    par_job(j, n, threads);
    dt0 = now() - t0;
  }
  double rep_time = g_smoke ? 0.002 : 0.05;
  long iters = (long)ceil(rep_time / (dt0 > 1e-9 ? dt0 : 1e-9));
  if (iters < 1) iters = 1;
  double *t = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    for (long i = 0; i < iters; i++) par_job(j, n, threads);
    t[r] = (now() - t0) / (double)iters;
  }
  double med = median_of(t, reps, mn, mx);
  free(t);
  *iters_out = iters;
  return med;
}

/* The limits are measured at the start and at the end of the run (pass 1, 2);
   the report uses the better median of the two passes. memcpy is tried as one
   glibc memcpy per thread chunk (non-temporal stores for large sizes) and as
   64 KB memcpy's (regular stores); the faster is reported. Buffers come from
   posix_memalign, like the libraries' (no madvise: this machine's THP mode is
   what every array gets). */
/* The limit of an init: copying into memory never touched before (calloc'd
   per operation and kept until the measurement ends, as the keys of the init
   figure are), so every page is faulted in and zeroed by the kernel first. */
typedef struct Held {
  bool huge; /* mmap'd with MADV_HUGEPAGE (2 MB pages) instead of calloc'd */
  float **p;
  size_t n, cap, bytes;
} Held;

static Held *held_new(bool huge) {
  Held *h = calloc(1, sizeof *h);
  if (!h) abort();
  h->huge = huge;
  return h;
}

/* ops copies of src into fresh memory, held; returns the seconds they took. */
static double fresh_ops(Held *h, const float *src, size_t n, int threads, long ops) {
  h->bytes = n * 4;
  double t0 = now();
  for (long i = 0; i < ops; i++) {
    if (h->n == h->cap) {
      h->cap = h->cap ? 2 * h->cap : 16;
      h->p = realloc(h->p, h->cap * sizeof *h->p);
      if (!h->p) abort();
    }
    float *d;
    if (h->huge) {
      d = mmap(NULL, h->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (d == MAP_FAILED) abort();
      madvise(d, h->bytes, MADV_HUGEPAGE); /* advice only, as in libmxkv */
    } else {
      d = calloc(n, 4);
      if (!d) abort();
    }
    h->p[h->n++] = d;
    Job j;
    memset(&j, 0, sizeof j);
    j.kind = 0;
    j.blk = 16384;
    j.src[0] = (float *)src;
    j.dst[0] = d;
    par_job(&j, n, threads);
  }
  return now() - t0;
}

/* Frees what h holds; false (and the run fails) when the last copy is wrong. */
static bool held_free(Held *h, const float *src, size_t n) {
  bool ok = h->n == 0 || memcmp(h->p[h->n - 1], src, n * 4) == 0;
  if (!ok) {
    fprintf(stderr, "kvbench: limit kernel fresh copy is wrong\n");
    g_failed = 1;
  }
  for (size_t i = 0; i < h->n; i++) {
    if (h->huge)
      munmap(h->p[i], h->bytes);
    else
      free(h->p[i]);
  }
  free(h->p);
  free(h);
  return ok;
}

static const char *const LIM_NAME[] = {"memcpy", "sum", "bcast", "sumcopy", "fresh"};

/* Copy into fresh memory has two variants: small pages (calloc) and 2 MB pages. */
#define LIM_VARIANTS(kind) ((kind) == 4 ? 2 : 1)

struct Inline {
  Job job;      /* kinds 0-3 */
  Held *held[2]; /* kind 4, per variant */
  float *src;   /* kind 4: what is copied */
  size_t n;
  long iters[4];
  double *t[4]; /* seconds per op of each repetition, [variant * 2 + threads - 1] */
};

static double inline_time(Inline *in, const Fig *f, int var, int threads) {
  int i = var * 2 + threads - 1;
  long it = in->iters[i];
  if (f->lim_kind == 4) return fresh_ops(in->held[var], in->src, in->n, threads, it) / (double)it;
  double t0 = now();
  for (long k = 0; k < it; k++) par_job(&in->job, in->n, threads);
  return (now() - t0) / (double)it;
}

/* Buffers as in run_limits; one op on each thread count to warm up and calibrate.
   Copies into fresh memory stay held, so they run as many ops as the library that
   runs most (the init figure bounds that count). */
static Inline *inline_new(const Fig *f, const long *lib_iters) {
  Inline *in = calloc(1, sizeof *in);
  if (!in) abort();
  in->n = f->size / 4;
  Job *j = &in->job;
  j->kind = f->lim_kind;
  j->k = f->lim_k;
  j->blk = 16384; /* memcpy: 64 KB memcpy's, the faster way in run_limits */
  int nsrc = f->lim_kind == 2 || f->lim_kind == 4 ? 1 : f->lim_k;
  int ndst = f->lim_kind == 4 ? 0 : f->lim_kind == 3 ? f->lim_k + 1 : f->lim_kind == 2 ? f->lim_k : 1;
  for (int i = 0; i < nsrc; i++) {
    j->src[i] = xmalloc(f->size);
    for (size_t e = 0; e < in->n; e++) j->src[i][e] = (float)(e % 1000);
  }
  for (int o = 0; o < ndst; o++) {
    j->dst[o] = xmalloc(f->size);
    memset(j->dst[o], 0, f->size); /* faulted in now, not in the calibration op */
  }
  if (f->lim_kind == 4) {
    for (int v = 0; v < 2; v++) in->held[v] = held_new(v == 1);
    in->src = j->src[0];
  }
  for (int v = 0; v < LIM_VARIANTS(f->lim_kind); v++)
    for (int th = 1; th <= f->lim_threads; th++) {
      int i = v * 2 + th - 1;
      in->t[i] = calloc((size_t)f->reps, sizeof(double));
      in->iters[i] = 1;
      double dt = inline_time(in, f, v, th);
      long it = (long)ceil(f->rep_time / (dt > 1e-9 ? dt : 1e-9));
      if (f->lim_kind == 4) it = lib_iters[0] > lib_iters[1] ? lib_iters[0] : lib_iters[1];
      in->iters[i] = it < 1 ? 1 : it;
    }
  return in;
}

static void inline_rep(Inline *in, const Fig *f, int r) {
  for (int v = 0; v < LIM_VARIANTS(f->lim_kind); v++)
    for (int th = 1; th <= f->lim_threads; th++) {
      pause_ms(2);
      in->t[v * 2 + th - 1][r] = inline_time(in, f, v, th);
    }
}

/* One CSV row per thread count ("limit_<kernel>@inline-<size>"), checks, frees. */
static void inline_finish(Inline *in, const Fig *f) {
  Job *j = &in->job;
  int k = f->lim_k;
  bool ok = true;
  if (f->lim_kind == 4) {
    for (int v = 0; v < 2; v++) ok = held_free(in->held[v], in->src, in->n) && ok;
  } else {
    float want = f->lim_kind == 1 || f->lim_kind == 3 ? 999.0f * (float)k : 999.0f;
    int last = f->lim_kind == 3 ? k : f->lim_kind == 2 ? k - 1 : 0;
    for (int o = 0; o <= last; o++) ok = ok && in->n > 999 && j->dst[o][999] == want;
    if (!ok) {
      fprintf(stderr, "kvbench: limit kernel %s k=%d is wrong\n", LIM_NAME[f->lim_kind], k);
      g_failed = 1;
    }
  }
  double moved = (double)f->size * (f->lim_kind == 0 || f->lim_kind == 4 ? 2
                                    : f->lim_kind == 3                  ? 2 * k
                                                                        : k + 1);
  char hs[32], fig[96], variant[32];
  human_size(f->size, hs, sizeof hs);
  /* named by the figure too: push 1 and pull 1 both time memcpy */
  snprintf(fig, sizeof fig, "limit_%s@inline-%s-%s", LIM_NAME[f->lim_kind], f->figure, hs);
  for (int i = 0; i < 4; i++) {
    if (!in->t[i]) continue;
    int th = i % 2 + 1;
    if (f->lim_kind == 0 || f->lim_kind == 4)
      snprintf(variant, sizeof variant, "%st=%d", i >= 2 ? "huge " : "", th);
    else
      snprintf(variant, sizeof variant, "%c=%d t=%d", f->lim_kind == 2 ? 'n' : 'k', k, th);
    double mn, mx, med = median_of(in->t[i], f->reps, &mn, &mx);
    char note[128];
    snprintf(note, sizeof note, "timed in turn with the libraries in %s %s", f->figure,
             f->variant);
    csv_row(fig, variant, (double)f->size, "machine", "s", med, mn, mx, f->reps, in->iters[i],
            moved, ok ? "ok" : "FAIL", note);
    fprintf(stderr, "  %-8s %-22s %-6s %9.3f GB/s  (%.3g ms/op)\n", "limit",
            fig + strlen("limit_"), variant, moved / med / 1e9, med * 1e3);
    free(in->t[i]);
  }
  for (int i = 0; i < MAXK; i++) free(j->src[i]);
  for (int o = 0; o <= MAXK; o++) free(j->dst[o]);
  free(in);
}

static void fresh_limit(float *src, size_t bytes, int reps, int pass) {
  size_t n = bytes / 4;
  for (int v = 0; v < 4; v++) {
    int threads = v % 2 + 1;
    bool huge = v >= 2;
    double *t = calloc((size_t)reps, sizeof(double));
    Held *h = held_new(huge);
    double dt = fresh_ops(h, src, n, threads, 1); /* warm-up and calibration */
    long iters = (long)ceil((g_smoke ? 0.002 : 0.05) / (dt > 1e-9 ? dt : 1e-9));
    for (int r = 0; r < reps; r++) t[r] = fresh_ops(h, src, n, threads, iters) / (double)iters;
    double mn, mx, med = median_of(t, reps, &mn, &mx);
    held_free(h, src, n);
    free(t);
    char variant[32], note[96];
    snprintf(variant, sizeof variant, "%st=%d", huge ? "huge " : "", threads);
    snprintf(note, sizeof note, "pass %d (%s of the run); %s per op, held to the end", pass,
             pass == 1 ? "start" : "end", huge ? "mmap + MADV_HUGEPAGE" : "calloc");
    csv_row("limit_fresh", variant, (double)bytes, "machine", "s", med, mn, mx, reps, iters,
            2.0 * (double)bytes, "ok", note);
    fprintf(stderr, "  %-18s %-12s %9.3f GB/s\n", "limit_fresh", variant, 2.0 * (double)bytes / med / 1e9);
  }
}

/* small: the in-cache limits at 256 KB (memcpy and broadcast, one thread:
   starting a second thread costs more than such a copy), named "…@256KB". */
static void run_limits(size_t bytes, int reps, int pass, bool small) {
  size_t n = bytes / 4;
  float *buf[MAXK * 2 + 1];
  for (int i = 0; i < MAXK * 2 + 1; i++) {
    buf[i] = xmalloc(bytes);
    for (size_t j = 0; j < n; j++) buf[i][j] = (float)(j % 1000);
  }
  struct {
    const char *name;
    int kind, k;
  } lim[] = {{"memcpy", 0, 1}, {"sum", 1, 2}, {"sum", 1, 4}, {"sum", 1, 8},
             {"bcast", 2, 2}, {"bcast", 2, 8}, {"sumcopy", 3, 2}, {"sumcopy", 3, 8}};
  for (size_t li = 0; li < sizeof lim / sizeof lim[0]; li++)
    for (int threads = 1; threads <= (small ? 1 : 2); threads++) {
      if (small && (lim[li].kind == 1 || lim[li].kind == 3)) continue;
      Job j;
      memset(&j, 0, sizeof j);
      j.kind = lim[li].kind;
      j.k = lim[li].k;
      if (j.kind == 2) {
        j.src[0] = buf[0];
        for (int o = 0; o < j.k; o++) j.dst[o] = buf[MAXK + o];
      } else if (j.kind == 3) {
        for (int i = 0; i < j.k; i++) j.src[i] = buf[i];
        for (int o = 0; o <= j.k; o++) j.dst[o] = buf[MAXK + o];
      } else {
        for (int i = 0; i < j.k; i++) j.src[i] = buf[i];
        j.dst[0] = buf[MAXK];
      }
      /* sum and copy counts as the pushpull figure does: k inputs, k outputs */
      double moved = (double)bytes * (j.kind == 0 ? 2 : j.kind == 3 ? 2 * j.k : j.k + 1);
      double mn, mx, med;
      long iters;
      char how[64] = "";
      if (j.kind == 0) {
        double mn2, mx2;
        long it2;
        j.blk = 0;
        med = limit_time(&j, n, threads, reps, &mn, &mx, &iters);
        j.blk = 16384;
        double med2 = limit_time(&j, n, threads, reps, &mn2, &mx2, &it2);
        snprintf(how, sizeof how, "; whole-chunk memcpy %.2f GB/s; 64 KB memcpy's %.2f GB/s",
                 moved / med / 1e9, moved / med2 / 1e9);
        if (med2 < med) {
          med = med2;
          mn = mn2;
          mx = mx2;
          iters = it2;
        }
      } else {
        med = limit_time(&j, n, threads, reps, &mn, &mx, &iters);
      }
      /* check the sum once (a broken kernel is a broken limit) */
      if ((j.kind == 1 || j.kind == 3) && j.dst[j.kind == 3 ? j.k : 0][999] != 999.0f * (float)j.k) {
        fprintf(stderr, "kvbench: limit kernel sum k=%d is wrong\n", j.k);
        g_failed = 1;
      }
      char variant[32];
      if (j.kind == 0)
        snprintf(variant, sizeof variant, "t=%d", threads);
      else
        snprintf(variant, sizeof variant, "%c=%d t=%d", j.kind == 2 ? 'n' : 'k', j.k, threads);
      char fig[32], note[160];
      snprintf(fig, sizeof fig, "limit_%s%s", lim[li].name, small ? "@256KB" : "");
      snprintf(note, sizeof note, "pass %d (%s of the run)%s", pass, pass == 1 ? "start" : "end",
               how);
      csv_row(fig, variant, (double)bytes, "machine", "s", med, mn, mx, reps, iters, moved, "ok",
              note);
      fprintf(stderr, "  %-18s %-12s %9.3f GB/s%s\n", fig, variant, moved / med / 1e9, how);
    }
  if (!small) fresh_limit(buf[0], bytes, reps, pass);
  for (int i = 0; i < MAXK * 2 + 1; i++) free(buf[i]);
}

/* ------------------------------------------------------------------------ */
static Fig mkfig(const char *figure, size_t size, int k, int reps, double rep_time,
                 long max_iters) {
  Fig f;
  memset(&f, 0, sizeof f);
  snprintf(f.figure, sizeof f.figure, "%s", figure);
  f.size = size;
  f.k = k;
  f.reps = reps;
  f.rep_time = rep_time;
  f.max_iters = max_iters;
  f.unit = "s";
  return f;
}

static int usage(void) {
  fprintf(stderr,
          "usage: kvbench [--smoke] [--only SUBSTR] [--csv FILE] LIB_A.so [LIB_B.so]\n"
          "       kvbench --rss-child LIB.so BYTES_PER_KEY NKEYS\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *csv_path = NULL;
  const char *libs[2];
  int nlibs = 0;
  g_corrupt = getenv("KVBENCH_CORRUPT") && atoi(getenv("KVBENCH_CORRUPT")) != 0;
  if (argc >= 2 && strcmp(argv[1], "--rss-child") == 0) {
    if (argc != 5) return usage();
    int rc = rss_child(argv[2], (size_t)strtoull(argv[3], NULL, 10), atoi(argv[4]));
    fflush(NULL);
    _exit(rc);
  }
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--smoke") == 0)
      g_smoke = true;
    else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
      g_only = argv[++i];
    else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
      csv_path = argv[++i];
    else if (argv[i][0] == '-' || nlibs == 2)
      return usage();
    else
      libs[nlibs++] = argv[i];
  }
  if (nlibs == 0) return usage();
  g_csv = stdout;
  if (csv_path && !(g_csv = fopen(csv_path, "w"))) {
    fprintf(stderr, "kvbench: cannot write %s: %s\n", csv_path, strerror(errno));
    return 2;
  }
  fprintf(g_csv, "source,figure,variant,size_bytes,lib,unit,median,min,max,reps,iters,"
                 "bytes_per_op,status,note\n");
  double t_start = now();
  double busy_start = machine_busy_s(), own_start = own_cpu_s();
  /* Peak RSS first, while this process is still small: a child's ru_maxrss also
     counts the RSS it inherited at fork (Linux keeps the high-water mark across
     exec), so the children must be forked before the libraries are loaded here. */
  for (int i = 0; i < nlibs; i++) {
    g_lib[i].path = libs[i];
    lib_label(libs[i], g_lib[i].label, sizeof g_lib[i].label);
  }
  g_nlib = nlibs;
  if (selected("rss")) {
    fprintf(stderr, "== peak RSS (child processes)\n");
    run_rss(g_smoke ? (1u << 20) : 67108864, 16, g_smoke ? 1 : 2);
  }
  for (int i = 0; i < nlibs; i++)
    if (lib_load(&g_lib[i], libs[i])) return 2;
  csv_meta("mode", "%s", g_smoke ? "smoke" : "full");
  csv_meta("cores", "%ld", sysconf(_SC_NPROCESSORS_ONLN));
  csv_meta("ram_bytes", "%.0f", (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
  for (int i = 0; i < nlibs; i++) {
    char key[64];
    snprintf(key, sizeof key, "lib_%s", g_lib[i].label);
    csv_meta(key, "%s (MXGetVersion %d)", g_lib[i].path, g_lib[i].version);
  }
  if (g_corrupt) fprintf(stderr, "kvbench: KVBENCH_CORRUPT set: every value check must fail\n");

  static const size_t SIZES_FULL[] = {4096, 262144, 4194304, 67108864};
  static const size_t SIZES_SMOKE[] = {4096};
  const size_t *sizes = g_smoke ? SIZES_SMOKE : SIZES_FULL;
  int nsizes = g_smoke ? 1 : 4;
  size_t big = g_smoke ? (1u << 20) : 67108864;

  if (selected("limit")) {
    fprintf(stderr, "== machine limits (%s), pass 1\n", g_smoke ? "1 MB" : "64 MB");
    run_limits(big, g_smoke ? 3 : 7, 1, false);
    if (!g_smoke) run_limits(262144, 7, 1, true);
  }

  struct {
    const char *fig;
    int ks[4];
    int nk;
    int (*setup)(Lib *, St *, const Fig *);
    int (*run)(Lib *, St *, const Fig *, long);
    int (*check)(Lib *, St *, const Fig *);
  } dense[] = {
      {"push", {1, 2, 4, 8}, 4, push_setup, push_run, push_check},
      {"pull", {1, 2, 8}, 3, pull_setup, pull_run, pull_check},
      {"pushpull", {2, 8}, 2, pushpull_setup, pushpull_run, pushpull_check},
      {"init", {1}, 1, init_setup, init_run, init_check},
  };
  for (size_t d = 0; d < sizeof dense / sizeof dense[0]; d++) {
    if (!selected(dense[d].fig)) continue;
    fprintf(stderr, "== %s\n", dense[d].fig);
    for (int si = 0; si < nsizes; si++)
      for (int ki = 0; ki < dense[d].nk; ki++) {
        size_t S = sizes[si];
        int k = dense[d].ks[ki];
        bool large = S >= 67108864;
        Fig f = mkfig(dense[d].fig, S, k, g_smoke ? 3 : large ? 9 : 11,
                      g_smoke ? 0.002 : large ? 0.05 : 0.04, 100000);
        char hs[32];
        human_size(S, hs, sizeof hs);
        if (strcmp(dense[d].fig, "init") == 0) {
          snprintf(f.variant, sizeof f.variant, "%s", hs);
          f.bytes = 2.0 * (double)S;
          /* fresh keys accumulate: keep at most ~512 MB of them per library */
          f.max_iters = (long)((512.0 * (1 << 20)) / (double)S / (f.reps + 3));
          if (f.max_iters < 1) f.max_iters = 1;

        } else if (strcmp(dense[d].fig, "pull") == 0) {
          snprintf(f.variant, sizeof f.variant, "n=%d %s", k, hs);
          f.bytes = (double)(k + 1) * (double)S;
        } else if (strcmp(dense[d].fig, "pushpull") == 0) {
          snprintf(f.variant, sizeof f.variant, "k=%d %s", k, hs);
          f.bytes = 2.0 * k * (double)S;
        } else {
          snprintf(f.variant, sizeof f.variant, "k=%d %s", k, hs);
          f.bytes = (double)(k + 1) * (double)S;
        }
        f.setup = dense[d].setup;
        f.run = dense[d].run;
        f.check = dense[d].check;
        /* limits timed in turn: every figure at the largest size (64 MB; the smoke
           run's one size), all but init at 4 MB, and the pulls at 256 KB (one
           thread, in cache) */
        bool largest = si == nsizes - 1;
        bool mid = !g_smoke && S == 4194304 && strcmp(f.figure, "init") != 0;
        if (largest || mid || (S == 262144 && strcmp(f.figure, "pull") == 0)) {
          const char *fg = f.figure;
          f.lim_k = k;
          f.lim_kind = strcmp(fg, "init") == 0       ? 4
                       : strcmp(fg, "pushpull") == 0 ? 3
                       : k == 1                      ? 0
                       : strcmp(fg, "pull") == 0     ? 2
                                                     : 1;
          f.lim_threads = S == 262144 ? 1 : 2;
        }
        run_fig(&f);
      }
  }

  if (selected("pair")) {
    fprintf(stderr, "== pair (1-element push + pull)\n");
    for (int sync = 0; sync < 2; sync++) {
      Fig f = mkfig("pair", 4, sync, g_smoke ? 3 : 9, g_smoke ? 0.002 : 0.05, 10000000);
      snprintf(f.variant, sizeof f.variant, "%s", sync ? "sync" : "async");
      f.setup = pair_setup;
      f.run = pair_run;
      f.check = pair_check;
      run_fig(&f);
    }
  }
  if (selected("keys1000")) {
    fprintf(stderr, "== 1000 keys x %d floats\n", MANY_ELEMS);
    for (int one = 1; one >= 0; one--) {
      Fig f = mkfig("keys1000", MANY_ELEMS * 4, one ? 1 : 0, g_smoke ? 3 : 9,
                    g_smoke ? 0.002 : 0.05, 100000);
      snprintf(f.variant, sizeof f.variant, "%s", one ? "one call" : "1000 calls");
      f.setup = many_setup;
      f.run = many_run;
      f.check = many_check;
      run_fig(&f);
    }
  }
  if (selected("rsp")) {
    g_rsp_rows = g_smoke ? 10000 : 1000000;
    fprintf(stderr, "== row_sparse (%zu x %d float32 table)\n", g_rsp_rows, RSP_COLS);
    size_t rows[2] = {g_smoke ? 100 : 1000, g_smoke ? 1000 : 100000};
    for (int i = 0; i < 2; i++) {
      Fig f = mkfig("rsp_pull", g_rsp_rows * RSP_COLS * 4, (int)rows[i], g_smoke ? 3 : 9,
                    g_smoke ? 0.002 : 0.05, 100000);
      snprintf(f.variant, sizeof f.variant, "%zu of %zu rows", rows[i], g_rsp_rows);
      f.bytes = 2.0 * (double)rows[i] * (RSP_COLS * 4 + 8);
      f.sparse = true;
      f.setup = rsp_pull_setup;
      f.run = rsp_pull_run;
      f.check = rsp_pull_check;
      run_fig(&f);
    }
    for (int v = 1; v <= 2; v++) {
      size_t m = push_rows();
      Fig f = mkfig("rsp_push", g_rsp_rows * RSP_COLS * 4, v, g_smoke ? 3 : 9,
                    g_smoke ? 0.002 : 0.05, 100000);
      snprintf(f.variant, sizeof f.variant, "%d x %zu rows", v, m);
      size_t out_rows = v == 1 ? m : m + m / 2;
      f.bytes = (double)(v * m + out_rows) * (RSP_COLS * 4 + 8);
      f.sparse = true;
      f.setup = rsp_push_setup;
      f.run = rsp_push_run;
      f.check = rsp_push_check;
      run_fig(&f);
    }
    for (int l = 0; l < g_nlib; l++)
      if (g_rsp[l].kv) {
        g_lib[l].MXNDArrayWaitAll();
        g_lib[l].MXKVStoreFree(g_rsp[l].kv);
      }
    free(g_tab_ids);
    free(g_tab_data);
  }

  if (selected("limit")) {
    fprintf(stderr, "== machine limits (%s), pass 2\n", g_smoke ? "1 MB" : "64 MB");
    run_limits(big, g_smoke ? 3 : 7, 2, false);
    if (!g_smoke) run_limits(262144, 7, 2, true);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  csv_meta("elapsed_s", "%.1f", now() - t_start);
  double other = (machine_busy_s() - busy_start) - (own_cpu_s() - own_start);
  csv_meta("other_load_cores", "%.2f", (other > 0 ? other : 0) / (now() - t_start));
  csv_meta("self_maxrss_bytes", "%.0f", (double)ru.ru_maxrss * 1024.0);
  fprintf(stderr,
          "kvbench: %.1f s, peak RSS of this process %.2f GiB, other processes used %.2f "
          "cores on average%s\n",
          now() - t_start, (double)ru.ru_maxrss / (1 << 20),
          (other > 0 ? other : 0) / (now() - t_start), g_failed ? ", FAILED" : "");
  fflush(NULL);
  _exit(g_failed ? 1 : 0); /* skip library destructors (MXNet engine teardown) */
}
