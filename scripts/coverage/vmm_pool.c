/* A memory pool on the CUDA virtual memory API, the way llama.cpp's (ggml_cuda_pool_vmm)
 * grows: one large reservation, physical memory mapped onto its end in granules as the pool
 * needs more, buffers handed out from it back to back (so a buffer spans several mappings),
 * a kernel over each buffer, and everything given back at the end. For the coverage matrix
 * (scripts/gpu-coverage.sh): prints one JSON line, {"ok": true, "values": [...]}.
 *
 * `vmm_pool bench N` instead times each call of the API, N rounds of one granule (create,
 * map, set access, unmap, release; reserve and free of 1 GiB), and prints their medians in
 * microseconds as one JSON line. `vmm_pool bench-worker N`, run directly, times what gpushare's
 * device worker asks the driver for those calls (bench_worker below).
 *
 *   cc -O2 -I/usr/local/cuda/include vmm_pool.c -L/usr/local/cuda/lib64/stubs -lcuda */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../probes/timing.h"

#define TRY(call)                                                                             \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            const char *n_ = "?";                                                             \
            cuGetErrorName(r_, &n_);                                                          \
            printf("{\"ok\": false, \"error\": \"%s: %s\"}\n", #call, n_);                    \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static const char *PTX =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry affine(.param .u64 p, .param .u32 n, .param .f32 a) {\n"
    "  .reg .pred %p; .reg .b32 %r<6>; .reg .f32 %f<4>; .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n]; ld.param.f32 %f1, [a];\n"
    "  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4; setp.ge.u32 %p, %r5, %r1; @%p bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r5, 4; add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.f32 %f2, [%rd4]; fma.rn.f32 %f3, %f2, %f1, 0f3F800000; st.global.f32 [%rd4], %f3;\n"
    "DONE: ret;\n}\n";

#define MAX_MAPS 64
static CUdeviceptr base;
static size_t reserved, mapped, used, gran;
static CUmemGenericAllocationHandle handles[MAX_MAPS];
static int nmaps;

/* Pinned device memory on GPU 0, the properties every call here uses. */
static CUmemAllocationProp device_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

/* Grows the mapped part of the pool to hold `need` bytes, a granule at a time, as llama.cpp. */
static CUdeviceptr pool_alloc(size_t bytes) {
    size_t need = used + bytes;
    if (need > mapped) {
        size_t grow = ((need - mapped + gran - 1) / gran) * gran;
        CUmemAllocationProp prop = device_prop();
        CUmemGenericAllocationHandle h;
        TRY(cuMemCreate(&h, grow, &prop, 0));
        TRY(cuMemMap(base + mapped, grow, 0, h, 0));
        CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0},
                                  CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        TRY(cuMemSetAccess(base + mapped, grow, &access, 1));
        handles[nmaps++] = h;
        mapped += grow;
    }
    CUdeviceptr p = base + used;
    used += (bytes + 255) / 256 * 256;
    return p;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return v[n / 2];
}

/* Room for `ops` series of `rounds` timings. */
static void make_series(double **t, int ops, int rounds) {
    for (int k = 0; k < ops; k++) t[k] = calloc((size_t)rounds, sizeof(double));
}

/* The medians of each series, as one JSON line. */
static void print_medians(const char *const *names, double **t, int ops, int rounds) {
    printf("{\"ok\": true, \"rounds\": %d", rounds);
    for (int k = 0; k < ops; k++) printf(", \"%s_us\": %.1f", names[k], median(t[k], rounds));
    printf("}\n");
}

/* Medians of each call over `rounds` rounds. */
static void bench(int rounds) {
    enum { CREATE, MAP, ACCESS, UNMAP, RELEASE, RESERVE, FREE, OPS };
    static const char *names[OPS] = {"create", "map", "set_access", "unmap", "release",
                                     "reserve_1g", "free_1g"};
    double *t[OPS];
    make_series(t, OPS, rounds);
    CUmemAllocationProp prop = device_prop();
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (int i = 0; i < rounds; i++) {
        CUdeviceptr va;
        CUmemGenericAllocationHandle h;
        double a = now_us();
        TRY(cuMemAddressReserve(&va, (size_t)1 << 30, 0, 0, 0));
        double b = now_us();
        TRY(cuMemCreate(&h, gran, &prop, 0));
        double c = now_us();
        TRY(cuMemMap(va, gran, 0, h, 0));
        double d = now_us();
        TRY(cuMemSetAccess(va, gran, &access, 1));
        double e = now_us();
        TRY(cuMemUnmap(va, gran));
        double f = now_us();
        TRY(cuMemRelease(h));
        double g = now_us();
        TRY(cuMemAddressFree(va, (size_t)1 << 30));
        double h2 = now_us();
        t[RESERVE][i] = b - a, t[CREATE][i] = c - b, t[MAP][i] = d - c, t[ACCESS][i] = e - d;
        t[UNMAP][i] = f - e, t[RELEASE][i] = g - f, t[FREE][i] = h2 - g;
    }
    print_medians(names, t, OPS, rounds);
}

