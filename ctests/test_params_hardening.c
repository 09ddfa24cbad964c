/*
 * NDArray C API findings of the session-9 review, checked against MXNet 1.9.1:
 *   - error texts of dense-only functions given sparse arrays read as
 *     sentences ("cannot get the data of a row_sparse array"), never "of of";
 *   - MXNDArrayGetData of an array with no elements gives NULL, and a
 *     negative device id of a cpu or cpu_shared context means device 0, as in
 *     MXNet (which still refuses gpu and cpu_pinned in its CPU build).
 * The whole test runs under alarm(120).
 */
#include "check.h"

#include <ctype.h>
#include <unistd.h>

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

int main(void) {
  alarm(120); /* nothing here may take long: a hang is a failure */
  g_start = live_now();
  test_dense_only_texts();
  test_get_data_of_no_elements();
  test_negative_cpu_dev_id();
  CHECK_LIVE(g_start);
  printf("test_params_hardening: all checks passed\n");
  return 0;
}
