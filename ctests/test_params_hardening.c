/*
 * NDArray C API findings of the session-9 review, checked against MXNet 1.9.1:
 *   - error texts of dense-only functions given sparse arrays read as
 *     sentences ("cannot get the data of a row_sparse array"), never "of of";
 *   - MXNDArrayGetData of an array with no elements gives NULL, and a
 *     negative device id of a cpu or cpu_shared context means device 0, as in
 *     MXNet (which still refuses gpu and cpu_pinned in its CPU build);
 *   - MXNDArrayLoad of 1 TiB sparse files (4 KiB on disk) whose header claims
 *     huge counts, a huge name or ndim returns -1 naming the claim (it
 *     aborted on a failed allocation; MXNet 1.9.1 returns -1 with bad_alloc).
 *     These run in a child process whose address space is capped (not under
 *     ASan or valgrind, which need theirs; there only the claims refused
 *     whatever the memory run);
 *   - MXNDArrayLoad of a pipe whose header claims a 1 TiB array, followed by
 *     endless zeros, returns -1 when its buffer, grown with the bytes read,
 *     cannot grow (it aborted; MXNet: "Failed to allocate CPU Memory");
 *   - MXNDArraySave streams the arrays to the file (it built the whole file
 *     in memory first: saving 128 MiB grew the peak RSS by 128 MiB), loading
 *     that file from a pipe holds it once (it held it twice), and a
 *     failed write removes the half-written regular file and says so (a
 *     device such as /dev/full is left alone, and so is a symbolic link).
 * The whole test runs under alarm(120).
 */
#include "check.h"
#include "fork_util.h"

#include <ctype.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>

static live_t g_start;

/* ---------------------------------------------------------------- helpers */

/* Fails when `msg` holds the same word twice in a row ("of of"). */
static void check_no_doubled_word(const char *msg) {
  char prev[64] = "", word[64];
  const char *p = msg;
  while (*p) {
    while (*p && !isalpha((unsigned char)*p)) p++;
    size_t n = 0;
    while (*p && (isalnum((unsigned char)*p) || *p == '_')) {
      if (n + 1 < sizeof word) word[n++] = *p;
      p++;
    }
    word[n] = '\0';
    if (n > 0 && strcmp(word, prev) == 0) {
      fprintf(stderr, "doubled word \"%s\" in \"%s\"\n", word, msg);
      exit(1);
    }
    snprintf(prev, sizeof prev, "%s", word);
  }
}

/* The call must fail with exactly the message `want`. */
#define CHECK_MSG(call, want)                    \
  do {                                           \
    CHECK_ERR(call, want);                       \
    CHECK(strcmp(MXGetLastError(), want) == 0);  \
    check_no_doubled_word(MXGetLastError());     \
  } while (0)

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
  snprintf(p, sizeof g_tmp[0], "/tmp/mxkv_hard_XXXXXX");
  int fd = mkstemp(p);
  CHECK(fd >= 0);
  close(fd);
  g_ntmp++;
  return p;
}

/* Bytes appended to a buffer, little-endian as the .params format. */
typedef struct {
  unsigned char b[256];
  size_t n;
} buf_t;
static void put(buf_t *b, const void *v, size_t n) {
  CHECK(b->n + n <= sizeof b->b);
  memcpy(b->b + b->n, v, n);
  b->n += n;
}
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_i32(buf_t *b, int32_t v) { put(b, &v, 4); }
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }

/* Writes `b` to `path`, then makes the file `len` bytes long (zeros, not
   written: a sparse file). Returns 0 when the file system refuses. */
static int write_sparse(const char *path, const buf_t *b, uint64_t len) {
  int fd = open(path, O_WRONLY | O_TRUNC);
  CHECK(fd >= 0);
  CHECK(write(fd, b->b, b->n) == (ssize_t)b->n);
  int ok = ftruncate(fd, (off_t)len) == 0;
  close(fd);
  return ok;
}

/* Address space in use (kB). */
static long vm_size_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f) != NULL) {
    if (sscanf(line, "VmSize: %ld kB", &kb) == 1) break;
  }
  fclose(f);
  return kb;
}