/* What a device worker's calls cost the driver, run directly: making memory (an exportable
 * cuMemCreate, its descriptor, the handle released: `cuda/chunks.rs`'s make), and mapping it
 * in a worker (import the descriptor, map, set access), then unmapping it (unmap, release the
 * imported handle). gpushare's cuMemCreate is the first; its cuMemMap the second twice (the
 * serving worker and its spare). Medians over `rounds`, in microseconds. */
static void bench_worker(int rounds) {
    enum { MAKE, IMPORT_MAP, UNMAP, OPS };
    static const char *names[OPS] = {"make_exported", "import_map_access", "unmap_release"};
    double *t[OPS];
    make_series(t, OPS, rounds);
    CUmemAllocationProp prop = device_prop();
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUdeviceptr va;
    TRY(cuMemAddressReserve(&va, gran, 0, 0, 0));
    for (int i = 0; i < rounds; i++) {
        CUmemGenericAllocationHandle h, imported;
        int fd = -1;
        double a = now_us();
        TRY(cuMemCreate(&h, gran, &prop, 0));
        TRY(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        TRY(cuMemRelease(h));
        double b = now_us();
        TRY(cuMemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd,
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        TRY(cuMemMap(va, gran, 0, imported, 0));
        TRY(cuMemSetAccess(va, gran, &access, 1));
        double c = now_us();
        TRY(cuMemUnmap(va, gran));
        TRY(cuMemRelease(imported));
        double d = now_us();
        close(fd);
        t[MAKE][i] = b - a, t[IMPORT_MAP][i] = c - b, t[UNMAP][i] = d - c;
    }
    TRY(cuMemAddressFree(va, gran));
    print_medians(names, t, OPS, rounds);
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    TRY(cuInit(0));
    TRY(cuDeviceGet(&dev, 0));
    TRY(cuDevicePrimaryCtxRetain(&ctx, dev));
    TRY(cuCtxSetCurrent(ctx));
    int vmm = 0;
    TRY(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    if (!vmm) {
        printf("{\"ok\": false, \"error\": \"no virtual memory management\"}\n");
        return 1;
    }
    CUmemAllocationProp prop = device_prop();
    TRY(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (argc > 2 && !strcmp(argv[1], "bench")) {
        bench(atoi(argv[2]) > 0 ? atoi(argv[2]) : 100);
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "bench-worker")) {
        bench_worker(atoi(argv[2]) > 0 ? atoi(argv[2]) : 100);
        return 0;
    }
    reserved = (size_t)32 << 30; /* llama.cpp reserves 32 GiB of address space */
    TRY(cuMemAddressReserve(&base, reserved, 0, 0, 0));
    CUmodule mod;
    CUfunction fn;
    TRY(cuModuleLoadData(&mod, PTX));
    TRY(cuModuleGetFunction(&fn, mod, "affine"));

    double sums[8];
    size_t sizes[8] = {3 << 20, 1 << 10, 5 << 20, 7 << 19, 1 << 22, 12345 * 4, 9 << 20, 1 << 16};
    for (int b = 0; b < 8; b++) {
        unsigned n = (unsigned)(sizes[b] / 4);
        float *host = malloc(sizes[b]);
        for (unsigned i = 0; i < n; i++) host[i] = (float)((i * 7 + b) % 1000) / 100.0f;
        CUdeviceptr p = pool_alloc(sizes[b]);
        TRY(cuMemcpyHtoD(p, host, sizes[b]));
        float a = 0.5f + b;
        void *args[] = {&p, &n, &a};
        TRY(cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
        TRY(cuMemcpyDtoH(host, p, sizes[b]));
        double s = 0;
        for (unsigned i = 0; i < n; i++) s += host[i];
        sums[b] = s;
        free(host);
    }
    TRY(cuCtxSynchronize());
    TRY(cuMemUnmap(base, mapped));
    for (int i = 0; i < nmaps; i++) TRY(cuMemRelease(handles[i]));
    TRY(cuMemAddressFree(base, reserved));
    printf("{\"ok\": true, \"values\": [");
    for (int b = 0; b < 8; b++) printf("%s%.6f", b ? ", " : "", sums[b]);
    printf(", %d]}\n", nmaps);
    return 0;
}
