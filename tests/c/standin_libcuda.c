/* A stand-in libcuda for the interposer tests (tests/governed.rs): every entry point the
 * interposer wraps, plus one it does not (cuDeviceGetCount), with libcuda's names and C ABI.
 * Allocations hand out fake, distinct device addresses and never run out; launches and
 * synchronizations do nothing. Every call is counted (standin_calls), and standin_address
 * gives the stand-in's own function for a name, to tell it from the interposer's wrapper.
 * cuGetProcAddress answers like the real driver: the versioned function for a base name
 * ("cuMemAlloc" -> cuMemAlloc_v2), the _ptsz variant under per-thread default streams; for
 * cuLaunchKernel at version 13050 and later, an internal function no exported name gives. */
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *Ptr;

#define NAMES(X)                                                                              \
    X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuMemAlloc_v2) X(cuMemAllocPitch_v2) \
    X(cuMemFree_v2) X(cuMemAllocManaged) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)           \
    X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFreeAsync)              \
    X(cuMemFreeAsync_ptsz) X(cuMemCreate) X(cuMemRelease) X(cuLaunchKernel)                   \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz)                       \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch)           \
    X(cuGraphLaunch_ptsz) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4)               \
    X(cuDevicePrimaryCtxRetain) X(cuCtxSynchronize) X(cuCtxSynchronize_v2) X(cuStreamSynchronize) \
    X(cuStreamSynchronize_ptsz) X(cuEventSynchronize) X(cuDeviceGetCount)

enum {
#define X(n) I_##n,
    NAMES(X)
#undef X
    COUNT
};
static const char *names[] = {
#define X(n) #n,
    NAMES(X)
#undef X
};
static unsigned long calls[COUNT];
static CUdeviceptr next_address = 0x7f0000000000ULL;

static CUdeviceptr fresh(size_t bytes) {
    CUdeviceptr p = __atomic_fetch_add(&next_address, (bytes + 0xfffff) & ~0xfffffULL, __ATOMIC_RELAXED);
    return p;
}

#define COUNTED(n) __atomic_fetch_add(&calls[I_##n], 1, __ATOMIC_RELAXED)

CUresult cuInit(unsigned flags) { (void)flags; COUNTED(cuInit); return 0; }
CUresult cuDeviceGetCount(int *n) { COUNTED(cuDeviceGetCount); *n = 1; return 0; }

CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t b) { COUNTED(cuMemAlloc_v2); if (!b) return 1; *d = fresh(b); return 0; }
CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e; COUNTED(cuMemAllocPitch_v2); *pitch = (w + 511) & ~(size_t)511; *d = fresh(*pitch * h); return 0;
}
CUresult cuMemFree_v2(CUdeviceptr d) { (void)d; COUNTED(cuMemFree_v2); return 0; }
CUresult cuMemAllocManaged(CUdeviceptr *d, size_t b, unsigned f) { (void)f; COUNTED(cuMemAllocManaged); *d = fresh(b); return 0; }
#define ALLOC_ASYNC(n) CUresult n(CUdeviceptr *d, size_t b, Ptr s) { (void)s; COUNTED(n); *d = fresh(b); return 0; }
ALLOC_ASYNC(cuMemAllocAsync)
ALLOC_ASYNC(cuMemAllocAsync_ptsz)
#define ALLOC_POOL(n) CUresult n(CUdeviceptr *d, size_t b, Ptr p, Ptr s) { (void)p; (void)s; COUNTED(n); *d = fresh(b); return 0; }
ALLOC_POOL(cuMemAllocFromPoolAsync)
ALLOC_POOL(cuMemAllocFromPoolAsync_ptsz)
#define FREE_ASYNC(n) CUresult n(CUdeviceptr d, Ptr s) { (void)d; (void)s; COUNTED(n); return 0; }
FREE_ASYNC(cuMemFreeAsync)
FREE_ASYNC(cuMemFreeAsync_ptsz)
static unsigned long long next_handle = 1;
CUresult cuMemCreate(unsigned long long *h, size_t b, const void *prop, unsigned long long f) {
    (void)b; (void)prop; (void)f; COUNTED(cuMemCreate); *h = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED); return 0;
}
CUresult cuMemRelease(unsigned long long h) { (void)h; COUNTED(cuMemRelease); return 0; }

#define LAUNCH(n) CUresult n(Ptr f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
    unsigned bz, unsigned sh, Ptr s, void **p, void **e) { (void)f; (void)gx; (void)gy; (void)gz; (void)bx; \
    (void)by; (void)bz; (void)sh; (void)s; (void)p; (void)e; COUNTED(n); return 0; }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)
#define COOP(n) CUresult n(Ptr f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
    unsigned bz, unsigned sh, Ptr s, void **p) { (void)f; (void)gx; (void)gy; (void)gz; (void)bx; \
    (void)by; (void)bz; (void)sh; (void)s; (void)p; COUNTED(n); return 0; }
