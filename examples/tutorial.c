/*
 * The MXNet KVStore tutorial ("KVStore 和可视化"), written against MXNet's C API.
 *
 * It prints exactly what the tutorial's Python code prints with MXNet 1.9.1:
 * each pulled 3x3 float32 matrix in numpy's format, and "update on key: N"
 * from the updater. Link it against libmxnet.so or libmxkv.so:
 *
 *   gcc -std=c11 -Wall -Wextra -Werror -I<include dir> examples/tutorial.c \
 *       -o tutorial -L<lib dir> -lmxkv -Wl,-rpath,<lib dir>
 *
 * where <include dir> holds mxnet/c_api.h (MXNet's own header works too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxnet/c_api.h>

#define ROWS 3
#define COLS 3
#define SIZE (ROWS * COLS)
#define NCTX 4

/* Stop on the first failed call, showing MXNet's message. */
#define CHECK(call)                                                        \
  do {                                                                     \
    if ((call) != 0) {                                                     \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
              MXGetLastError());                                           \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static const uint32_t kShape[2] = {ROWS, COLS};

/* A new float32 3x3 array on cpu(dev_id), every element set to `value`. */
static NDArrayHandle full(int dev_id, float value) {
  NDArrayHandle h = NULL;
  float data[SIZE];
  for (int i = 0; i < SIZE; ++i) data[i] = value;
  CHECK(MXNDArrayCreateEx(kShape, 2, 1 /* cpu */, dev_id, 0, 0 /* float32 */, &h));
  CHECK(MXNDArraySyncCopyFromCPU(h, data, SIZE));
  return h;
}

/* One number the way numpy prints a float32 element: integral values as
   "2." , others with the fewest digits that read back to the same float. */
static void format_number(float v, char *buf, size_t n) {
  if (v > -1e16f && v < 1e16f && (double)v == (double)(long long)v) {
    snprintf(buf, n, "%.0f.", (double)v);
    return;
  }
  for (int prec = 1; prec <= 9; ++prec) {
    snprintf(buf, n, "%.*g", prec, (double)v);
    if (strtof(buf, NULL) == v) return;
  }
}

/* print(a.asnumpy()) for a float32 3x3 array: numpy pads every element to the
   widest integer part and the longest fraction, separated by one space. */
static void print_matrix(NDArrayHandle h) {
  float data[SIZE];
  char text[SIZE][32];
  int int_width = 0, frac_width = 0;
  CHECK(MXNDArraySyncCopyToCPU(h, data, SIZE));
  for (int i = 0; i < SIZE; ++i) {
    format_number(data[i], text[i], sizeof text[i]);
    const char *dot = strchr(text[i], '.');
    int ilen = dot ? (int)(dot - text[i]) : (int)strlen(text[i]);
    int flen = dot ? (int)strlen(dot + 1) : 0;
    if (ilen > int_width) int_width = ilen;
    if (flen > frac_width) frac_width = flen;
  }
  for (int r = 0; r < ROWS; ++r) {
    fputs(r == 0 ? "[[" : " [", stdout);
    for (int c = 0; c < COLS; ++c) {
      const char *s = text[r * COLS + c];
      const char *dot = strchr(s, '.');
      int ilen = dot ? (int)(dot - s) : (int)strlen(s);
      int flen = dot ? (int)strlen(dot + 1) : 0;
      printf("%s%*s%s%*s", c ? " " : "", int_width - ilen, "", s, frac_width - flen, "");
    }
    fputs(r == ROWS - 1 ? "]]\n" : "]\n", stdout);
  }
}

/* The tutorial's updater: stored += input * 2.
   The two handles belong to the callback, which frees them. */
static void update(int key, NDArrayHandle input, NDArrayHandle stored, void *handle) {
  (void)handle;
  float in[SIZE], st[SIZE];
  printf("update on key: %d\n", key);
  CHECK(MXNDArraySyncCopyToCPU(input, in, SIZE));
  CHECK(MXNDArraySyncCopyToCPU(stored, st, SIZE));
  for (int i = 0; i < SIZE; ++i) st[i] += in[i] * 2;
  CHECK(MXNDArraySyncCopyFromCPU(stored, st, SIZE));
  CHECK(MXNDArrayFree(input));
  CHECK(MXNDArrayFree(stored));
}

int main(void) {
  KVStoreHandle kv = NULL;
  CHECK(MXKVStoreCreate("local", &kv));

  /* kv.init(3, mx.nd.ones(shape)*2); a = mx.nd.zeros(shape); kv.pull(3, out=a) */
  int key3 = 3;
  NDArrayHandle twos = full(0, 2);
  CHECK(MXKVStoreInit(kv, 1, &key3, &twos));
  NDArrayHandle a = full(0, 0);
  CHECK(MXKVStorePull(kv, 1, &key3, &a, 0));
  print_matrix(a);

  /* kv.push(3, mx.nd.ones(shape)*8); kv.pull(3, out=a) */
  NDArrayHandle eights = full(0, 8);
  CHECK(MXKVStorePush(kv, 1, &key3, &eights, 0));
  CHECK(MXKVStorePull(kv, 1, &key3, &a, 0));
  print_matrix(a);

  /* b = [mx.nd.ones(shape, ctx) for ctx in contexts]; kv.push(3, b) */
  int keys3[NCTX] = {3, 3, 3, 3};
  NDArrayHandle b[NCTX];
  for (int i = 0; i < NCTX; ++i) b[i] = full(i, 1);
  CHECK(MXKVStorePush(kv, NCTX, keys3, b, 0));
  CHECK(MXKVStorePull(kv, 1, &key3, &a, 0));
  print_matrix(a);

  /* kv._set_updater(update); kv.pull(3, out=a) */
  CHECK(MXKVStoreSetUpdater(kv, update, NULL));
  CHECK(MXKVStorePull(kv, 1, &key3, &a, 0));
  print_matrix(a);

  /* kv.push(3, mx.nd.ones(shape)); kv.pull(3, out=a) */
  NDArrayHandle one = full(0, 1);
  CHECK(MXKVStorePush(kv, 1, &key3, &one, 0));
  CHECK(MXKVStorePull(kv, 1, &key3, &a, 0));
  print_matrix(a);

  /* b = [mx.nd.ones(shape, ctx) for ctx in contexts]; kv.pull(3, out=b) */
  NDArrayHandle pulled[NCTX];
  for (int i = 0; i < NCTX; ++i) pulled[i] = full(i, 1);
  CHECK(MXKVStorePull(kv, NCTX, keys3, pulled, 0));
  print_matrix(pulled[1]);

  /* keys = [5, 7, 9]; init ones, push ones, pull into one shared zeros array */
  int keys[3] = {5, 7, 9};
  NDArrayHandle ones = full(0, 1);
  NDArrayHandle same_ones[3] = {ones, ones, ones};
  CHECK(MXKVStoreInit(kv, 3, keys, same_ones));
  NDArrayHandle ones2 = full(0, 1);
  NDArrayHandle same_ones2[3] = {ones2, ones2, ones2};
  CHECK(MXKVStorePush(kv, 3, keys, same_ones2, 0));
  NDArrayHandle zeros = full(0, 0);
  NDArrayHandle same_zeros[3] = {zeros, zeros, zeros};
  CHECK(MXKVStorePull(kv, 3, keys, same_zeros, 0));
  print_matrix(same_zeros[1]);

  /* b = [[mx.nd.ones(shape, ctx) for ctx in contexts]] * len(keys):
     the same four arrays for every key; push, then pull into them. */
  NDArrayHandle per_ctx[NCTX];
  for (int i = 0; i < NCTX; ++i) per_ctx[i] = full(i, 1);
  int flat_keys[3 * NCTX];
  NDArrayHandle flat_vals[3 * NCTX];
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < NCTX; ++i) {
      flat_keys[k * NCTX + i] = keys[k];
      flat_vals[k * NCTX + i] = per_ctx[i];
    }
  }
  CHECK(MXKVStorePush(kv, 3 * NCTX, flat_keys, flat_vals, 0));
  CHECK(MXKVStorePull(kv, 3 * NCTX, flat_keys, flat_vals, 0));
  print_matrix(flat_vals[1 * NCTX + 1]); /* b[1][1] */

  CHECK(MXNDArrayWaitAll());
  NDArrayHandle all[] = {twos, a, eights, one, ones, ones2, zeros};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) CHECK(MXNDArrayFree(all[i]));
  for (int i = 0; i < NCTX; ++i) {
    CHECK(MXNDArrayFree(b[i]));
    CHECK(MXNDArrayFree(pulled[i]));
    CHECK(MXNDArrayFree(per_ctx[i]));
  }
  CHECK(MXKVStoreFree(kv));
  return 0;
}
