/* Driver-level speed of a CUDA program, consolidated or direct: loads libcuda.so.1 the way
 * the CUDA runtime does (dlopen by soname), then measures
 *   first_op_s   main() to the first finished op (cuInit, context, alloc, memset, sync);
 *   launches_s   empty kernels launched asynchronously on one stream, then synchronized;
 *   rtt_p50/p99  one empty kernel launched and waited for, after --think-us of idle time;
 *   alloc_*_us   the median time of a cuMemAlloc: 1000 of 512 bytes kept live together (most
 *                carved out of memory already there), and an alloc + free of 2 MiB and of
 *                64 MiB, 100 times each.
 * Prints one JSON object. Build: cc -O2 -o launch launch.c -ldl */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "no %s\n", name); exit(2); }
    return p;
}

#define CHECK(call) do { CUresult r_ = (call); if (r_) { fprintf(stderr, "%s -> %d\n", #call, r_); exit(1); } } while (0)

static const char PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry empty()\n{\n\tret;\n}\n";

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    double t0 = now();
    long launches = argc > 1 ? atol(argv[1]) : 200000;
    long think_us = argc > 2 ? atol(argv[2]) : 1000;
    int rtts = argc > 3 ? atoi(argv[3]) : 2000;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    CUresult (*cuInit)(unsigned) = sym(lib, "cuInit");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym(lib, "cuCtxSetCurrent");
    CUresult (*cuCtxSynchronize)(void) = sym(lib, "cuCtxSynchronize");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym(lib, "cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym(lib, "cuMemFree_v2");
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = sym(lib, "cuMemsetD8_v2");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym(lib, "cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = sym(lib, "cuModuleGetFunction");
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym(lib, "cuStreamCreate");
    CUresult (*cuStreamSynchronize)(CUstream) = sym(lib, "cuStreamSynchronize");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **) = sym(lib, "cuLaunchKernel");

    CUcontext ctx; CUdeviceptr buf; CUmodule mod; CUfunction f; CUstream s;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&buf, 1 << 20));
    CHECK(cuMemsetD8(buf, 1, 1 << 20));
    CHECK(cuCtxSynchronize());
    double first = now() - t0;

    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&f, mod, "empty"));
    CHECK(cuStreamCreate(&s, 1));
    for (int i = 0; i < 1000; i++)
        CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    CHECK(cuStreamSynchronize(s));
    double best = 0;
    for (int round = 0; round < 3; round++) {
        double a = now();
        for (long i = 0; i < launches; i++)
            CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
        CHECK(cuStreamSynchronize(s));
        double rate = launches / (now() - a);
        if (rate > best) best = rate;
    }

    double *rtt = calloc(rtts, sizeof *rtt);
    struct timespec idle = {think_us / 1000000, (think_us % 1000000) * 1000};
    for (int i = 0; i < rtts; i++) {
        if (think_us) nanosleep(&idle, NULL);
        double a = now();
        CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
        CHECK(cuStreamSynchronize(s));
        rtt[i] = now() - a;
    }
    qsort(rtt, rtts, sizeof *rtt, cmp);

    enum { SMALL = 1000, BIG = 100 };
    static CUdeviceptr live[SMALL];
    double took[SMALL], alloc_us[3];
    for (int i = 0; i < SMALL; i++) {
        double a = now();
        CHECK(cuMemAlloc(&live[i], 512));
        took[i] = now() - a;
    }
    for (int i = 0; i < SMALL; i++) CHECK(cuMemFree(live[i]));
    qsort(took, SMALL, sizeof *took, cmp);
    alloc_us[0] = took[SMALL / 2] * 1e6;
    size_t sizes[2] = {2u << 20, 64u << 20};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < BIG; i++) {
            CUdeviceptr p;
            double a = now();
            CHECK(cuMemAlloc(&p, sizes[k]));
            took[i] = now() - a;
            CHECK(cuMemFree(p));
        }
        qsort(took, BIG, sizeof *took, cmp);
        alloc_us[k + 1] = took[BIG / 2] * 1e6;
    }
    printf("{\"first_op_s\": %.6f, \"launches_s\": %.0f, \"rtt_p50_us\": %.2f, \"rtt_p99_us\": %.2f, "
           "\"alloc_512b_us\": %.2f, \"alloc_2mib_us\": %.2f, \"alloc_64mib_us\": %.2f}\n",
           first, best, rtt[rtts / 2] * 1e6, rtt[(int)(rtts * 0.99)] * 1e6, alloc_us[0], alloc_us[1],
           alloc_us[2]);
    return 0;
}
