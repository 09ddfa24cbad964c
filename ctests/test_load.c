/*
 * MXNDArrayLoad on hostile and unusual files (issue 9, items 4.3, 4.4, 4.6):
 *   - /dev/zero and a 768 MiB file with a wrong magic fail at once, without
 *     reading the file (MXNet 1.9.1 fails after 8 bytes);
 *   - a 124-byte file claiming 800 MB of row_sparse rows fails before
 *     anything is allocated for the rows;
 *   - pipes load (a source with no length) and their claims are bounded by
 *     the bytes they hold;
 *   - arrays of ndim 40 and 1000 round-trip through MXNDArraySave/Load (MXNet
 *     1.9.1 loads ndim 1000);
 *   - MXNDArrayLoadFromBuffer loads a file's bytes from memory.
 * Memory is checked with getrusage's peak RSS and /proc/self/status's VmPeak
 * (address space, which an untouched mapping grows too). Temporary files are
 * mkstemp files, removed at exit. The whole test runs under alarm(60).
 */
#include "check.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

static live_t g_start;

/* ---------------------------------------------------------------- helpers */

#define MAX_TMP 8
static char g_tmp[MAX_TMP][64];
static int g_ntmp;

static void remove_tmp(void) {
  for (int i = 0; i < g_ntmp; i++) unlink(g_tmp[i]);
}

/* A new empty temporary file, removed at exit; returns its path. */
static const char *new_tmp(void) {
  CHECK(g_ntmp < MAX_TMP);
  char *p = g_tmp[g_ntmp];
  snprintf(p, sizeof g_tmp[0], "/tmp/mxkv_load_XXXXXX");
  int fd = mkstemp(p);
  CHECK(fd >= 0);
  close(fd);
  g_ntmp++;
  return p;
}

static void write_file(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(b, 1, n, f) == n);
  CHECK(fclose(f) == 0);
}

static size_t read_file(const char *path, unsigned char *b, size_t cap) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  size_t n = fread(b, 1, cap, f);
  CHECK(fgetc(f) == EOF);
  fclose(f);
  return n;
}

static long max_rss_kb(void) {
  struct rusage u;
  CHECK(getrusage(RUSAGE_SELF, &u) == 0);
  return u.ru_maxrss;
}

/* Peak virtual memory (kB): grows with every mapping, touched or not. */
static long vm_peak_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  CHECK(f != NULL);
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f) != NULL) {
    if (sscanf(line, "VmPeak: %ld kB", &kb) == 1) break;
  }
  fclose(f);
  CHECK(kb > 0);
  return kb;
}

/* A load that must fail with -1 and a message holding `want`. */
static void load_fails(const char *path, const char *want) {
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_ERR(MXNDArrayLoad(path, &n, &arr, &nn, &names), want);
  CHECK(strncmp(MXGetLastError(), "MXNDArrayLoad: ", 15) == 0);
}

/* The 124-byte file of issue 9 (4.4): one row_sparse float32 array whose
   storage shape, shape and index array claim 10^8 rows of two values
   (800 MB of rows, 800 MB of indices), followed by 24 bytes. */
static void claims_800mb_of_rows(unsigned char b[124]) {
  size_t p = 0;
  memset(b, 0, 124);
#define PUT(v, T)            \
  do {                       \
    T x_ = (T)(v);           \
    memcpy(b + p, &x_, sizeof x_); \
    p += sizeof x_;          \
  } while (0)
  PUT(0x112, uint64_t); /* list magic */
  PUT(0, uint64_t);     /* reserved */
  PUT(1, uint64_t);     /* one array */
  PUT(0xF993FAC9u, uint32_t);
  PUT(1, int32_t); /* row_sparse */
  for (int s = 0; s < 2; s++) { /* storage shape, shape */
    PUT(2, int32_t);
    PUT(100000000, int64_t);
    PUT(2, int64_t);
  }
  PUT(1, int32_t);     /* cpu */
  PUT(0, int32_t);     /* dev id */
  PUT(DT_F32, int32_t);
  PUT(DT_I64, int32_t); /* aux type */
  PUT(1, int32_t);      /* aux ndim */
  PUT(100000000, int64_t);
#undef PUT
  CHECK(p == 100);
}

