/* A libcuda.so.1 that answers every call lockstep makes with success and computes nothing: one
   "device" of compute capability 9.0 whose kernels do nothing and whose copies move no bytes.
   The test cli_cuda_device_that_computes_nothing runs lockstep against it: the device must be
   refused by its known-answer check, never believed. STUB_CUDA_DEVICES sets the device count it
   reports and STUB_CUDA_CAPABILITY the compute capability (major * 10 + minor); with
   STUB_CUDA_SET_FTZ=1 it sets FTZ and DAZ as it loads. Test-only; never installed. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef unsigned long long CUdeviceptr;

static char handle;
static CUdeviceptr next_address = 0x10000;

CUresult cuInit(unsigned flags) {
  (void)flags;
  return 0;
}
CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return 0;
}
CUresult cuGetErrorName(CUresult r, const char** name) {
  (void)r;
  *name = "CUDA_SUCCESS";
  return 0;
}
static int Setting(const char* name, int otherwise) {
  const char* text = getenv(name);
  return text != NULL ? atoi(text) : otherwise;
}

CUresult cuDeviceGetCount(int* n) {
  *n = Setting("STUB_CUDA_DEVICES", 1);
  return 0;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  *d = ordinal;
  return 0;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  (void)d;
  strncpy(name, "stub device that computes nothing", (size_t)len);
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  (void)d;
  *bytes = (size_t)1 << 34;
  return 0;
}
CUresult cuDeviceGetAttribute(int* v, int which, CUdevice d) {
  (void)d;
  switch (which) {
    case 1:
      *v = 1024;
      break; /* max threads per block */
    case 8:
      *v = 49152;
      break; /* shared memory per block */
    case 75:
      *v = Setting("STUB_CUDA_CAPABILITY", 90) / 10;
      break; /* compute capability */
    case 76:
      *v = Setting("STUB_CUDA_CAPABILITY", 90) % 10;
      break;
    default:
      *v = 1;
  }
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  (void)d;
  *c = &handle;
  return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  (void)d;
  return 0;
}
CUresult cuCtxSetCurrent(CUcontext c) {
  (void)c;
  return 0;
}
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned n, int* options,
                            void** values) {
  (void)image;
  (void)n;
  (void)options;
  (void)values;
  *m = &handle;
  return 0;
}
CUresult cuModuleUnload(CUmodule m) {
  (void)m;
  return 0;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  (void)m;
  (void)name;
  *f = &handle;
  return 0;
}
CUresult cuFuncGetAttribute(int* v, int which, CUfunction f) {
  (void)which;
  (void)f;
  *v = 1024;
  return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  *p = next_address;
  next_address += (bytes + 255) / 256 * 256 + 256;
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  (void)p;
  return 0;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr to, const void* from, size_t n) {
  (void)to;
  (void)from;
  (void)n;
  return 0;
}
CUresult cuMemcpyDtoH_v2(void* to, CUdeviceptr from, size_t n) {
  (void)to;
  (void)from;
  (void)n;
  return 0;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr to, CUdeviceptr from, size_t n) {
  (void)to;
  (void)from;
  (void)n;
  return 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
  (void)p;
  (void)v;
  (void)n;
  return 0;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void* stream, void** params,
                        void** extra) {
  (void)f;
  (void)gx;
  (void)gy;
  (void)gz;
  (void)bx;
  (void)by;
  (void)bz;
  (void)shared;
  (void)stream;
  (void)params;
  (void)extra;
  return 0;
}

/* STUB_CUDA_SET_FTZ=1: the library sets FTZ and DAZ on the loading thread, as a -ffast-math
   object's constructor does: lockstep must refuse the driver naming it. */
__attribute__((constructor)) static void SetFtzWhenAsked(void) {
  const char* text = getenv("STUB_CUDA_SET_FTZ");
#if defined(__x86_64__)
  if (text != NULL && text[0] == '1') _mm_setcsr(_mm_getcsr() | (1u << 15) | (1u << 6));
#else
  (void)text;
#endif
}
