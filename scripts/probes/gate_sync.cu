/* Which driver calls wait for work held at the priority gate, and which of them hold up
 * another thread's launches meanwhile (issue 34: in run G4, before the gate had its keeper,
 * all five clients stopped while they warmed up, the high-priority one too; a call of the
 * warm-up that waits for the whole context, holding the driver's lock, would do that).
 *
 * For each call: a low-priority stream is parked on cuStreamWaitValue32 (the gate, closed)
 * with a kernel behind it; a second thread makes the call; 1 ms later the main thread launches
 * a kernel on a high-priority stream and waits for it. After 20 ms the gate opens. Printed:
 * when the call returned and the high-priority kernel finished (after 20 ms: held by the
 * gate), and how long the high-priority launch call itself took.
 *
 * Build: nvcc -O2 -arch=sm_90a gate_sync.cu -lcuda -o gate_sync
 * Run:   ./gate_sync
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
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

static double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// A module with one empty kernel, for the load and unload calls.
static const char *PTX = R"(
.version 7.0
.target sm_50
.address_size 64
.visible .entry empty() { ret; }
)";

int main() {
    RT(cudaSetDevice(0));
    RT(cudaFree(0));
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    int lo, hi;
    RT(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t hs, bs, other;
    RT(cudaStreamCreateWithPriority(&hs, cudaStreamNonBlocking, hi));
    RT(cudaStreamCreateWithPriority(&bs, cudaStreamNonBlocking, lo));
    RT(cudaStreamCreateWithPriority(&other, cudaStreamNonBlocking, lo));
    int *buf;
    RT(cudaMalloc(&buf, 1 << 20));
    std::vector<char> host(1 << 20);
    volatile unsigned *gate;
    CK(cuMemHostAlloc((void **)&gate, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dgate;
    CK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0));
    *gate = 0;
    cudaEvent_t he;
    RT(cudaEventCreateWithFlags(&he, cudaEventDisableTiming));
    noop<<<1, 32, 0, hs>>>(buf);
    RT(cudaDeviceSynchronize());

    struct Call {
        const char *name;
        std::function<void()> run;
    };
    std::vector<Call> calls = {
        {"nothing", [] {}},
        {"cuMemAlloc 1 MiB", [] {
             CUdeviceptr p;
             CK(cuMemAlloc(&p, 1 << 20));
             CK(cuMemFree(p));  // freed at once: the pair as a program's warm-up makes them
         }},
        {"cuMemFree (of a fresh 64 MiB)", [] {}},  // set below: allocated before the gate
        {"cuMemAllocAsync + cuMemFreeAsync (other stream)", [&] {
             CUdeviceptr p;
             CK(cuMemAllocAsync(&p, 1 << 20, (CUstream)other));
             CK(cuMemFreeAsync(p, (CUstream)other));
             CK(cuStreamSynchronize((CUstream)other));
         }},
        {"cuMemcpyHtoD 1 MiB (sync)", [&] {
             CK(cuMemcpyHtoD((CUdeviceptr)buf, host.data(), 1 << 20));
         }},
        {"cuMemcpyDtoH 1 MiB (sync)", [&] {
             CK(cuMemcpyDtoH(host.data(), (CUdeviceptr)buf, 1 << 20));
         }},
        {"cuMemsetD8 (sync)", [&] { CK(cuMemsetD8((CUdeviceptr)buf, 0, 1 << 20)); }},
        {"cuMemcpyHtoDAsync on other + sync", [&] {
             CK(cuMemcpyHtoDAsync((CUdeviceptr)buf, host.data(), 1 << 20, (CUstream)other));
             CK(cuStreamSynchronize((CUstream)other));
         }},
        {"cuModuleLoadData + Unload", [] {
             CUmodule m;
             CK(cuModuleLoadData(&m, PTX));
             CK(cuModuleUnload(m));
         }},
        {"cuMemHostAlloc + FreeHost 1 MiB", [] {
             void *p;
             CK(cuMemHostAlloc(&p, 1 << 20, 0));
             CK(cuMemFreeHost(p));
         }},
        {"cuMemHostRegister + Unregister 1 MiB", [] {
             void *p = aligned_alloc(4096, 1 << 20);
             CK(cuMemHostRegister(p, 1 << 20, 0));
             CK(cuMemHostUnregister(p));
             free(p);
         }},
        {"cuStreamCreate + Destroy", [] {
             CUstream s;
             CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
             CK(cuStreamDestroy(s));
         }},
        {"cuEventCreate + Destroy", [] {
             CUevent e;
             CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
             CK(cuEventDestroy(e));
         }},
        {"cuMemGetInfo", [] {
             size_t f, t;
             CK(cuMemGetInfo(&f, &t));
         }},
        {"cuCtxSynchronize", [] { CK(cuCtxSynchronize()); }},
    };
    printf("%-48s | returned at ms, while closed? | HP launch call ms | HP done at ms, while "
           "closed?\n",
           "call (gate closed from 0 to 20 ms; HP at 1 ms)");
    for (auto &c : calls) {
        CUdeviceptr big = 0;
        if (strncmp(c.name, "cuMemFree (", 11) == 0)
            CK(cuMemAlloc(&big, 64 << 20));
        *gate = 1;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        CK(cuStreamWaitValue32((CUstream)bs, dgate, 0, CU_STREAM_WAIT_VALUE_EQ));
        noop<<<1, 32, 0, bs>>>(buf + 64);
        auto t0 = Clock::now();
        std::atomic<double> returned{-1};
        std::thread t([&] {
            CK(cuCtxSetCurrent(ctx));
            if (big)
                CK(cuMemFree(big));
            else
                c.run();
            returned = ms_since(t0);
        });
        // The gate opens at 20 ms whatever the other threads are stuck in.
        std::thread opener([&] {
            while (ms_since(t0) < 20.0) {
            }
            *gate = 0;
        });
        while (ms_since(t0) < 1.0) {
        }
        auto l0 = Clock::now();
        noop<<<1, 32, 0, hs>>>(buf + 128);
        RT(cudaEventRecord(he, hs));
        double launch = ms_since(l0);
        double hp_done = -1;
        while (hp_done < 0 && ms_since(t0) < 200.0) {
            if (cudaEventQuery(he) == cudaSuccess)
                hp_done = ms_since(t0);
        }
        opener.join();
        t.join();
        double ret = returned.load();
        RT(cudaDeviceSynchronize());
        printf("%-48s | %8.3f %-17s | %17.3f | %8.3f %s\n", c.name, ret,
               ret < 20.0 ? "yes" : "no (waited)", launch, hp_done,
               hp_done >= 0 && hp_done < 20.0 ? "yes" : "no (held)");
    }
    return 0;
}