/* Loads `path`, which must hold one array, and returns it. */
static NDArrayHandle load_one(const char *path, const char *name) {
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(path, &n, &arr, &nn, &names));
  CHECK(n == 1 && nn == 1 && strcmp(names[0], name) == 0);
  return arr[0];
}

/* ---------------------------------------------------------------- tests */

static void warm_up(const char *path) {
  /* A first save and load of 8 MB: thread pools and allocator arenas exist
     before the memory checks below. */
  uint32_t shape[1] = {2u << 20};
  NDArrayHandle a = make_f32_shape(shape, 1, NULL);
  const char *key = "w";
  CHECK_OK(MXNDArraySave(path, 1, &a, &key));
  NDArrayHandle b = load_one(path, "w");
  CHECK_OK(MXNDArrayFree(a));
  CHECK_OK(MXNDArrayFree(b));
}

static void test_dev_zero(void) {
  if (access("/dev/zero", R_OK) != 0) {
    fprintf(stderr, "  (no /dev/zero: skipped)\n");
    return;
  }
  long rss = max_rss_kb();
  load_fails("/dev/zero",
             "MXNDArrayLoad: Check failed: header == kMXAPINDArrayListMagic: Invalid NDArray file format");
  CHECK(max_rss_kb() - rss < 64 * 1024);
}

static void test_big_wrong_magic(const char *path) {
  /* 768 MiB of zeros, none of them written. */
  int fd = open(path, O_WRONLY | O_TRUNC);
  CHECK(fd >= 0);
  CHECK(ftruncate(fd, (off_t)768 << 20) == 0);
  close(fd);
  long rss = max_rss_kb();
  load_fails(path,
             "MXNDArrayLoad: Check failed: header == kMXAPINDArrayListMagic: Invalid NDArray file format");
  long grew = max_rss_kb() - rss;
  if (grew >= 64 * 1024) {
    fprintf(stderr, "a wrong magic cost %ld kB of memory\n", grew);
    exit(1);
  }
}

static void test_claimed_rows(const char *path) {
  unsigned char b[124];
  claims_800mb_of_rows(b);
  write_file(path, b, sizeof b);
  long rss = max_rss_kb(), vm = vm_peak_kb();
  load_fails(path, "Invalid NDArray file format: row_sparse array of shape [100000000,2]");
  CHECK(strstr(MXGetLastError(), "needs 1600000000 bytes, the file holds 24 more") != NULL);
  long grew_rss = max_rss_kb() - rss, grew_vm = vm_peak_kb() - vm;
  if (grew_rss >= 64 * 1024 || grew_vm >= 256 * 1024) {
    fprintf(stderr, "refusing 800 MB of claimed rows grew peak RSS by %ld kB, VmPeak by %ld kB\n",
            grew_rss, grew_vm);
    exit(1);
  }
}

/* A pipe holding `n` bytes (fewer than a pipe buffer), its write end closed:
   loaded through /proc/self/fd, a file of no length. */
static void load_pipe(const unsigned char *b, size_t n, const char *want) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  CHECK(write(fds[1], b, n) == (ssize_t)n);
  close(fds[1]);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fds[0]);
  if (want != NULL) {
    load_fails(path, want);
  } else {
    NDArrayHandle a = load_one(path, "p");
    CHECK_F32(a, 3, 1.5f, -2.0f, 4.25f);
    CHECK_OK(MXNDArrayFree(a));
  }
  close(fds[0]);
}

static void test_pipes(const char *path) {
  if (access("/proc/self/fd", R_OK) != 0) {
    fprintf(stderr, "  (no /proc/self/fd: pipes skipped)\n");
    return;
  }
  NDArrayHandle a = make_f32(3, (const float[]){1.5f, -2.0f, 4.25f});
  const char *key = "p";
  CHECK_OK(MXNDArraySave(path, 1, &a, &key));
  CHECK_OK(MXNDArrayFree(a));
  unsigned char b[256];
  size_t n = read_file(path, b, sizeof b);
  load_pipe(b, n, NULL);
  for (size_t cut = 0; cut < n; cut++) load_pipe(b, cut, "Invalid NDArray file format");

  unsigned char rows[124];
  claims_800mb_of_rows(rows);
  long rss = max_rss_kb(), vm = vm_peak_kb();
  load_pipe(rows, sizeof rows, "Invalid NDArray file format: truncated at byte 100");
  CHECK(max_rss_kb() - rss < 64 * 1024 && vm_peak_kb() - vm < 256 * 1024);
}