/* A load that must fail with -1 and a message holding `want`. */
static void load_fails(const char *path, const char *want) {
  uint32_t n = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_ERR(MXNDArrayLoad(path, &n, &arr, &nn, &names), want);
  CHECK(strncmp(MXGetLastError(), "MXNDArrayLoad: ", 15) == 0);
  check_no_doubled_word(MXGetLastError());
}

static NDArrayHandle make_csr(void) {
  uint32_t shape[2] = {2, 3}, aux_ndims[2] = {1, 1}, aux_shape[2] = {3, 0};
  int aux_type[2] = {DT_I64, DT_I64};
  NDArrayHandle h = NULL;
  CHECK_OK(MXNDArrayCreateSparseEx(2, shape, 2, DEV_CPU, 0, 0, DT_F32, 2, aux_type, aux_ndims,
                                   aux_shape, &h));
  return h;
}

/* ---------------------------------------------------------------- tests */

/* Dense-only functions name what they cannot do and to which storage type. */
static void test_dense_only_texts(void) {
  const int64_t idx[1] = {1};
  NDArrayHandle rsp = make_rsp(3, 2, idx, 1, (const float[]){1, 2});
  NDArrayHandle csr = make_csr();
  NDArrayHandle dense = make_f32(2, (const float[]){5, 6});
  NDArrayHandle none = NULL;
  CHECK_OK(MXNDArrayCreateNone(&none));
  void *p = NULL;
  float buf[6];
  CHECK_MSG(MXNDArrayGetData(rsp, &p),
            "MXNDArrayGetData: cannot get the data of a row_sparse array: this function takes "
            "dense arrays only");
  CHECK_MSG(MXNDArrayGetData(csr, &p),
            "MXNDArrayGetData: cannot get the data of a csr array: this function takes dense "
            "arrays only");
  CHECK_MSG(MXNDArrayGetData(none, &p),
            "MXNDArrayGetData: cannot get the data of an empty NDArray (created with "
            "MXNDArrayCreateNone)");
  CHECK(p == NULL);
  CHECK_MSG(MXNDArraySyncCopyFromCPU(rsp, buf, 6),
            "MXNDArraySyncCopyFromCPU: cannot copy into a row_sparse array: this function takes "
            "dense arrays only");
  CHECK_MSG(MXNDArraySyncCopyToCPU(csr, buf, 6),
            "MXNDArraySyncCopyToCPU: cannot copy from a csr array: this function takes dense "
            "arrays only");
  /* a sparse source of a sparse array's part */
  CHECK_MSG(MXNDArraySyncCopyFromNDArray(rsp, csr, -1),
            "MXNDArraySyncCopyFromNDArray: cannot copy from a csr array: this function takes "
            "dense arrays only");
  CHECK_MSG(MXNDArrayGetDataNDArray(none, &p),
            "MXNDArrayGetDataNDArray: cannot get the data of an empty NDArray (created with "
            "MXNDArrayCreateNone)");
  NDArrayHandle hs[4] = {rsp, csr, dense, none};
  for (int i = 0; i < 4; i++) CHECK_OK(MXNDArrayFree(hs[i]));
}

/* MXNet 1.9.1 gives NULL for arrays of shape [0] and [2,0] (their data
   pointer is never allocated); a non-empty array gives its address. */
static void test_get_data_of_no_elements(void) {
  const uint32_t shapes[3][2] = {{0, 0}, {2, 0}, {0, 3}};
  const uint32_t ndims[3] = {1, 2, 2};
  for (int i = 0; i < 3; i++) {
    for (int dt = DT_F32; dt <= DT_BF16; dt++) {
      NDArrayHandle h = NULL;
      CHECK_OK(MXNDArrayCreateEx(shapes[i], ndims[i], DEV_CPU, 0, 0, dt, &h));
      void *p = (void *)&h;
      CHECK_OK(MXNDArrayGetData(h, &p));
      CHECK(p == NULL);
      /* still usable: copies of no elements, a save and a load */
      CHECK_OK(MXNDArraySyncCopyToCPU(h, NULL, 0));
      CHECK_OK(MXNDArrayFree(h));
    }
  }
  NDArrayHandle a = make_f32(3, (const float[]){1, 2, 3});
  float *p = NULL;
  CHECK_OK(MXNDArrayGetData(a, (void **)&p));
  CHECK(p != NULL && p[0] == 1 && p[2] == 3);
  p[1] = 7;
  CHECK_F32(a, 3, 1.0f, 7.0f, 3.0f);
  CHECK_OK(MXNDArrayFree(a));
}

