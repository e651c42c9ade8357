/* Which driver calls wait for work held at the priority gate, and which of them hold up
 * another thread's launches meanwhile (issue 34: in run G4, before the gate had its keeper,
 * all five clients stopped while they warmed up, the high-priority one too; a call of the
 * warm-up that waits for the whole context, holding the driver's lock, would do that).
 *
 * For each call: a low-priority stream is parked on cuStreamWaitValue32 (the gate, closed)
 * with a kernel behind it; a second thread makes the call; 1 ms later the main thread launches
 * a kernel on a high-priority stream and waits for it. After 20 ms the gate opens. Printed:
 * when the call returned and the high-priority kernel finished (after 20 ms: held by the
 * gate), and how long the high-priority launch call itself took. What a call needs first
 * (an allocation to free, a module to unload) is made before the gate closes, and what it
 * leaves is let go after the gate opens: only the call itself is timed.
 *
 * `./gate_sync hold` runs every call again as gpushared's worker does since run C1: the gate
 * is the word's OPEN bit (waited for with CU_STREAM_WAIT_VALUE_AND on OPEN | HELD), and the
 * calling thread sets HELD around the call (`broker/src/device/gate.rs`).
 *
 * Build: nvcc -O2 -arch=sm_90a gate_sync.cu -lcuda -o gate_sync
 * Run:   ./gate_sync [hold]
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

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
.visible .global .u32 g;
.visible .entry empty() { ret; }
)";

// A module the driver has not compiled before (a global of a fresh name), so that loading it
// compiles the PTX.
static std::string fresh_ptx() {
    static int n = 0;
    char ptx[512];
    snprintf(ptx, sizeof ptx,
             ".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .u32 g%d_%d;\n"
             ".visible .entry empty() { ret; }\n",
             (int)getpid(), n++);
    return ptx;
}

int main(int argc, char **argv) {
    const bool hold = argc > 1 && strcmp(argv[1], "hold") == 0;
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
        std::function<void()> pre, run, post;
    };
    auto none = [] {};
    // What the calls share: made by `pre`, used by `run`, let go by `post`.
    CUdeviceptr dptr = 0, va = 0;
    CUmemGenericAllocationHandle mem = 0;
    CUmodule mod = nullptr;
    CUlibrary lib = nullptr;
    std::vector<char> cubin;
    CUfunction fn = nullptr;
    void *hptr = nullptr;
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    const size_t G = 2 << 20;  // the granule on an H200
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    auto create = [&] { CK(cuMemCreate(&mem, G, &prop, 0)); };
    auto reserve = [&] { CK(cuMemAddressReserve(&va, G, 0, 0, 0)); };
    auto map = [&] { CK(cuMemMap(va, G, 0, mem, 0)); };
    auto allow = [&] { CK(cuMemSetAccess(va, G, &access, 1)); };
    auto unmap = [&] { CK(cuMemUnmap(va, G)); };
    auto release = [&] { CK(cuMemRelease(mem)); };
    auto unreserve = [&] { CK(cuMemAddressFree(va, G)); };
    auto load = [&] { CK(cuModuleLoadData(&mod, PTX)); };
    auto unload = [&] { CK(cuModuleUnload(mod)); };
    auto get = [&] { CK(cuModuleGetFunction(&fn, mod, "empty")); };
    auto aligned = [&] { hptr = aligned_alloc(4096, 1 << 20); };
    // A fresh PTX compiled by the driver's linker into `cubin`.
    auto compile = [&] {
        std::string ptx = fresh_ptx();
        CUlinkState link;
        CK(cuLinkCreate(0, nullptr, nullptr, &link));
        CK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)ptx.c_str(), ptx.size() + 1, "p", 0,
                         nullptr, nullptr));
        void *out;
        size_t size;
        CK(cuLinkComplete(link, &out, &size));
        cubin.assign((char *)out, (char *)out + size);
        CK(cuLinkDestroy(link));
    };
    auto load_library = [&] {
        CK(cuLibraryLoadData(&lib, PTX, nullptr, nullptr, 0, nullptr, nullptr, 0));
    };
    auto unload_library = [&] { CK(cuLibraryUnload(lib)); };
    auto get_kernel = [&] {
        CUkernel k;
        CK(cuLibraryGetKernel(&k, lib, "empty"));
        CK(cuKernelGetFunction(&fn, k));
    };

    auto capture = [&] {
        CK(cuStreamBeginCapture((CUstream)other, CU_STREAM_CAPTURE_MODE_RELAXED));
        noop<<<1, 32, 0, other>>>(buf + 192);
        CK(cuStreamEndCapture((CUstream)other, &graph));
    };
    auto instantiate = [&] { CK(cuGraphInstantiate(&exec, graph, 0)); };
    auto drop_graph = [&] {
        CK(cuGraphExecDestroy(exec));
        CK(cuGraphDestroy(graph));
    };
    std::vector<Call> calls = {
        {"nothing", none, none, none},
        {"cuMemAlloc 1 MiB", none, [&] { CK(cuMemAlloc(&dptr, 1 << 20)); },
         [&] { CK(cuMemFree(dptr)); }},
        {"cuMemFree 1 MiB", [&] { CK(cuMemAlloc(&dptr, 1 << 20)); },
         [&] { CK(cuMemFree(dptr)); }, none},
        {"cuMemFree 64 MiB", [&] { CK(cuMemAlloc(&dptr, 64 << 20)); },
         [&] { CK(cuMemFree(dptr)); }, none},
        {"cuMemAllocAsync + cuMemFreeAsync (other stream)", none, [&] {
             CUdeviceptr p;
             CK(cuMemAllocAsync(&p, 1 << 20, (CUstream)other));
             CK(cuMemFreeAsync(p, (CUstream)other));
             CK(cuStreamSynchronize((CUstream)other));
         }, none},
        {"cuMemCreate 2 MiB", none, create, release},
        {"cuMemAddressReserve 2 MiB", none, reserve, unreserve},
        {"cuMemMap", [&] { create(); reserve(); }, map,
         [&] { unmap(); release(); unreserve(); }},
        {"cuMemSetAccess", [&] { create(); reserve(); map(); }, allow,
         [&] { unmap(); release(); unreserve(); }},
        {"cuMemUnmap", [&] { create(); reserve(); map(); allow(); }, unmap,
         [&] { release(); unreserve(); }},
        {"cuMemRelease (unmapped)", create, release, none},
        {"cuMemAddressFree", reserve, unreserve, none},
        {"cuMemExportToShareableHandle", create, [&] {
             int fd = -1;
             CK(cuMemExportToShareableHandle(&fd, mem, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
             close(fd);
         }, release},
        {"cuMemcpyHtoD 1 MiB (sync)", none, [&] {
             CK(cuMemcpyHtoD((CUdeviceptr)buf, host.data(), 1 << 20));
         }, none},
        {"cuMemcpyDtoH 1 MiB (sync)", none, [&] {
             CK(cuMemcpyDtoH(host.data(), (CUdeviceptr)buf, 1 << 20));
         }, none},
        {"cuMemsetD8 (sync)", none, [&] { CK(cuMemsetD8((CUdeviceptr)buf, 0, 1 << 20)); }, none},
        {"cuModuleLoadData", none, load, unload},
        {"cuModuleGetFunction (just loaded)", load, get, unload},
        {"first cuLaunchKernel of it (other stream)", [&] { load(); get(); }, [&] {
             CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, (CUstream)other, nullptr, nullptr));
         }, [&] { CK(cuStreamSynchronize((CUstream)other)); unload(); }},
        {"cuModuleUnload", load, unload, none},
        {"cuModuleLoadData (PTX to compile)", none, [&] {
             std::string ptx = fresh_ptx();
             CK(cuModuleLoadData(&mod, ptx.c_str()));
         }, unload},
        {"cuLinkComplete (PTX to compile)", none, compile, none},
        {"cuModuleLoadData (a cubin)", compile, [&] { CK(cuModuleLoadData(&mod, cubin.data())); },
         unload},
        {"cuLibraryLoadData", none, load_library, unload_library},
        {"cuLibraryGetKernel + cuKernelGetFunction", load_library, get_kernel, unload_library},
        {"cuLibraryUnload (a function got)", [&] { load_library(); get_kernel(); },
         unload_library, none},
        {"cuModuleUnload (a function launched)", [&] {
             load(); get();
             CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, (CUstream)other, nullptr, nullptr));
             CK(cuStreamSynchronize((CUstream)other));
         }, unload, none},
        {"cuMemHostAlloc 1 MiB", none, [&] { CK(cuMemHostAlloc(&hptr, 1 << 20, 0)); },
         [&] { CK(cuMemFreeHost(hptr)); }},
        {"cuMemFreeHost 1 MiB", [&] { CK(cuMemHostAlloc(&hptr, 1 << 20, 0)); },
         [&] { CK(cuMemFreeHost(hptr)); }, none},
        {"cuMemHostRegister 1 MiB", aligned, [&] { CK(cuMemHostRegister(hptr, 1 << 20, 0)); },
         [&] { CK(cuMemHostUnregister(hptr)); free(hptr); }},
        {"cuMemHostUnregister 1 MiB", [&] { aligned(); CK(cuMemHostRegister(hptr, 1 << 20, 0)); },
         [&] { CK(cuMemHostUnregister(hptr)); }, [&] { free(hptr); }},
        {"cuGraphInstantiate (one kernel)", capture, instantiate, drop_graph},
        {"cuGraphExecDestroy + cuGraphDestroy", [&] { capture(); instantiate(); }, drop_graph,
         none},
        {"cuStreamCreate + Destroy", none, [] {
             CUstream s;
             CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
             CK(cuStreamDestroy(s));
         }, none},
        {"cuEventCreate + Destroy", none, [] {
             CUevent e;
             CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
             CK(cuEventDestroy(e));
         }, none},
        {"cuMemGetInfo", none, [] {
             size_t f, t;
             CK(cuMemGetInfo(&f, &t));
         }, none},
        {"cuCtxSynchronize", none, [] { CK(cuCtxSynchronize()); }, none},
    };
    // The gate's word: as the probe first ran it, closed is 1 and the stream waits for 0;
    // with `hold`, as gpushared has it since: OPEN and HELD bits, the stream waiting for
    // either, the calling thread setting HELD around its call.
    const unsigned OPEN = 1, HELD = 2;
    auto close_gate = [&] { *gate = hold ? 0u : 1u; };
    auto open_gate = [&] {
        if (hold)
            __atomic_fetch_or((unsigned *)gate, OPEN, __ATOMIC_SEQ_CST);
        else
            *gate = 0u;
    };
    auto wait_gate = [&] {
        if (hold)
            CK(cuStreamWaitValue32((CUstream)bs, dgate, OPEN | HELD, CU_STREAM_WAIT_VALUE_AND));
        else
            CK(cuStreamWaitValue32((CUstream)bs, dgate, 0, CU_STREAM_WAIT_VALUE_EQ));
    };
    printf("%s\n", hold ? "with the hold (HELD set around each call)" : "without a hold");
    printf("%-48s | returned at ms, while closed? | HP launch call ms | HP done at ms, while "
           "closed?\n",
           "call (gate closed from 0 to 20 ms; HP at 1 ms)");
    for (auto &c : calls) {
        c.pre();
        RT(cudaDeviceSynchronize());
        close_gate();
        std::atomic_thread_fence(std::memory_order_seq_cst);
        wait_gate();
        noop<<<1, 32, 0, bs>>>(buf + 64);
        auto t0 = Clock::now();
        std::atomic<double> returned{-1};
        std::thread t([&] {
            CK(cuCtxSetCurrent(ctx));
            if (hold)
                __atomic_fetch_or((unsigned *)gate, HELD, __ATOMIC_SEQ_CST);
            c.run();
            if (hold)
                __atomic_fetch_and((unsigned *)gate, ~HELD, __ATOMIC_SEQ_CST);
            returned = ms_since(t0);
        });
        // The gate opens at 20 ms whatever the other threads are stuck in.
        std::thread opener([&] {
            while (ms_since(t0) < 20.0) {
            }
            open_gate();
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
        c.post();
        RT(cudaDeviceSynchronize());
        printf("%-48s | %8.3f %-17s | %17.3f | %8.3f %s\n", c.name, ret,
               ret < 20.0 ? "yes" : "no (waited)", launch, hp_done,
               hp_done >= 0 && hp_done < 20.0 ? "yes" : "no (held)");
    }
    return 0;
}