/* An array of `ndim` dims (all 1 but dims 2 and ndim-1: 2 and 3) holding six
   values, saved and loaded back: same shape, same values. */
static void round_trip_ndim(const char *path, uint32_t ndim) {
  uint32_t *shape = malloc(ndim * sizeof *shape);
  CHECK(shape != NULL);
  for (uint32_t i = 0; i < ndim; i++) shape[i] = 1;
  shape[2] = 2;
  shape[ndim - 1] = 3;
  const float vals[6] = {0.5f, -1, 2, 1e30f, -0.0f, 7};
  NDArrayHandle a = make_f32_shape(shape, ndim, vals);
  const char *key = "deep";
  CHECK_OK(MXNDArraySave(path, 1, &a, &key));
  NDArrayHandle b = load_one(path, "deep");
  int got_ndim = 0;
  const int64_t *dims = NULL;
  CHECK_OK(MXNDArrayGetShapeEx64(b, &got_ndim, &dims));
  CHECK(got_ndim == (int)ndim);
  for (uint32_t i = 0; i < ndim; i++) CHECK(dims[i] == (int64_t)shape[i]);
  int dtype = -1;
  CHECK_OK(MXNDArrayGetDType(b, &dtype));
  CHECK(dtype == DT_F32);
  CHECK_F32V(b, 6, vals);
  CHECK_OK(MXNDArrayFree(a));
  CHECK_OK(MXNDArrayFree(b));

  /* row_sparse of as many dims: rows 1 and 4 of 5 */
  shape[0] = 5;
  uint32_t aux_ndims[1] = {1}, aux_shape[1] = {0};
  int aux_type[1] = {DT_I64};
  NDArrayHandle sp = NULL, d = NULL, idx = NULL;
  CHECK_OK(MXNDArrayCreateSparseEx(1, shape, ndim, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims,
                                   aux_shape, &sp));
  shape[0] = 2;
  float rows[12];
  for (int i = 0; i < 12; i++) rows[i] = (float)i - 3.5f;
  d = make_f32_shape(shape, ndim, rows);
  const int64_t ids[2] = {1, 4};
  idx = make_typed(2, DT_I64, ids);
  CHECK_OK(MXNDArraySyncCopyFromNDArray(sp, d, -1));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(sp, idx, 0));
  CHECK_OK(MXNDArraySave(path, 1, &sp, &key));
  b = load_one(path, "deep");
  int stype = -1;
  CHECK_OK(MXNDArrayGetStorageType(b, &stype));
  CHECK(stype == 1);
  CHECK_OK(MXNDArrayGetShapeEx64(b, &got_ndim, &dims));
  CHECK(got_ndim == (int)ndim && dims[0] == 5);
  for (uint32_t i = 1; i < ndim; i++) CHECK(dims[i] == (int64_t)shape[i]);
  NDArrayHandle bd = NULL, bi = NULL;
  CHECK_OK(MXNDArrayGetDataNDArray(b, &bd));
  CHECK_OK(MXNDArrayGetAuxNDArray(b, 0, &bi));
  CHECK_F32V(bd, 12, rows);
  int64_t got_ids[2] = {0, 0};
  CHECK_OK(MXNDArraySyncCopyToCPU(bi, got_ids, 2));
  CHECK(got_ids[0] == 1 && got_ids[1] == 4);
  NDArrayHandle hs[6] = {sp, d, idx, b, bd, bi};
  for (int i = 0; i < 6; i++) CHECK_OK(MXNDArrayFree(hs[i]));
  free(shape);
}

/* MXNDArrayLoadFromBuffer (MXNet's nd.load_frombuffer; libmxkv had none, so
   mxkv's Python wrote the bytes to a memfd and loaded that): the bytes of a
   saved file load as the file does, into arrays of their own (the buffer is
   overwritten after), only `size` bytes are read, claims are checked against
   them, and NULL is refused. */