static void check_ctx(NDArrayHandle h, int dev_type, int dev_id) {
  int t = -9, i = -9;
  CHECK_OK(MXNDArrayGetContext(h, &t, &i));
  if (t != dev_type || i != dev_id) {
    fprintf(stderr, "context (%d, %d), expected (%d, %d)\n", t, i, dev_type, dev_id);
    exit(1);
  }
  CHECK_OK(MXNDArrayFree(h));
}

/* MXNet 1.9.1's Context::Create makes a negative cpu device id 0: cpu(-1)
   and cpu(-5) are cpu(0), cpu_shared(-1) is cpu_shared(0). */
static void test_negative_cpu_dev_id(void) {
  uint32_t s2 = 2;
  int64_t s2l = 2;
  NDArrayHandle h = NULL;
  CHECK_OK(MXNDArrayCreateEx(&s2, 1, DEV_CPU, -1, 0, DT_F32, &h));
  check_ctx(h, DEV_CPU, 0);
  CHECK_OK(MXNDArrayCreateEx(&s2, 1, DEV_CPU, -5, 0, DT_I64, &h));
  check_ctx(h, DEV_CPU, 0);
  CHECK_OK(MXNDArrayCreate(&s2, 1, DEV_CPU, -1, 0, &h));
  check_ctx(h, DEV_CPU, 0);
  CHECK_OK(MXNDArrayCreateEx64(&s2l, 1, DEV_CPU, INT32_MIN, 0, DT_F64, &h));
  check_ctx(h, DEV_CPU, 0);
  CHECK_OK(MXNDArrayCreateEx(&s2, 1, DEV_CPU_SHARED, -1, 0, DT_F32, &h));
  check_ctx(h, DEV_CPU_SHARED, 0);
  CHECK_OK(MXNDArrayCreateEx(&s2, 1, DEV_CPU, 2, 0, DT_F32, &h));
  check_ctx(h, DEV_CPU, 2);
  uint32_t shape[2] = {4, 2}, aux_ndims[1] = {1}, aux_shape[1] = {0};
  int aux_type[1] = {DT_I64};
  CHECK_OK(MXNDArrayCreateSparseEx(1, shape, 2, DEV_CPU, -1, 0, DT_F32, 1, aux_type, aux_ndims,
                                   aux_shape, &h));
  check_ctx(h, DEV_CPU, 0);
  /* the values work as any cpu(0) array's */
  CHECK_OK(MXNDArrayCreateEx(&s2, 1, DEV_CPU, -1, 0, DT_F32, &h));
  CHECK_OK(MXNDArraySyncCopyFromCPU(h, (const float[]){2.5f, -1.0f}, 2));
  CHECK_F32(h, 2, 2.5f, -1.0f);
  CHECK_OK(MXNDArrayFree(h));
  /* gpu stays refused, as in MXNet's CPU build */
  h = NULL;
  CHECK_ERR(MXNDArrayCreateEx(&s2, 1, DEV_GPU, -1, 0, DT_F32, &h), "USE_CUDA");
  CHECK(h == NULL);
}

/* One sparse file of the review per claim; `capped`: the address space is
   capped at 2 GiB more than in use, so that every claim beyond it fails
   whatever the machine's memory. */
