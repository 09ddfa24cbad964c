/*
 * NDArray C API findings of the session-9 review, checked against MXNet 1.9.1:
 *   - error texts of dense-only functions given sparse arrays read as
 *     sentences ("cannot get the data of a row_sparse array"), never "of of";
 *   - MXNDArrayGetData of an array with no elements gives NULL, and a
 *     negative device id of a cpu context means cpu(0), as in MXNet.
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

int main(void) {
  alarm(120); /* nothing here may take long: a hang is a failure */
  g_start = live_now();
  test_dense_only_texts();
  CHECK_LIVE(g_start);
  printf("test_params_hardening: all checks passed\n");
  return 0;
}
