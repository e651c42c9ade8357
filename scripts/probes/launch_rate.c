// What an asynchronous launch costs the thread that makes it, directly, by the stream's
// priority (issue 34: through gpushare a device worker makes every launch, on a stream of the
// priority of the client's class: normal is the middle of the device's range, high its
// greatest). Empty kernels launched back to back on one stream, then one synchronization;
// the streams take turns, round after round (the machine's own speed drifts by 10 % within
// seconds), and each one's median over the rounds is printed in launches a second.
// Build on the GPU machine: nvcc -O2 -o launch_rate launch_rate.c -lcuda;
// run: ./launch_rate [rounds] [launches per round]
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "timing.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)

static const char *PTX = ".version 7.0\n.target sm_50\n.address_size 64\n"
                         ".visible .entry empty() { ret; }\n";

static double rate(CUfunction f, CUstream s, int n) {
    CK(cuStreamSynchronize(s));
    double a = now_us();
    for (int i = 0; i < n; i++)
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    CK(cuStreamSynchronize(s));
    return n / ((now_us() - a) * 1e-6);
}

enum { KINDS = 3, MAX_ROUNDS = 101 };

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    int n = argc > 2 ? atoi(argv[2]) : 100000;
    if (rounds < 1 || rounds > MAX_ROUNDS || n < 1) {
        fprintf(stderr, "usage: %s [rounds 1-%d] [launches per round]\n", argv[0], MAX_ROUNDS);
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    int least, greatest;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&f, mod, "empty"));
    CK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CUstream s[KINDS];
    const char *name[KINDS] = {"default priority", "normal (middle)", "high (greatest)"};
    CK(cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreateWithPriority(&s[1], CU_STREAM_NON_BLOCKING, (least + greatest) / 2));
    CK(cuStreamCreateWithPriority(&s[2], CU_STREAM_NON_BLOCKING, greatest));
    for (int k = 0; k < KINDS; k++)
        rate(f, s[k], n / 4); // warm up
    static double r[KINDS][MAX_ROUNDS];
    for (int i = 0; i < rounds; i++)
        for (int k = 0; k < KINDS; k++)
            r[(k + i) % KINDS][i] = rate(f, s[(k + i) % KINDS], n); // the order rotates
    printf("priorities %d (least) .. %d (greatest), %d rounds of %d launches\n", least, greatest,
           rounds, n);
    for (int k = 0; k < KINDS; k++) {
        qsort(r[k], rounds, sizeof r[k][0], by_value);
        printf("%-17s median %.0f launches/s (%.0f .. %.0f)\n", name[k], r[k][rounds / 2],
               r[k][0], r[k][rounds - 1]);
    }
    return 0;
}