static void sparse_claims(const char *path, int capped) {
  const uint64_t tib = UINT64_C(1) << 40;
  buf_t b = {{0}, 0};
  /* 2^36 arrays: more than MXNDArrayLoad's uint32 count can return */
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, UINT64_C(1) << 36);
  if (!write_sparse(path, &b, tib)) {
    fprintf(stderr, "  (no 1 TiB sparse files here: skipped)\n");
    return;
  }
  load_fails(path, "Invalid NDArray file format: the file claims 68719476736 arrays, more than "
                   "MXNDArrayLoad can return (4294967295, its counts are uint32)");
  /* no arrays, 2^36 names */
  b.n = 0;
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, 0), put_u64(&b, UINT64_C(1) << 36);
  CHECK(write_sparse(path, &b, tib));
  load_fails(path, "the file claims 68719476736 names");
  /* no arrays, one name of 2^39 bytes: names must be none or one per array */
  b.n = 0;
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, 0), put_u64(&b, 1), put_u64(&b, UINT64_C(1) << 39);
  CHECK(write_sparse(path, &b, tib));
  load_fails(path, "Invalid NDArray file format: 1 names for 0 arrays");
  if (!capped) return;
  /* 2^32 - 1 arrays: their bookkeeping alone needs ~550 GB */
  b.n = 0;
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, UINT32_MAX);
  CHECK(write_sparse(path, &b, tib));
  load_fails(path, "holding the 4294967295 arrays the file claims needs 549755813760 bytes of "
                   "memory, more than this process can allocate");
  /* one none array, then a name of 2^39 bytes */
  b.n = 0;
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, 1);
  put_u32(&b, 0xF993FAC9u), put_i32(&b, 0), put_i32(&b, 0);
  put_u64(&b, 1), put_u64(&b, UINT64_C(1) << 39);
  CHECK(write_sparse(path, &b, tib));
  load_fails(path, "name 0 needs 549755813888 bytes of memory, more than this process can "
                   "allocate");
  /* ndim 2^31 - 1: 16 GiB of dims */
  b.n = 0;
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, 1);
  put_u32(&b, 0xF993FAC9u), put_i32(&b, 0), put_i32(&b, INT32_MAX);
  CHECK(write_sparse(path, &b, tib));
  load_fails(path, "a shape of ndim 2147483647 in array 0 needs 17179869176 bytes of memory, "
                   "more than this process can allocate");
}

/* Review finding 2: a pipe whose header claims one float32 array of 2^38
   elements (1 TiB), then zeros without end (a writer process). A claim of a
   pipe is never allocated or mapped: the buffer grows with the bytes read,
   here until the capped address space is full. */
static void pipe_claim(void) {
  if (access("/proc/self/fd", R_OK) != 0) {
    fprintf(stderr, "  (no /proc/self/fd: pipe skipped)\n");
    return;
  }
  buf_t b = {{0}, 0};
  put_u64(&b, 0x112), put_u64(&b, 0), put_u64(&b, 1);
  put_u32(&b, 0xF993FAC9u), put_i32(&b, 0), put_i32(&b, 1), put_u64(&b, UINT64_C(1) << 38);
  put_i32(&b, DEV_CPU), put_i32(&b, 0), put_i32(&b, DT_F32);
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t writer = fork();
  CHECK(writer >= 0);
  if (writer == 0) {
    close(fds[0]);
    signal(SIGPIPE, SIG_IGN);
    static const unsigned char zeros[65536];
    if (write(fds[1], b.b, b.n) != (ssize_t)b.n) _exit(1);
    while (write(fds[1], zeros, sizeof zeros) > 0) {
    }
    _exit(0); /* the reader closed its end */
  }
  close(fds[1]);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fds[0]);
  load_fails(path, "out of memory reading array of shape [274877906944] (1099511627776 bytes) "
                   "after ");
  close(fds[0]);
  int status = 0;
  CHECK(waitpid(writer, &status, 0) == writer);
}

/* Runs `fn(path)` in a child, which must exit 0. */
struct path_fn {
  void (*fn)(const char *);
  const char *path;
};
static int call_path_fn(void *arg) {
  struct path_fn *c = arg;
  c->fn(c->path);
  return 0;
}
static void in_child(void (*fn)(const char *), const char *path, const char *what) {
  struct path_fn c = {fn, path};
  CHECK_CHILD(wait_child(fork_child(call_path_fn, &c, 0)), what);
}

