// What slows the same asynchronous launch in gpushare's device worker (issue 34, run L1: 4.29 µs
// inside cuLaunchKernel there against 3.55 µs directly). The worker's thread is never alone:
// the client and the data thread spin on other cores, and between launches it decodes the
// call, looks things up and writes the answer, which takes cache lines the driver's call had.
// This probe launches empty kernels back to back on one stream, timing only the call, with
// each kind of company in turn, round after round (the order rotates):
//   alone        nothing else;
//   spinners     two threads spinning with PAUSE on two other cores (the client and the
//                data thread waiting);
//   pingpong     two threads on two other cores handing a cache line back and forth;
//   query        a thread asking the driver about another (idle) stream in a loop;
//   pollute      the launching thread itself reads and writes 64 KiB between launches;
//   packed       alone, but passing an 8-byte parameter packed (CU_LAUNCH_PARAM_BUFFER_*),
//                the way the worker passes a client's parameters.
// Medians over the rounds, in µs a launch (inside the call). Pins itself to core CORE (env,
// default 2) and its company to CORE+1 and CORE+2.
// Build on the GPU machine: nvcc -O2 -o launch_company launch_company.c -lcuda -lpthread;
// run: ./launch_company [rounds] [launches per round]
#define _GNU_SOURCE
#include <cuda.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "timing.h"

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)

static const char *PTX = ".version 7.0\n.target sm_50\n.address_size 64\n"
                         ".visible .entry empty() { ret; }\n"
                         ".visible .entry one(.param .u64 p) { ret; }\n";

enum { ALONE, SPINNERS, PINGPONG, QUERY, POLLUTE, PACKED, KINDS };
static const char *NAME[KINDS] = {"alone", "spinners", "pingpong", "query", "pollute", "packed"};
enum { MAX_ROUNDS = 101, POLLUTE_BYTES = 64 << 10 };

static atomic_int company;  // the kind whose company runs now; -1 ends the threads
static _Alignas(64) atomic_long line;
static CUstream idle_stream;
static CUcontext ctx;
static int core;

static void pin(int c) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void *companion(void *arg) {
    int me = (int)(long)arg;
    pin(core + 1 + me);
    CK(cuCtxSetCurrent(ctx));
    for (;;) {
        int k = atomic_load(&company);
        if (k < 0)
            return NULL;
        if (k == SPINNERS) {
            _mm_pause();
        } else if (k == PINGPONG) {
            long v = atomic_load_explicit(&line, memory_order_acquire);
            if ((v & 1) == me)
                atomic_store_explicit(&line, v + 1, memory_order_release);
        } else if (k == QUERY && me == 0) {
            cuStreamQuery(idle_stream);
        } else {
            usleep(200);  // not this round's company: asleep
        }
    }
}

static unsigned char *junk;

static double per_launch_us(int kind, CUfunction empty, CUfunction one, CUstream s, int n) {
    CK(cuStreamSynchronize(s));
    unsigned long long param = 42;
    size_t size = sizeof param;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &param, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    double inside = 0;
    for (int i = 0; i < n; i++) {
        if (kind == POLLUTE)
            for (int j = 0; j < POLLUTE_BYTES; j += 64)
                junk[j] += (unsigned char)i;
        double a = now_us();
        if (kind == PACKED)
            CK(cuLaunchKernel(one, 1, 1, 1, 1, 1, 1, 0, s, NULL, extra));
        else
            CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        inside += now_us() - a;
    }
    CK(cuStreamSynchronize(s));
    return inside / n;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 12;
    int n = argc > 2 ? atoi(argv[2]) : 50000;
    core = getenv("CORE") ? atoi(getenv("CORE")) : 2;
    if (rounds < 1 || rounds > MAX_ROUNDS || n < 1) {
        fprintf(stderr, "usage: %s [rounds 1-%d] [launches per round]\n", argv[0], MAX_ROUNDS);
        return 2;
    }
    junk = calloc(POLLUTE_BYTES, 1);
    pin(core);
    CUdevice dev;
    CUmodule mod;
    CUfunction empty, one;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, PTX));
    CK(cuModuleGetFunction(&empty, mod, "empty"));
    CK(cuModuleGetFunction(&one, mod, "one"));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&idle_stream, CU_STREAM_NON_BLOCKING));
    atomic_store(&company, ALONE);
    pthread_t t[2];
    for (long i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, companion, (void *)i);
    for (int k = 0; k < KINDS; k++) {
        atomic_store(&company, k);
        per_launch_us(k, empty, one, s, n / 4);  // warm up
    }
    static double r[KINDS][MAX_ROUNDS];
    for (int i = 0; i < rounds; i++)
        for (int j = 0; j < KINDS; j++) {
            int k = (j + i) % KINDS;
            atomic_store(&company, k);
            r[k][i] = per_launch_us(k, empty, one, s, n);
        }
    atomic_store(&company, -1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("%d rounds of %d launches, core %d, company on %d and %d; us inside cuLaunchKernel\n",
           rounds, n, core, core + 1, core + 2);
    for (int k = 0; k < KINDS; k++) {
        qsort(r[k], rounds, sizeof r[k][0], by_value);
        printf("%-9s median %.3f (%.3f .. %.3f)\n", NAME[k], r[k][rounds / 2], r[k][0],
               r[k][rounds - 1]);
    }
    return 0;
}