static void test_from_buffer(const char *path) {
  const uint32_t small_shape[2] = {2, 3}, big_shape[1] = {1u << 20};
  const float small[6] = {0.5f, -1, 2, 1e30f, -0.0f, 7};
  float *big = malloc(sizeof(float) << 20);
  CHECK(big != NULL);
  for (uint32_t i = 0; i < (1u << 20); i++) big[i] = (float)(i % 1000) * 0.25f - 3;
  NDArrayHandle in[2] = {make_f32_shape(small_shape, 2, small), make_f32_shape(big_shape, 1, big)};
  const char *keys[2] = {"arg:small", "arg:big"};
  CHECK_OK(MXNDArraySave(path, 2, in, keys));
  size_t cap = (5u << 20), n = 0;
  unsigned char *buf = malloc(cap);
  CHECK(buf != NULL);
  n = read_file(path, buf, cap);
  for (int round = 0; round < 2; round++) { /* the second into pooled memory */
    uint32_t got = 0, nn = 0;
    NDArrayHandle *arr = NULL;
    const char **names = NULL;
    CHECK_OK(MXNDArrayLoadFromBuffer(buf, n, &got, &arr, &nn, &names));
    CHECK(got == 2 && nn == 2);
    CHECK(strcmp(names[0], "arg:small") == 0 && strcmp(names[1], "arg:big") == 0);
    NDArrayHandle out[2] = {arr[0], arr[1]};
    unsigned char *copy = malloc(n);
    CHECK(copy != NULL);
    memcpy(copy, buf, n);
    memset(buf, 0xAB, n); /* the arrays hold copies */
    int ndim = 0;
    const int64_t *dims = NULL;
    CHECK_OK(MXNDArrayGetShapeEx64(out[0], &ndim, &dims));
    CHECK(ndim == 2 && dims[0] == 2 && dims[1] == 3);
    CHECK_F32V(out[0], 6, small);
    float *back = malloc(sizeof(float) << 20);
    CHECK(back != NULL);
    CHECK_OK(MXNDArraySyncCopyToCPU(out[1], back, 1u << 20));
    CHECK(memcmp(back, big, sizeof(float) << 20) == 0);
    free(back);
    memcpy(buf, copy, n);
    free(copy);
    CHECK_OK(MXNDArrayFree(out[0]));
    CHECK_OK(MXNDArrayFree(out[1]));
  }
  /* a size one short: the last name is cut */
  uint32_t got = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_ERR(MXNDArrayLoadFromBuffer(buf, n - 1, &got, &arr, &nn, &names),
            "name 1 needs 7 bytes, the file holds 6 more");
  CHECK(strncmp(MXGetLastError(), "MXNDArrayLoadFromBuffer: ", 25) == 0);
  CHECK_ERR(MXNDArrayLoadFromBuffer(NULL, 8, &got, &arr, &nn, &names), "ndarray_buffer");
  CHECK_ERR(MXNDArrayLoadFromBuffer(buf, n, NULL, &arr, &nn, &names), "output pointer is NULL");
  /* 800 MB of claimed rows in 124 bytes: refused before allocating */
  unsigned char rows[124];
  claims_800mb_of_rows(rows);
  CHECK_ERR(MXNDArrayLoadFromBuffer(rows, sizeof rows, &got, &arr, &nn, &names),
            "needs 1600000000 bytes, the file holds 24 more");
  CHECK_OK(MXNDArrayFree(in[0]));
  CHECK_OK(MXNDArrayFree(in[1]));
  free(buf);
  free(big);
}

int main(void) {
  alarm(60); /* nothing here may take long: a hang is a failure */
  atexit(remove_tmp);
  g_start = live_now();
  const char *a = new_tmp(), *b = new_tmp();

  warm_up(a);
  test_dev_zero();
  CHECK_LIVE(g_start);
  test_big_wrong_magic(b);
  CHECK_LIVE(g_start);
  test_claimed_rows(b);
  CHECK_LIVE(g_start);
  test_pipes(a);
  CHECK_LIVE(g_start);
  round_trip_ndim(a, 33);
  round_trip_ndim(a, 40);
  round_trip_ndim(a, 1000);
  CHECK_LIVE(g_start);
  test_from_buffer(a);
  CHECK_LIVE(g_start);
  printf("test_load: all checks passed\n");
  return 0;
}
