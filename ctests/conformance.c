/*
 * Header conformance check: libmxkv's generated header must declare the same
 * C API as MXNet 1.9.1's own <mxnet/c_api.h>.
 *
 * Both headers are included into one translation unit, so every function they
 * both declare must have a compatible type (otherwise: "conflicting types").
 * Then the address of every KVStore/NDArray entry point a binding needs
 * (the KVStore functions of MXNet 1.9.1's include/mxnet/c_api.h and the NDArray
 * functions a binding needs, as README.md lists them) goes into a table of pointers spelled out by hand from the 1.9.1
 * header, so any drift in either header fails under -Werror.
 *
 * Compile check only:
 *   gcc -std=c11 -Wall -Wextra -Werror \
 *       -I<site-packages>/mxnet/include -Iinclude -c ctests/conformance.c -o /dev/null
 * With -DMXKV_HEADER_ONLY only our header is included (is it self-sufficient?).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef MXKV_HEADER_ONLY
#include <mxnet/c_api.h>
#ifndef MXNET_C_API_H_
#error "<mxnet/c_api.h> is not MXNet's header"
#endif
#endif

#include <mxkv/c_api.h>
#ifndef MXKV_C_API_H
#error "<mxkv/c_api.h> does not use the include guard MXKV_C_API_H"
#endif

/* The scalar and handle typedefs. */
_Static_assert(sizeof(mx_uint) == 4, "mx_uint is uint32_t");
_Static_assert((mx_uint)-1 > 0, "mx_uint is unsigned");
_Static_assert(sizeof(NDArrayHandle) == sizeof(void *), "NDArrayHandle is void*");
_Static_assert(sizeof(KVStoreHandle) == sizeof(void *), "KVStoreHandle is void*");
static mx_uint *const kMxUintIsUint32 = (uint32_t *)0;
static NDArrayHandle *const kNDArrayHandleIsVoidPtr = (void **)0;
static KVStoreHandle *const kKVStoreHandleIsVoidPtr = (void **)0;

/* The callback typedefs are function types (not pointer types), exactly as in
   MXNet: a function can be declared with them. */
static MXKVStoreUpdater conformance_updater;
static MXKVStoreStrUpdater conformance_str_updater;
static MXKVStoreServerController conformance_controller;

static void conformance_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *handle) {
  (void)key, (void)recv, (void)local, (void)handle;
}
static void conformance_str_updater(const char *key, NDArrayHandle recv, NDArrayHandle local,
                                    void *handle) {
  (void)key, (void)recv, (void)local, (void)handle;
}
static void conformance_controller(int head, const char *body, void *controller_handle) {
  (void)head, (void)body, (void)controller_handle;
}

/* One correctly typed pointer per entry point, written out from the 1.9.1 header. */
struct conformance_table {
  /* errors and version */
  const char *(*MXGetLastError)(void);
  int (*MXGetVersion)(int *out);
  int (*MXNotifyShutdown)(void);

  /* KVStore: create, type, free */
  int (*MXKVStoreCreate)(const char *type, KVStoreHandle *out);
  int (*MXKVStoreGetType)(KVStoreHandle handle, const char **type);
  int (*MXKVStoreFree)(KVStoreHandle handle);

  /* KVStore: init, push, pull */
  int (*MXKVStoreInit)(KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals);
  int (*MXKVStoreInitEx)(KVStoreHandle handle, uint32_t num, const char **keys,
                         NDArrayHandle *vals);
  int (*MXKVStorePush)(KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals,
                       int priority);
  int (*MXKVStorePushEx)(KVStoreHandle handle, uint32_t num, const char **keys,
                         NDArrayHandle *vals, int priority);
  int (*MXKVStorePull)(KVStoreHandle handle, uint32_t num, const int *keys, NDArrayHandle *vals,
                       int priority);
  int (*MXKVStorePullEx)(KVStoreHandle handle, uint32_t num, const char **keys,
                         NDArrayHandle *vals, int priority);
  int (*MXKVStorePullWithSparse)(KVStoreHandle handle, uint32_t num, const int *keys,
                                 NDArrayHandle *vals, int priority, bool ignore_sparse);
  int (*MXKVStorePullWithSparseEx)(KVStoreHandle handle, uint32_t num, const char **keys,
                                   NDArrayHandle *vals, int priority, bool ignore_sparse);
  int (*MXKVStorePullRowSparse)(KVStoreHandle handle, uint32_t num, const int *keys,
                                NDArrayHandle *vals, const NDArrayHandle *row_ids, int priority);
  int (*MXKVStorePullRowSparseEx)(KVStoreHandle handle, uint32_t num, const char **keys,
                                  NDArrayHandle *vals, const NDArrayHandle *row_ids,
                                  int priority);

