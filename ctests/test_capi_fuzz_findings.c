/*
 * Regressions for what ctests/test_capi_fuzz.c found, one function each,
 * minimised from the fuzzer's seed and operation list (MXKV_FUZZ_KEEP).
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"

/* MXNDArrayCreateSparseEx(Ex64) with storage type 0 (default): MXNet 1.9.1's
   sparse NDArray constructor with kDefaultStorage makes a dense array of the
   shape, dtype and context (the aux arguments are read and otherwise
   unused); libmxkv refused it ("storage type 0 is not sparse"). Found by the
   fuzzer's differential check of its "must fail" list against MXNet. */
static void test_create_sparse_ex_default_storage(void) {
  live_t start = live_now();
  const uint32_t shape[2] = {3, 2}, aux_shape[1] = {0};
  uint32_t aux_ndims[1] = {1};
  int aux_type[1] = {DT_I64};
  NDArrayHandle h = NULL;
  CHECK_OK(MXNDArrayCreateSparseEx(0, shape, 2, DEV_CPU_PINNED, 1, 0, DT_F64, 1, aux_type, aux_ndims,
                                   aux_shape, &h));
  int st = -9, dt = -9, devt = -9, devid = -9;
  uint32_t nd = 0;
  const uint32_t *sh = NULL;
  CHECK_OK(MXNDArrayGetStorageType(h, &st));
  CHECK_OK(MXNDArrayGetDType(h, &dt));
  CHECK_OK(MXNDArrayGetContext(h, &devt, &devid));
  CHECK_OK(MXNDArrayGetShape(h, &nd, &sh));
  CHECK(st == 0 && dt == DT_F64 && devt == DEV_CPU_PINNED && devid == 1);
  CHECK(nd == 2 && sh[0] == 3 && sh[1] == 2);
  const double in[6] = {1, 2, 3, 4, 5, -6};
  double out[6] = {0};
  CHECK_OK(MXNDArraySyncCopyFromCPU(h, in, 6));
  CHECK_OK(MXNDArraySyncCopyToCPU(h, out, 6));
  CHECK(memcmp(in, out, sizeof in) == 0);
  /* usable as a store value */
  KVStoreHandle kv = NULL;
  CHECK_OK(MXKVStoreCreate("local", &kv));
  int key = 3;
  CHECK_OK(MXKVStoreInit(kv, 1, &key, &h));
  CHECK_OK(MXKVStoreFree(kv));
  CHECK_OK(MXNDArrayFree(h));

  /* the 64-bit form, with no aux arguments at all */
  const int64_t shape64[1] = {4};
  CHECK_OK(MXNDArrayCreateSparseEx64(0, shape64, 1, DEV_CPU, 0, 0, DT_I32, 0, NULL, NULL, NULL, &h));
  CHECK_OK(MXNDArrayGetStorageType(h, &st));
  CHECK_OK(MXNDArrayGetDType(h, &dt));
  CHECK(st == 0 && dt == DT_I32);
  CHECK_OK(MXNDArrayFree(h));

  /* what stays refused: other storage types, gpu, a NULL output */
  CHECK_ERR(MXNDArrayCreateSparseEx(3, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h),
            "MXNDArrayCreateSparseEx: ");
  CHECK_ERR(MXNDArrayCreateSparseEx(-1, shape, 2, DEV_CPU, 0, 0, DT_F32, 1, aux_type, aux_ndims, aux_shape, &h),
            "MXNDArrayCreateSparseEx: ");
  CHECK_ERR(MXNDArrayCreateSparseEx(0, shape, 2, DEV_GPU, 0, 0, DT_F32, 0, NULL, NULL, NULL, &h),
            "MXNDArrayCreateSparseEx: ");
  CHECK_ERR(MXNDArrayCreateSparseEx(0, shape, 2, DEV_CPU, 0, 0, DT_F32, 0, NULL, NULL, NULL, NULL),
            "MXNDArrayCreateSparseEx: out (output pointer) is NULL");
  CHECK_LIVE(start);
}

int main(void) {
  test_create_sparse_ex_default_storage();
  printf("test_capi_fuzz_findings: ok\n");
  return 0;
}
