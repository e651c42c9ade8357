// What gpushared's fault check costs a busy device worker, and whether a cheaper question
// finds a fault as surely (issue 34, run W9: the check, a cuStreamQuery of the legacy stream
// that the guardian asks every 20 ms while a client is busy, took 1.9 ms in the worker).
// A thread launches empty kernels back to back on a stream of its own (64, then a sync), as a
// worker's channel thread does for a busy client, while the main thread asks every 20 ms:
//   none      nothing;
//   legacy    cuStreamQuery(NULL), the check as it is;
//   private   cuStreamQuery of an idle non-blocking stream made for it.
// Each mode in turn for 1 s, the order rotating over the rounds; per mode the launches a
// second (median over the rounds) and how long one question took (median and greatest, µs).
// Then a kernel writes to an address nobody mapped, and each question is asked again: both
// must report the fault (a non-zero CUresult other than CUDA_ERROR_NOT_READY).
// Build on the GPU machine: nvcc -O2 -o fault_check fault_check.c -lcuda -lpthread;
// run: ./fault_check [rounds]. Run K1 (docs/benchmarks.md): both questions took 16-18 us at
// the median beside 256,000-258,000 launches a second (260,000 asking nothing); both found
// the fault.
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "timing.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)

static const char *PTX = ".version 7.0\n.target sm_50\n.address_size 64\n"
                         ".visible .entry empty() { ret; }\n"
                         ".visible .entry poke(.param .u64 p) {\n"
                         "  .reg .u64 a; .reg .u32 v;\n"
                         "  ld.param.u64 a, [p]; mov.u32 v, 1; st.global.u32 [a], v; ret; }\n";

enum { NONE, LEGACY, PRIVATE, MODES, MAX_ROUNDS = 64, MAX_ASKS = 128 };
static const char *NAME[MODES] = {"none", "legacy", "private"};

static CUcontext ctx;
static CUfunction empty;
static CUstream busy;
static volatile int running, quit;
static volatile long launches;

static void *launcher(void *arg) {
    (void)arg;
    CK(cuCtxSetCurrent(ctx));
    while (!quit) {
        if (!running) {
            usleep(100);
            continue;
        }
        for (int i = 0; i < 64; i++)
            CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, busy, NULL, NULL));
        CK(cuStreamSynchronize(busy));
        launches += 64;
    }
    return NULL;
}

static CUresult ask(int mode, CUstream idle) {
    return cuStreamQuery(mode == LEGACY ? NULL : idle);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 8;
    if (rounds < 1 || rounds > MAX_ROUNDS)
        rounds = 8;
    CUdevice dev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, PTX));
    CUfunction poke;
    CK(cuModuleGetFunction(&empty, mod, "empty"));
    CK(cuModuleGetFunction(&poke, mod, "poke"));
    CUstream idle;
    CK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
    pthread_t t;
    pthread_create(&t, NULL, launcher, NULL);
    static double rate[MODES][MAX_ROUNDS], took[MODES][MAX_ROUNDS * MAX_ASKS];
    int asked[MODES] = {0};
    for (int r = 0; r < rounds; r++) {
        for (int j = 0; j < MODES; j++) {
            int m = (j + r) % MODES;
            long before = launches;
            double start = now_us();
            running = 1;
            while (now_us() - start < 1e6) {
                usleep(20000);
                if (m == NONE)
                    continue;
                double a = now_us();
                CUresult q = ask(m, idle);
                double b = now_us();
                if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) {
                    fprintf(stderr, "%s asked before any fault: %d\n", NAME[m], (int)q);
                    return 1;
                }
                if (asked[m] < MAX_ROUNDS * MAX_ASKS)
                    took[m][asked[m]++] = b - a;
            }
            running = 0;
            usleep(2000);
            rate[m][r] = (launches - before) / ((now_us() - start) * 1e-6);
        }
    }
    quit = 1;
    pthread_join(t, NULL);
    printf("launches a second beside a question every 20 ms (median of %d rounds); "
           "one question, us\n",
           rounds);
    for (int m = 0; m < MODES; m++) {
        qsort(rate[m], rounds, sizeof rate[m][0], by_value);
        printf("%-8s %9.0f", NAME[m], rate[m][rounds / 2]);
        if (asked[m]) {
            qsort(took[m], asked[m], sizeof took[m][0], by_value);
            printf("   question: median %.1f, greatest %.1f (%d asked)", took[m][asked[m] / 2],
                   took[m][asked[m] - 1], asked[m]);
        }
        printf("\n");
    }
    // A fault: both questions must tell.
    CUdeviceptr nowhere = 0x10;
    void *args[] = {&nowhere};
    CK(cuLaunchKernel(poke, 1, 1, 1, 1, 1, 1, 0, busy, args, NULL));
    usleep(200000);
    for (int m = LEGACY; m < MODES; m++) {
        CUresult q = ask(m, idle);
        const char *n = "?";
        cuGetErrorName(q, &n);
        printf("after the fault, %s: %s (%s)\n", NAME[m], n,
               q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY ? "found" : "MISSED");
    }
    return 0;
}