  /* KVStore: pushpull, broadcast */
  int (*MXKVStorePushPull)(KVStoreHandle handle, mx_uint vnum, const int *vkeys, mx_uint onum,
                           const int *okeys, NDArrayHandle *vals, NDArrayHandle *outs,
                           int priority);
  int (*MXKVStorePushPullEx)(KVStoreHandle handle, mx_uint vnum, const char **vkeys,
                             mx_uint onum, const char **okeys, NDArrayHandle *vals,
                             NDArrayHandle *outs, int priority);
  int (*MXKVStoreBroadcast)(KVStoreHandle handle, mx_uint vnum, const int *vkeys, mx_uint onum,
                            const int *okeys, NDArrayHandle *vals, NDArrayHandle *outs,
                            int priority);
  int (*MXKVStoreBroadcastEx)(KVStoreHandle handle, mx_uint vnum, const char **vkeys,
                              mx_uint onum, const char **okeys, NDArrayHandle *vals,
                              NDArrayHandle *outs, int priority);

  /* KVStore: updaters, gradient compression */
  int (*MXKVStoreSetUpdater)(KVStoreHandle handle, MXKVStoreUpdater updater,
                             void *updater_handle);
  int (*MXKVStoreSetUpdaterEx)(KVStoreHandle handle, MXKVStoreUpdater updater,
                               MXKVStoreStrUpdater str_updater, void *updater_handle);
  int (*MXKVStoreSetGradientCompression)(KVStoreHandle handle, uint32_t num_params,
                                         const char **keys, const char **vals);

  /* KVStore: multi-machine entry points */
  int (*MXInitPSEnv)(uint32_t num_vars, const char **keys, const char **vals);
  int (*MXKVStoreGetRank)(KVStoreHandle handle, int *ret);
  int (*MXKVStoreGetGroupSize)(KVStoreHandle handle, int *ret);
  int (*MXKVStoreIsWorkerNode)(int *ret);
  int (*MXKVStoreIsServerNode)(int *ret);
  int (*MXKVStoreIsSchedulerNode)(int *ret);
  int (*MXKVStoreBarrier)(KVStoreHandle handle);
  int (*MXKVStoreSetBarrierBeforeExit)(KVStoreHandle handle, const int barrier_before_exit);
  int (*MXKVStoreRunServer)(KVStoreHandle handle, MXKVStoreServerController controller,
                            void *controller_handle);
  int (*MXKVStoreSendCommmandToServers)(KVStoreHandle handle, int cmd_id, const char *cmd_body);
  int (*MXKVStoreGetNumDeadNode)(KVStoreHandle handle, const int node_id, int *number,
                                 const int timeout_sec);

  /* NDArray: create */
  int (*MXNDArrayCreateNone)(NDArrayHandle *out);
  int (*MXNDArrayCreate)(const uint32_t *shape, uint32_t ndim, int dev_type, int dev_id,
                         int delay_alloc, NDArrayHandle *out);
  int (*MXNDArrayCreateEx)(const uint32_t *shape, uint32_t ndim, int dev_type, int dev_id,
                           int delay_alloc, int dtype, NDArrayHandle *out);
  int (*MXNDArrayCreateEx64)(const int64_t *shape, int ndim, int dev_type, int dev_id,
                             int delay_alloc, int dtype, NDArrayHandle *out);
  int (*MXNDArrayCreateSparseEx)(int storage_type, const uint32_t *shape, uint32_t ndim,
                                 int dev_type, int dev_id, int delay_alloc, int dtype,
                                 uint32_t num_aux, int *aux_type, uint32_t *aux_ndims,
                                 const uint32_t *aux_shape, NDArrayHandle *out);

