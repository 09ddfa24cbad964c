/*
 * Drop-in for MXNet's <mxnet/c_api.h>: programs written against MXNet's C API
 * compile unchanged with -Iinclude and link with -lmxkv. libmxkv implements the
 * KVStore part of the API and the NDArray functions a binding needs.
 */
#ifndef MXKV_MXNET_C_API_H
#define MXKV_MXNET_C_API_H
#include "../mxkv/c_api.h"
#endif