/* The claims above, in a child (its address space capped where that is
   possible): it must exit 0, not die. */
static void huge_claims(const char *path) {
  int capped = !under_asan() && !under_valgrind() && vm_size_kb() > 0;
  if (capped) {
    struct rlimit r;
    r.rlim_cur = r.rlim_max = (rlim_t)(vm_size_kb() + (2L << 20)) * 1024;
    CHECK(setrlimit(RLIMIT_AS, &r) == 0);
  }
  sparse_claims(path, capped);
  if (capped) pipe_claim();
}

static long max_rss_kb(void) {
  struct rusage u;
  CHECK(getrusage(RUSAGE_SELF, &u) == 0);
  return u.ru_maxrss;
}

/* Saving 128 MiB grows the peak RSS by far less than 128 MiB: the file is
   not built in memory (a fresh child: its peak RSS is its own). */
static void save_streams(const char *path) {
  uint32_t n = 32u << 20; /* float32: 128 MiB */
  NDArrayHandle a = NULL;
  CHECK_OK(MXNDArrayCreateEx(&n, 1, DEV_CPU, 0, 0, DT_F32, &a));
  float *p = NULL;
  CHECK_OK(MXNDArrayGetData(a, (void **)&p));
  for (uint32_t i = 0; i < n; i++) p[i] = (float)(i % 1000);
  const char *key = "big";
  long rss = max_rss_kb();
  CHECK_OK(MXNDArraySave(path, 1, &a, &key));
  long grew = max_rss_kb() - rss;
  if (grew >= 48 * 1024) {
    fprintf(stderr, "saving 128 MiB grew the peak RSS by %ld kB\n", grew);
    exit(1);
  }
  CHECK_OK(MXNDArrayFree(a));
  /* what was written loads back */
  uint32_t cnt = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(path, &cnt, &arr, &nn, &names));
  CHECK(cnt == 1 && nn == 1 && strcmp(names[0], "big") == 0);
  CHECK_OK(MXNDArrayGetData(arr[0], (void **)&p));
  for (uint32_t i = 0; i < n; i += 4099) CHECK(p[i] == (float)(i % 1000));
  CHECK(p[n - 1] == (float)((n - 1) % 1000));
  CHECK_OK(MXNDArrayFree(arr[0]));
}

/* Loading the 128 MiB file of save_streams from a pipe (a writer process
   copies it in) grows the peak RSS by the array and a little, not twice the
   array: the bytes go straight into the array's storage once the claim is
   proved by half of them (those are read into chunks, each freed once moved
   into the array). It grew by 262 MiB when the data was read whole into a
   buffer, then copied. */
static void load_pipe_once(const char *path) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  fflush(NULL);
  pid_t writer = fork();
  CHECK(writer >= 0);
  if (writer == 0) {
    close(fds[0]);
    int fd = open(path, O_RDONLY);
    if (fd < 0) _exit(1);
    static char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
      for (ssize_t off = 0; off < n;) {
        ssize_t w = write(fds[1], buf + off, (size_t)(n - off));
        if (w <= 0) _exit(1);
        off += w;
      }
    }
    _exit(n == 0 ? 0 : 1);
  }
  close(fds[1]);
  char src[64];
  snprintf(src, sizeof src, "/proc/self/fd/%d", fds[0]);
  long rss = max_rss_kb();
  uint32_t cnt = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(src, &cnt, &arr, &nn, &names));
  long grew = max_rss_kb() - rss;
  close(fds[0]);
  int status = 0;
  CHECK(waitpid(writer, &status, 0) == writer && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(cnt == 1 && nn == 1 && strcmp(names[0], "big") == 0);
  const uint32_t n = 32u << 20;
  float *p = NULL;
  CHECK_OK(MXNDArrayGetData(arr[0], (void **)&p));
  for (uint32_t i = 0; i < n; i += 4099) CHECK(p[i] == (float)(i % 1000));
  CHECK(p[n - 1] == (float)((n - 1) % 1000));
  CHECK_OK(MXNDArrayFree(arr[0]));
  if (grew >= (128 + 32) * 1024) {
    fprintf(stderr, "loading 128 MiB from a pipe grew the peak RSS by %ld kB\n", grew);
    exit(1);
  }
}