  /* NDArray: copies */
  int (*MXNDArraySyncCopyFromCPU)(NDArrayHandle handle, const void *data, size_t size);
  int (*MXNDArraySyncCopyToCPU)(NDArrayHandle handle, void *data, size_t size);
  int (*MXNDArraySyncCopyFromNDArray)(NDArrayHandle handle_dst, const NDArrayHandle handle_src,
                                      const int i);

  /* NDArray: properties */
  int (*MXNDArrayGetShape)(NDArrayHandle handle, uint32_t *out_dim, const uint32_t **out_pdata);
  int (*MXNDArrayGetShapeEx)(NDArrayHandle handle, int *out_dim, const int **out_pdata);
  int (*MXNDArrayGetShapeEx64)(NDArrayHandle handle, int *out_dim, const int64_t **out_pdata);
  int (*MXNDArrayGetDType)(NDArrayHandle handle, int *out_dtype);
  int (*MXNDArrayGetContext)(NDArrayHandle handle, int *out_dev_type, int *out_dev_id);
  int (*MXNDArrayGetStorageType)(NDArrayHandle handle, int *out_storage_type);
  int (*MXNDArrayGetData)(NDArrayHandle handle, void **out_pdata);
  int (*MXNDArrayGetAuxType)(NDArrayHandle handle, uint32_t i, int *out_type);
  int (*MXNDArrayGetAuxNDArray)(NDArrayHandle handle, uint32_t i, NDArrayHandle *out);
  int (*MXNDArrayGetDataNDArray)(NDArrayHandle handle, NDArrayHandle *out);

  /* NDArray: waits */
  int (*MXNDArrayWaitToRead)(NDArrayHandle handle);
  int (*MXNDArrayWaitToWrite)(NDArrayHandle handle);
  int (*MXNDArrayWaitAll)(void);

  /* NDArray: files, free */
  int (*MXNDArraySave)(const char *fname, uint32_t num_args, NDArrayHandle *args,
                       const char **keys);
  int (*MXNDArrayLoad)(const char *fname, uint32_t *out_size, NDArrayHandle **out_arr,
                       uint32_t *out_name_size, const char ***out_names);
  int (*MXNDArrayLoadFromBuffer)(const void *ndarray_buffer, size_t size, uint32_t *out_size,
                                 NDArrayHandle **out_arr, uint32_t *out_name_size,
                                 const char ***out_names);
  int (*MXNDArrayFree)(NDArrayHandle handle);

  /* the callback typedefs, as pointers */
  MXKVStoreUpdater *updater;
  MXKVStoreStrUpdater *str_updater;
  MXKVStoreServerController *controller;

  /* the handle typedefs */
  mx_uint *const *mx_uint_is_uint32;
  NDArrayHandle *const *ndarray_handle_is_void_ptr;
  KVStoreHandle *const *kvstore_handle_is_void_ptr;
};