COOP(cuLaunchCooperativeKernel)
COOP(cuLaunchCooperativeKernel_ptsz)
#define LAUNCH_EX(n) CUresult n(const void *c, Ptr f, void **p, void **e) { (void)c; (void)f; (void)p; (void)e; COUNTED(n); return 0; }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)
#define ONE_ARG(n) CUresult n(Ptr a) { (void)a; COUNTED(n); return 0; }
#define TWO_ARGS(n) CUresult n(Ptr a, Ptr b) { (void)a; (void)b; COUNTED(n); return 0; }
TWO_ARGS(cuGraphLaunch)
TWO_ARGS(cuGraphLaunch_ptsz)
ONE_ARG(cuStreamSynchronize)
ONE_ARG(cuStreamSynchronize_ptsz)
ONE_ARG(cuEventSynchronize)
ONE_ARG(cuCtxSynchronize_v2)
CUresult cuCtxSynchronize(void) { COUNTED(cuCtxSynchronize); return 0; }
static int ctx_dummy;
CUresult cuCtxCreate_v2(Ptr *c, unsigned f, int d) { (void)f; (void)d; COUNTED(cuCtxCreate_v2); *c = &ctx_dummy; return 0; }
CUresult cuCtxCreate_v3(Ptr *c, Ptr p, int n, unsigned f, int d) { (void)p; (void)n; (void)f; (void)d; COUNTED(cuCtxCreate_v3); *c = &ctx_dummy; return 0; }
CUresult cuCtxCreate_v4(Ptr *c, Ptr p, unsigned f, int d) { (void)p; (void)f; (void)d; COUNTED(cuCtxCreate_v4); *c = &ctx_dummy; return 0; }
CUresult cuDevicePrimaryCtxRetain(Ptr *c, int d) { (void)d; COUNTED(cuDevicePrimaryCtxRetain); *c = &ctx_dummy; return 0; }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);

CUresult standin_internal_cuLaunchKernel(Ptr f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                         unsigned bz, unsigned sh, Ptr s, void **p, void **e);

static void *functions[COUNT];
static void fill(void) {
    if (functions[0]) return;
#define X(n) functions[I_##n] = (void *)&n;
    NAMES(X)
#undef X
}

/* The stand-in's own function of this exact name (not the interposer's). */
void *standin_address(const char *name) {
    fill();
    for (int i = 0; i < COUNT; i++) if (!strcmp(names[i], name)) return functions[i];
    if (!strcmp(name, "standin_internal_cuLaunchKernel")) return (void *)&standin_internal_cuLaunchKernel;
    return NULL;
}

/* Calls of the stand-in's function of this exact name. */
unsigned long standin_calls(const char *name) {
    for (int i = 0; i < COUNT; i++) if (!strcmp(names[i], name)) return __atomic_load_n(&calls[i], __ATOMIC_RELAXED);
    return 0;
}

/* What a driver might hand the runtime for a newer CUDA version than it exports a name for:
 * an entry point of its own that no exported name gives (cuGetProcAddress of cuLaunchKernel
 * at version 13050 or later answers with this), which the interposer cannot wrap. */
CUresult standin_internal_cuLaunchKernel(Ptr f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                         unsigned bz, unsigned sh, Ptr s, void **p, void **e) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}

/* Which function a lookup of `base` gets, as the real driver answers. */
static const char *resolve(const char *base, int version, unsigned long long flags) {
    static char buf[128];
    int ptsz = (flags & 2) != 0;
    if (!strcmp(base, "cuLaunchKernel") && version >= 13050) return "standin_internal_cuLaunchKernel";
    if (!strcmp(base, "cuMemAlloc") || !strcmp(base, "cuMemFree") || !strcmp(base, "cuMemAllocPitch")) {
        snprintf(buf, sizeof buf, "%s_v2", base);
        return buf;
    }
    if (!strcmp(base, "cuGetProcAddress")) return version >= 12000 ? "cuGetProcAddress_v2" : "cuGetProcAddress";
    if (!strcmp(base, "cuCtxCreate")) return version >= 12050 ? "cuCtxCreate_v4" : version >= 11040 ? "cuCtxCreate_v3" : "cuCtxCreate_v2";
    const char *per_thread[] = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
                                "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuStreamSynchronize"};
    if (ptsz)
        for (unsigned i = 0; i < sizeof per_thread / sizeof *per_thread; i++)
            if (!strcmp(base, per_thread[i])) { snprintf(buf, sizeof buf, "%s_ptsz", base); return buf; }
    return base;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    COUNTED(cuGetProcAddress_v2);
    void *f = standin_address(resolve(symbol, version, flags));
    *pfn = f;
    if (status) *status = f ? 0 : 1;
    return f ? 0 : 500;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    COUNTED(cuGetProcAddress);
    void *f = standin_address(resolve(symbol, version, flags));
    *pfn = f;
    return f ? 0 : 500;
}
