/* cu_driver.h -- the CUDA driver entry points the test clients call, declared without CUDA's headers
 * (CUresult an int, contexts opaque pointers, device pointers 64-bit; the signatures of cuda.h): the
 * emulated driver of native/emu/cuda, or a real libcuda.so.1. */
#ifndef SIGMATRACE_TESTS_CU_DRIVER_H
#define SIGMATRACE_TESTS_CU_DRIVER_H
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxCreate_v2(void **, unsigned, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemHostRegister_v2(void *, size_t, unsigned);
CUresult cuMemHostUnregister(void *);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *, void *, unsigned);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuMemGetHandleForAddressRange(void *, CUdeviceptr, size_t, int, unsigned long long);

#endif