static const struct conformance_table kTable = {
    .MXGetLastError = &MXGetLastError,
    .MXGetVersion = &MXGetVersion,
    .MXNotifyShutdown = &MXNotifyShutdown,

    .MXKVStoreCreate = &MXKVStoreCreate,
    .MXKVStoreGetType = &MXKVStoreGetType,
    .MXKVStoreFree = &MXKVStoreFree,

    .MXKVStoreInit = &MXKVStoreInit,
    .MXKVStoreInitEx = &MXKVStoreInitEx,
    .MXKVStorePush = &MXKVStorePush,
    .MXKVStorePushEx = &MXKVStorePushEx,
    .MXKVStorePull = &MXKVStorePull,
    .MXKVStorePullEx = &MXKVStorePullEx,
    .MXKVStorePullWithSparse = &MXKVStorePullWithSparse,
    .MXKVStorePullWithSparseEx = &MXKVStorePullWithSparseEx,
    .MXKVStorePullRowSparse = &MXKVStorePullRowSparse,
    .MXKVStorePullRowSparseEx = &MXKVStorePullRowSparseEx,

    .MXKVStorePushPull = &MXKVStorePushPull,
    .MXKVStorePushPullEx = &MXKVStorePushPullEx,
    .MXKVStoreBroadcast = &MXKVStoreBroadcast,
    .MXKVStoreBroadcastEx = &MXKVStoreBroadcastEx,

    .MXKVStoreSetUpdater = &MXKVStoreSetUpdater,
    .MXKVStoreSetUpdaterEx = &MXKVStoreSetUpdaterEx,
    .MXKVStoreSetGradientCompression = &MXKVStoreSetGradientCompression,

    .MXInitPSEnv = &MXInitPSEnv,
    .MXKVStoreGetRank = &MXKVStoreGetRank,
    .MXKVStoreGetGroupSize = &MXKVStoreGetGroupSize,
    .MXKVStoreIsWorkerNode = &MXKVStoreIsWorkerNode,
    .MXKVStoreIsServerNode = &MXKVStoreIsServerNode,
    .MXKVStoreIsSchedulerNode = &MXKVStoreIsSchedulerNode,
    .MXKVStoreBarrier = &MXKVStoreBarrier,
    .MXKVStoreSetBarrierBeforeExit = &MXKVStoreSetBarrierBeforeExit,
    .MXKVStoreRunServer = &MXKVStoreRunServer,
    .MXKVStoreSendCommmandToServers = &MXKVStoreSendCommmandToServers,
    .MXKVStoreGetNumDeadNode = &MXKVStoreGetNumDeadNode,

    .MXNDArrayCreateNone = &MXNDArrayCreateNone,
    .MXNDArrayCreate = &MXNDArrayCreate,
    .MXNDArrayCreateEx = &MXNDArrayCreateEx,
    .MXNDArrayCreateEx64 = &MXNDArrayCreateEx64,
    .MXNDArrayCreateSparseEx = &MXNDArrayCreateSparseEx,

    .MXNDArraySyncCopyFromCPU = &MXNDArraySyncCopyFromCPU,
    .MXNDArraySyncCopyToCPU = &MXNDArraySyncCopyToCPU,
    .MXNDArraySyncCopyFromNDArray = &MXNDArraySyncCopyFromNDArray,

    .MXNDArrayGetShape = &MXNDArrayGetShape,
    .MXNDArrayGetShapeEx = &MXNDArrayGetShapeEx,
    .MXNDArrayGetShapeEx64 = &MXNDArrayGetShapeEx64,
    .MXNDArrayGetDType = &MXNDArrayGetDType,
    .MXNDArrayGetContext = &MXNDArrayGetContext,
    .MXNDArrayGetStorageType = &MXNDArrayGetStorageType,
    .MXNDArrayGetData = &MXNDArrayGetData,
    .MXNDArrayGetAuxType = &MXNDArrayGetAuxType,
    .MXNDArrayGetAuxNDArray = &MXNDArrayGetAuxNDArray,
    .MXNDArrayGetDataNDArray = &MXNDArrayGetDataNDArray,

    .MXNDArrayWaitToRead = &MXNDArrayWaitToRead,
    .MXNDArrayWaitToWrite = &MXNDArrayWaitToWrite,
    .MXNDArrayWaitAll = &MXNDArrayWaitAll,

    .MXNDArraySave = &MXNDArraySave,
    .MXNDArrayLoad = &MXNDArrayLoad,
    .MXNDArrayLoadFromBuffer = &MXNDArrayLoadFromBuffer,
    .MXNDArrayFree = &MXNDArrayFree,

    .updater = conformance_updater,
    .str_updater = conformance_str_updater,
    .controller = conformance_controller,

    .mx_uint_is_uint32 = &kMxUintIsUint32,
    .ndarray_handle_is_void_ptr = &kNDArrayHandleIsVoidPtr,
    .kvstore_handle_is_void_ptr = &kKVStoreHandleIsVoidPtr,
};

/* Exported so the table (and with it every address above) counts as used. */
const void *mxkv_conformance_table(void);
const void *mxkv_conformance_table(void) { return &kTable; }
