/*
 * The CUDA driver API pieces the tracer uses, declared here so that it builds without the CUDA
 * toolkit's headers (issue 17, F27).  Sizes and values are those of the CUDA driver API's public
 * header <cuda.h> as of CUDA 13.0 (the ones below date from CUDA 4 or earlier); nothing here is
 * NVIDIA's code.  The names carry an st_ / ST_ prefix (the tracer defines the driver's own names
 * as its wrappers, providers/cuda/cuda.c); without it they are cuda.h's.
 * tests/test_abi_conformance.py checks sizes and values against cuda.h wherever it is installed.
 *
 * Types the driver declares as enums or opaque pointers are declared by size: CUresult is an enum
 * of non-negative values (returned in a 32-bit register), CUdeviceptr a 64-bit integer on 64-bit
 * hosts, the handles pointers.
 */
#ifndef ST_ABI_CUDA_H
#define ST_ABI_CUDA_H

/* the public header this file follows (build_info.json) */
#define ST_ABI_CUDA_FROM "CUDA 13.0 driver API cuda.h"

#include <stdint.h>

typedef unsigned int st_CUresult; /* enum cudaError_enum: no negative values */
typedef uint64_t st_CUdeviceptr;
typedef void *st_CUcontext;
typedef void *st_CUstream;
typedef void *st_CUevent;

#define ST_CUDA_SUCCESS 0
#define ST_CUDA_ERROR_NOT_READY 600
#define ST_CU_MEMHOSTREGISTER_PORTABLE 0x01u
#define ST_CU_MEMHOSTREGISTER_DEVICEMAP 0x02u
#define ST_CU_MEMHOSTREGISTER_IOMEMORY 0x04u
#define ST_CU_STREAM_NON_BLOCKING 0x1u
#define ST_CU_EVENT_DISABLE_TIMING 0x2u
#define ST_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define ST_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define ST_CU_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define ST_CU_POINTER_ATTRIBUTE_HOST_POINTER 4
#define ST_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define ST_CU_MEMORYTYPE_DEVICE 2
#define ST_CUDA_ERROR_NOT_INITIALIZED 3

#endif /* ST_ABI_CUDA_H */
