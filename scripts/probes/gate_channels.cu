/* Which streams a gated stream holds up (issue 34, the priority gate's four-client tails).
 *
 * A stream's work reaches the GPU through one of the context's hardware queues
 * (CUDA_DEVICE_MAX_CONNECTIONS of them, 8 by default), which streams share. A stream parked
 * on cuStreamWaitValue32, or a kernel waiting for its stream's previous kernel, may hold the
 * work that other streams queued behind it on the same queue. This prints, for streams made
 * in order with the priorities given, which stream's work is held by a wait on which other,
 * so the sharing rule (creation order, priority) can be read off.
 *
 * Build: nvcc -O2 -arch=sm_90a gate_channels.cu -lcuda -o gate_channels
 * Run:   CUDA_DEVICE_MAX_CONNECTIONS=8 ./gate_channels [pattern]
 *        pattern: one letter per stream in creation order, h (highest priority) or l (lowest);
 *        default "hllllllllllh".
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)
#define RT(x) do { cudaError_t r_ = (x); if (r_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorName(r_)); exit(1); } } while (0)

using Clock = std::chrono::steady_clock;

__global__ void noop(int *p) {
    if (threadIdx.x == 0)
        p[blockIdx.x] += 1;
}

__global__ void spin(long long cycles) {
    long long t = clock64();
    while (clock64() - t < cycles) {
    }
}

// Whether `e` completes within `us` microseconds.
static bool done_within(cudaEvent_t e, int us) {
    auto t = Clock::now();
    while (Clock::now() - t < std::chrono::microseconds(us)) {
        if (cudaEventQuery(e) == cudaSuccess)
            return true;
    }
    return false;
}

int main(int argc, char **argv) {
    const char *pattern = argc > 1 ? argv[1] : "hllllllllllh";
    int n = (int)strlen(pattern);
    RT(cudaSetDevice(0));
    RT(cudaFree(0));
    int lo, hi;
    RT(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    std::vector<cudaStream_t> s(n);
    for (int i = 0; i < n; i++)
        RT(cudaStreamCreateWithPriority(&s[i], cudaStreamNonBlocking, pattern[i] == 'h' ? hi : lo));
    int *buf;
    RT(cudaMalloc(&buf, 4096));
    volatile unsigned *gate;
    CK(cuMemHostAlloc((void **)&gate, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dgate;
    CK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0));
    *gate = 0;
    cudaEvent_t e;
    RT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (int i = 0; i < n; i++)
        noop<<<1, 32, 0, s[i]>>>(buf);
    RT(cudaDeviceSynchronize());

    const char *env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("connections %s, streams in creation order: %s\n", env ? env : "(default)", pattern);
    for (int kind = 0; kind < 2; kind++) {
        printf("%s\n", kind == 0
                           ? "held by a wait on a host word (row: the waiting stream; x: the "
                             "column stream's kernel did not run within 2 ms; o: the row's own, "
                             "held as it must be)"
                           : "held by a kernel waiting for its stream's 5 ms kernel (row: that "
                             "stream; x: the column stream's kernel, queued after, waited; o: "
                             "the row's own)");
        printf("    ");
        for (int j = 0; j < n; j++)
            printf("%2d", j);
        printf("\n");
        for (int i = 0; i < n; i++) {
            printf("%2d%c ", i, pattern[i]);
            for (int j = 0; j < n; j++) {
                if (kind == 0) {
                    *gate = 1;
                    std::atomic_thread_fence(std::memory_order_seq_cst);
                    CK(cuStreamWaitValue32((CUstream)s[i], dgate, 0, CU_STREAM_WAIT_VALUE_EQ));
                } else {
                    spin<<<1, 32, 0, s[i]>>>(5LL * 1980 * 1000);  // ~5 ms at 1.98 GHz
                }
                noop<<<1, 32, 0, s[i]>>>(buf);
                noop<<<1, 32, 0, s[j]>>>(buf + 1);
                RT(cudaEventRecord(e, s[j]));
                bool held = !done_within(e, 2000);
                *gate = 0;
                RT(cudaDeviceSynchronize());
                // The diagonal is the control: a stream's own work waits behind its wait ('o');
                // '!' there would mean this probe cannot see holding at all.
                printf(" %c", i == j ? (held ? 'o' : '!') : (held ? 'x' : '-'));
            }
            printf("\n");
        }
    }
    return 0;
}
