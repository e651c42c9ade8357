// XLA's GPU timer (stream_executor's CudaTimer), as a consolidated program meets it: the timer
// launches a "delay kernel" that spins until a word of page-locked host memory says go, records
// its start event, queues the work it times and the stop event, then writes the word and waits
// for the stop event. Directly, everything is queued on the GPU before the word is written, so
// the interval holds the work alone. Through gpushare, queued calls are still on their way to
// the device worker when the word is written. Prints the median elapsed time (µs) of a 5 µs
// kernel, 1 and 4 of them, timed with and without the delay kernel, and how many delay kernels
// timed out. Build on the GPU machine: nvcc -O2 -o timer_gate timer_gate.c -lcuda; run it
// directly and under `gpushare run`.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#include "timing.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)

// delay(word, limit_ns): spins until *word == 1, or writes 2 there after limit_ns.
// work(ns): spins for ns nanoseconds of the GPU's global timer.
static const char *PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry delay(.param .u64 word, .param .u64 limit) {\n"
    " .reg .u64 %rd<6>; .reg .u32 %r<2>; .reg .pred %p<3>;\n"
    " ld.param.u64 %rd1, [word]; ld.param.u64 %rd2, [limit];\n"
    " mov.u64 %rd3, %globaltimer;\n"
    "LOOP:\n ld.volatile.global.u32 %r1, [%rd1];\n setp.eq.u32 %p1, %r1, 1;\n @%p1 bra DONE;\n"
    " mov.u64 %rd4, %globaltimer;\n sub.u64 %rd5, %rd4, %rd3;\n setp.lt.u64 %p2, %rd5, %rd2;\n"
    " @%p2 bra LOOP;\n st.volatile.global.u32 [%rd1], 2;\nDONE:\n ret;\n}\n"
    ".visible .entry work(.param .u64 ns) {\n"
    " .reg .u64 %rd<5>; .reg .pred %p<2>;\n"
    " ld.param.u64 %rd1, [ns]; mov.u64 %rd2, %globaltimer;\n"
    "SPIN:\n mov.u64 %rd3, %globaltimer;\n sub.u64 %rd4, %rd3, %rd2;\n setp.lt.u64 %p1, %rd4, %rd1;\n"
    " @%p1 bra SPIN;\n ret;\n}\n";

enum { N = 2000 };
static double t[N];

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, by_value);
    return v[n / 2];
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction delay, work;
    CUstream s;
    CUevent start, stop;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&delay, mod, "delay"));
    CK(cuModuleGetFunction(&work, mod, "work"));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    volatile unsigned *word;
    CK(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dword;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    unsigned long long ns = argc > 1 ? strtoull(argv[1], NULL, 10) : 5000;
    unsigned long long limit = 50000000; // the delay kernel gives up after 50 ms
    void *work_args[] = {&ns};
    void *delay_args[] = {&dword, &limit};
    for (int gated = 0; gated < 2; gated++) {
        for (int kernels = 1; kernels <= 4; kernels += 3) {
            int timed_out = 0;
            for (int i = 0; i < N + 200; i++) {
                *word = 0;
                if (gated)
                    CK(cuLaunchKernel(delay, 1, 1, 1, 1, 1, 1, 0, s, delay_args, NULL));
                CK(cuEventRecord(start, s));
                for (int k = 0; k < kernels; k++)
                    CK(cuLaunchKernel(work, 1, 1, 1, 1, 1, 1, 0, s, work_args, NULL));
                CK(cuEventRecord(stop, s));
                if (gated) {
                    __sync_synchronize();
                    if (*word == 2)
                        timed_out++;
                    *word = 1;
                }
                CK(cuEventSynchronize(stop));
                float ms;
                CK(cuEventElapsedTime(&ms, start, stop));
                if (i >= 200)
                    t[i - 200] = ms * 1000.0;
            }
            CK(cuStreamSynchronize(s));
            printf("%s, %d kernel(s) of %llu ns: median %.2f us (timed out %d)\n",
                   gated ? "delay kernel" : "no delay kernel", kernels, ns, median(t, N),
                   timed_out);
        }
    }
    return 0;
}
