// How a host thread learns that a stream's work finished, and what each way costs (issue 34):
// an empty kernel launched and then waited for by cuStreamSynchronize (the driver's own spin),
// by polling cuStreamQuery (what gpushare's device worker does, so that a wait can be given
// up), by polling cuEventQuery on an event recorded after it, and by cuStreamWriteValue32 into
// page-locked host memory followed by reading that word; and the cost of one cuStreamQuery on
// an idle stream. Prints medians in microseconds.
// Build on the GPU machine: nvcc -O2 -o sync_poll sync_poll.c -lcuda; run: ./sync_poll
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "timing.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)

static const char *PTX = ".version 7.0\n.target sm_50\n.address_size 64\n"
                         ".visible .entry empty() { ret; }\n";

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, by_value);
    return v[n / 2];
}

enum { N = 20000 };
static double t[N];

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream s;
    CUevent ev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&f, mod, "empty"));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    volatile unsigned *word;
    CK(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    CUdeviceptr dword;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    *word = 0;
    for (int i = 0; i < 2000; i++) {
        CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
        CK(cuStreamSynchronize(s));
    }
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            double a = now_us();
            CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
            CK(cuStreamSynchronize(s));
            t[i] = now_us() - a;
        }
        double sync = median(t, N);
        long polls = 0;
        for (int i = 0; i < N; i++) {
            double a = now_us();
            CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
            CUresult r;
            while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) polls++;
            CK(r);
            t[i] = now_us() - a;
        }
        double query = median(t, N);
        for (int i = 0; i < N; i++) {
            double a = now_us();
            CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
            CK(cuEventRecord(ev, s));
            CUresult r;
            while ((r = cuEventQuery(ev)) == CUDA_ERROR_NOT_READY) {}
            CK(r);
            t[i] = now_us() - a;
        }
        double event = median(t, N);
        for (int i = 0; i < N; i++) {
            unsigned v = (unsigned)(round * N + i + 1);
            double a = now_us();
            CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
            CK(cuStreamWriteValue32(s, dword, v, CU_STREAM_WRITE_VALUE_DEFAULT));
            while (*word != v) {}
            t[i] = now_us() - a;
        }
        double mark = median(t, N);
        for (int i = 0; i < N; i++) {
            double a = now_us();
            CK(cuStreamQuery(s));
            t[i] = now_us() - a;
        }
        double idle_query = median(t, N);
        printf("round %d: launch+sync %.2f  launch+poll cuStreamQuery %.2f (%.1f polls each)  "
               "launch+record+poll cuEventQuery %.2f  launch+writeValue32+read word %.2f  "
               "cuStreamQuery idle %.3f us\n",
               round, sync, query, (double)polls / N, event, mark, idle_query);
        fflush(stdout);
    }
    return 0;
}
