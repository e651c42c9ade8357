/* What the CUDA C++ probes that time work the way XLA's GPU timer does share (tma_gate.cu,
 * candidate_gate.cu, stream_ops_rate.cu): a check that ends the probe at the first failing
 * driver call, the delay kernel that holds a stream until the host writes 1 into a word of
 * page-locked memory (or `limit` ns have passed: it then writes 2), and the driver's handle of a
 * kernel compiled into the probe. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)

__global__ void delay(volatile unsigned *word, unsigned long long limit) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*word != 1) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > limit) {
            *word = 2;
            return;
        }
    }
}

static CUfunction function_of(const void *symbol) {
    cudaFunction_t f;
    if (cudaGetFuncBySymbol(&f, symbol) != cudaSuccess) {
        fprintf(stderr, "cudaGetFuncBySymbol failed\n");
        exit(1);
    }
    return (CUfunction)f;
}
