/* Whether holding a best-effort stream on the GPU, behind a wait on a word the host writes,
 * keeps a high-priority request's tail near dedicated (issue 34: a library HP client beside
 * one BE trainer is 1.8-2.3 x dedicated at p99 through gpushare).
 *
 * HP: mlp_infer's shape (6 x [GEMM 8x2048x2048, axpy]), then a sync, Poisson arrivals (mean
 * gap 2 ms) busy-waited for, on a stream of the highest priority. BE: mlp_train's GEMMs
 * (512x2048x2048) on a stream of the lowest, as gpushare's priority policy runs them: at most
 * DEPTH in flight, none queued while a request is under way (Orion's rule). With the gate, every
 * BE GEMM is queued behind cuStreamWaitValue32(gate == 0), and the HP thread sets the gate for
 * the length of its request, so BE work queued before the request does not start inside it.
 *
 * With a third argument N, N best-effort streams (each its own thread, handle and output) run
 * the BE side, to tell whether the tails seen through gpushare beside four BE clients come
 * in one process too; each case then also prints its worst requests and how many took > 1 ms.
 *
 * Build: nvcc -O2 -arch=sm_90a be_gate.cu -lcublas -lcuda -o be_gate
 * Run:   ./be_gate [seconds per case] [rounds] [best-effort streams]
 */
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = "?"; \
    cuGetErrorName(r_, &n_); fprintf(stderr, "%s: %s\n", #x, n_); exit(1); } } while (0)
#define RT(x) do { cudaError_t r_ = (x); if (r_ != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorName(r_)); exit(1); } } while (0)
#define BL(x) do { cublasStatus_t r_ = (x); if (r_ != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "%s: %d\n", #x, (int)r_); exit(1); } } while (0)

using Clock = std::chrono::steady_clock;
static const int W = 2048;

struct Case {
    const char *name;
    bool hp, be, gate;
    int depth;
};

struct Result {
    double p50, p99, be_per_s, worst;
    long over_1ms;
};

static double pct(std::vector<double> v, double p) {
    if (v.empty())
        return 0;
    std::sort(v.begin(), v.end());
    size_t i = (size_t)std::ceil(p / 100.0 * v.size());
    return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 4;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int nbe = argc > 3 ? std::max(1, atoi(argv[3])) : 1;
    RT(cudaSetDevice(0));
    RT(cudaFree(0));
    int lo, hi;
    RT(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t hs;
    std::vector<cudaStream_t> bs(nbe);
    RT(cudaStreamCreateWithPriority(&hs, cudaStreamNonBlocking, hi));
    for (auto &s : bs)
        RT(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, lo));
    cublasHandle_t hb;
    std::vector<cublasHandle_t> bb(nbe);
    BL(cublasCreate(&hb));
    BL(cublasSetStream(hb, hs));
    for (int b = 0; b < nbe; b++) {
        BL(cublasCreate(&bb[b]));
        BL(cublasSetStream(bb[b], bs[b]));
    }
    float *hw, *ha, *hbuf, *bw, *ba;
    std::vector<float *> bbuf(nbe);
    RT(cudaMalloc(&hw, sizeof(float) * 6 * W * W));
    RT(cudaMalloc(&ha, sizeof(float) * 8 * W));
    RT(cudaMalloc(&hbuf, sizeof(float) * 8 * W));
    RT(cudaMalloc(&bw, sizeof(float) * W * W));
    RT(cudaMalloc(&ba, sizeof(float) * 512 * W));
    for (auto &p : bbuf)
        RT(cudaMalloc(&p, sizeof(float) * 512 * W));
    RT(cudaMemset(hw, 0, sizeof(float) * 6 * W * W));
    RT(cudaMemset(ha, 0, sizeof(float) * 8 * W));
    RT(cudaMemset(bw, 0, sizeof(float) * W * W));
    RT(cudaMemset(ba, 0, sizeof(float) * 512 * W));
    volatile unsigned *gate;
    CK(cuMemHostAlloc((void **)&gate, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dgate;
    CK(cuMemHostGetDevicePointer(&dgate, (void *)gate, 0));
    *gate = 0;
    const float one = 1, zero = 0, half = -0.5f;

    auto hp_request = [&] {
        float *src = ha, *dst = hbuf;
        for (int l = 0; l < 6; l++) {
            BL(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, W, 8, W, &one, hw + (size_t)l * W * W, W,
                           src, W, &zero, dst, W));
            BL(cublasSaxpy(hb, 8 * W, &half, dst, 1, dst, 1));
            std::swap(src, dst);
        }
        RT(cudaStreamSynchronize(hs));
    };
    auto be_gemm = [&](int b) {
        BL(cublasSgemm(bb[b], CUBLAS_OP_N, CUBLAS_OP_N, W, 512, W, &one, bw, W, ba, W, &zero,
                       bbuf[b], W));
    };
    for (int i = 0; i < 50; i++) {
        hp_request();
        for (int b = 0; b < nbe; b++)
            be_gemm(b);
    }
    RT(cudaDeviceSynchronize());

    std::vector<Case> cases = {
        {"dedicated", true, false, false, 0},
        {"be alone, depth 2", false, true, false, 2},
        {"be alone, depth 2, gated", false, true, true, 2},
        {"be alone, depth 8, gated", false, true, true, 8},
        {"hp + be, depth 2", true, true, false, 2},
        {"hp + be, depth 2, gated", true, true, true, 2},
        {"hp + be, depth 8, gated", true, true, true, 8},
        {"hp + be, depth 1", true, true, false, 1},
    };
    std::vector<std::vector<Result>> res(cases.size());
    for (int r = 0; r < rounds; r++) {
        for (size_t ci = 0; ci < cases.size(); ci++) {
            const Case &c = cases[(ci + r) % cases.size()];
            size_t idx = (ci + r) % cases.size();
            std::atomic<bool> stop{false}, hp_active{false};
            std::atomic<long> be_done{0};
            *gate = 0;
            std::vector<std::thread> be;
            for (int b = 0; c.be && b < nbe; b++) {
                be.emplace_back([&, b] {
                    std::vector<cudaEvent_t> ev(c.depth);
                    for (auto &e : ev)
                        RT(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
                    long queued = 0, done = 0;
                    while (!stop.load(std::memory_order_relaxed)) {
                        // Completions first.
                        while (done < queued && cudaEventQuery(ev[done % c.depth]) == cudaSuccess)
                            done++;
                        if (queued - done < c.depth && !hp_active.load(std::memory_order_acquire)) {
                            if (c.gate)
                                CK(cuStreamWaitValue32((CUstream)bs[b], dgate, 0,
                                                       CU_STREAM_WAIT_VALUE_EQ));
                            be_gemm(b);
                            RT(cudaEventRecord(ev[queued % c.depth], bs[b]));
                            queued++;
                        } else {
                            auto t = Clock::now();
                            while (Clock::now() - t < std::chrono::microseconds(2)) {
                            }
                        }
                    }
                    *gate = 0;
                    RT(cudaStreamSynchronize(bs[b]));
                    be_done += done;
                    for (auto &e : ev)
                        RT(cudaEventDestroy(e));
                });
            }
            std::vector<double> lat;
            auto start = Clock::now();
            auto end = start + std::chrono::duration<double>(seconds);
            if (c.hp) {
                std::mt19937_64 rng(42 + r);
                std::exponential_distribution<double> gap(1.0 / 2e-3);
                auto arrival = start + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(gap(rng)));
                while (arrival < end) {
                    while (Clock::now() < arrival) {
                    }
                    hp_active.store(true, std::memory_order_release);
                    if (c.gate) {
                        *gate = 1;
                        std::atomic_thread_fence(std::memory_order_seq_cst);
                    }
                    hp_request();
                    if (c.gate)
                        *gate = 0;
                    hp_active.store(false, std::memory_order_release);
                    lat.push_back(std::chrono::duration<double, std::milli>(Clock::now() - arrival)
                                      .count());
                    arrival += std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(gap(rng)));
                }
            } else {
                while (Clock::now() < end) {
                }
            }
            double took = std::chrono::duration<double>(Clock::now() - start).count();
            stop = true;
            for (auto &t : be)
                t.join();
            long over = std::count_if(lat.begin(), lat.end(), [](double l) { return l > 1.0; });
            std::vector<double> worst = lat;
            std::sort(worst.rbegin(), worst.rend());
            res[idx].push_back({pct(lat, 50), pct(lat, 99), c.be ? be_done / took : 0,
                                worst.empty() ? 0 : worst[0], over});
            fprintf(stderr,
                    "round %d %-26s p50 %.4f p99 %.4f ms  be %.0f/s  worst %.3f %.3f %.3f ms, "
                    "%ld of %zu over 1 ms\n",
                    r, c.name, pct(lat, 50), pct(lat, 99), c.be ? be_done / took : 0,
                    worst.size() > 0 ? worst[0] : 0, worst.size() > 1 ? worst[1] : 0,
                    worst.size() > 2 ? worst[2] : 0, over, lat.size());
        }
    }
    printf("case | HP p50 ms | HP p99 ms | p99 / dedicated | BE GEMMs/s | worst ms | over 1 ms "
           "(medians of %d rounds of %.0f s; %d BE streams)\n",
           rounds, seconds, nbe);
    auto med = [&](size_t i, int f) {
        std::vector<double> v;
        for (auto &x : res[i])
            v.push_back(f == 0   ? x.p50
                        : f == 1 ? x.p99
                        : f == 2 ? x.be_per_s
                        : f == 3 ? x.worst
                                 : (double)x.over_1ms);
        return pct(v, 50);
    };
    double ded = med(0, 1);
    for (size_t i = 0; i < cases.size(); i++)
        printf("%-26s | %.4f | %.4f | %.3f | %.0f | %.3f | %.0f\n", cases[i].name, med(i, 0),
               med(i, 1), cases[i].hp ? med(i, 1) / ded : 0.0, med(i, 2), med(i, 3), med(i, 4));
    return 0;
}