/* A write that fails (the file size limit: EFBIG) leaves no half file. */
static void save_fails_midway(const char *path) {
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit r;
  r.rlim_cur = r.rlim_max = 1 << 20;
  CHECK(setrlimit(RLIMIT_FSIZE, &r) == 0);
  uint32_t n = 1u << 20; /* float32: 4 MiB */
  NDArrayHandle a = NULL;
  CHECK_OK(MXNDArrayCreateEx(&n, 1, DEV_CPU, 0, 0, DT_F32, &a));
  CHECK_ERR(MXNDArraySave(path, 1, &a, NULL), "MXNDArraySave: cannot write ");
  CHECK(strstr(MXGetLastError(), "(the partial file was removed)") != NULL);
  CHECK(access(path, F_OK) != 0);
  /* through a symbolic link: the link stays, and the text says the file it
     names is partly written (the link was removed, the file left as it was) */
  char link[80];
  size_t len = strlen(path);
  CHECK(len + sizeof ".link" <= sizeof link);
  memcpy(link, path, len);
  memcpy(link + len, ".link", sizeof ".link");
  CHECK(symlink(path, link) == 0);
  CHECK_ERR(MXNDArraySave(link, 1, &a, NULL), "MXNDArraySave: cannot write ");
  CHECK(strstr(MXGetLastError(), "(the file the symbolic link names is left partly written)") !=
        NULL);
  struct stat st;
  CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
  CHECK(unlink(link) == 0);
  unlink(path);
  CHECK_OK(MXNDArrayFree(a));
}

static void test_save(const char *path) {
  in_child(save_streams, path, "saving 128 MiB");
  if (access("/proc/self/fd", R_OK) == 0) in_child(load_pipe_once, path, "loading from a pipe");
  in_child(save_fails_midway, path, "a save failing midway");
  /* a device is written to, never removed */
  if (access("/dev/full", W_OK) == 0) {
    NDArrayHandle a = make_f32(2, (const float[]){1, 2});
    CHECK_ERR(MXNDArraySave("/dev/full", 1, &a, NULL), "MXNDArraySave: cannot write /dev/full: ");
    CHECK(strstr(MXGetLastError(), "removed") == NULL);
    CHECK(access("/dev/full", F_OK) == 0);
    CHECK_OK(MXNDArrayFree(a));
  }
  /* a bad array: refused before the file is opened (it is left as it was) */
  NDArrayHandle a = make_f32(2, (const float[]){1, 2}), none = NULL;
  CHECK_OK(MXNDArrayCreateNone(&none));
  const char *key = "kept";
  CHECK_OK(MXNDArraySave(path, 1, &a, &key));
  NDArrayHandle two[2] = {a, none};
  CHECK_ERR(MXNDArraySave(path, 2, two, NULL), "Unknown storage type-1");
  uint32_t cnt = 0, nn = 0;
  NDArrayHandle *arr = NULL;
  const char **names = NULL;
  CHECK_OK(MXNDArrayLoad(path, &cnt, &arr, &nn, &names));
  CHECK(cnt == 1 && nn == 1 && strcmp(names[0], "kept") == 0);
  NDArrayHandle hs[3] = {a, none, arr[0]};
  for (int i = 0; i < 3; i++) CHECK_OK(MXNDArrayFree(hs[i]));
}

int main(void) {
  alarm(120); /* nothing here may take long: a hang is a failure */
  atexit(remove_tmp);
  g_start = live_now();
  const char *a = new_tmp();
  test_dense_only_texts();
  test_get_data_of_no_elements();
  test_negative_cpu_dev_id();
  CHECK_LIVE(g_start);
  in_child(huge_claims, a, "loading the sparse files");
  test_save(a);
  CHECK_LIVE(g_start);
  printf("test_params_hardening: all checks passed\n");
  return 0;
}
