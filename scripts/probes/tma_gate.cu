// What a kernel that reads through TMA costs on the GPU, timed as XLA's autotuner times it (a
// delay kernel holds the stream until everything is queued; see timer_gate.c), beside the same
// copy done with plain loads and a 128-byte parameter of the same alignment. Each kernel is
// launched three ways: an array of parameter pointers, one packed buffer (`extra`, the form
// gpushare's device worker uses), and cuLaunchKernelEx allowing programmatic serialization (as
// XLA launches its Triton kernels); on memory from cuMemAlloc and from the virtual memory API
// (as XLA allocates). Checks each kernel's output once, then prints the median elapsed time
// (µs) of 2,000 timings for each. Build on the GPU machine:
// nvcc -O2 -arch=sm_90a -o tma_gate tma_gate.cu -lcuda; run it directly and under
// `gpushare run`.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gate.cuh"
#include "timing.h"

enum { TILE = 32, BLOCKS = 4, THREADS = 128, N = 2000 };

struct alignas(64) Big {
    unsigned char bytes[128];
};

// One 32 x 32 tile a block, brought into shared memory by the TMA unit.
__global__ void tma_copy(const __grid_constant__ CUtensorMap tm, float *out) {
    __shared__ alignas(128) float tile[TILE * TILE];
    __shared__ alignas(8) uint64_t bar;
    uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar);
    uint32_t s = (uint32_t)__cvta_generic_to_shared(tile);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
        asm volatile("fence.proxy.async.shared::cta;");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b),
                     "r"(TILE * TILE * 4));
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];" ::"r"(s),
                     "l"(&tm), "r"(0), "r"((int)blockIdx.x * TILE), "r"(b)
                     : "memory");
    }
    asm volatile("{\n .reg .pred p;\n W%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
                 " @!p bra W%=;\n}" ::"r"(b)
                 : "memory");
    for (int i = threadIdx.x; i < TILE * TILE; i += blockDim.x)
        out[blockIdx.x * TILE * TILE + i] = tile[i];
}

// The same copy with plain loads, and a parameter as large and as aligned as a tensor map.
__global__ void plain_copy(const __grid_constant__ Big big, const float *in, float *out) {
    __shared__ float tile[TILE * TILE];
    for (int i = threadIdx.x; i < TILE * TILE; i += blockDim.x)
        tile[i] = in[blockIdx.x * TILE * TILE + i] + (float)big.bytes[i & 127] * 0.0f;
    __syncthreads();
    for (int i = threadIdx.x; i < TILE * TILE; i += blockDim.x)
        out[blockIdx.x * TILE * TILE + i] = tile[i];
}

static double t[N];

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, by_value);
    return v[n / 2];
}

// The kernel's parameters packed as its layout says (cuFuncGetParamInfo).
static size_t pack(CUfunction f, void **args, int count, unsigned char *buf) {
    size_t end = 0;
    for (int i = 0; i < count; i++) {
        size_t off, size;
        CK(cuFuncGetParamInfo(f, i, &off, &size));
        memcpy(buf + off, args[i], size);
        if (off + size > end)
            end = off + size;
    }
    return end;
}

// `bytes` of device memory made and mapped through the virtual memory API, as XLA allocates.
static CUdeviceptr vmm_alloc(size_t bytes) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t size = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, size, &prop, 0));
    CUdeviceptr p;
    CK(cuMemAddressReserve(&p, size, 0, 0, 0));
    CK(cuMemMap(p, size, 0, h, 0));
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(p, size, &access, 1));
    return p;
}

// One launch of `f` in the given form: 0 an array of parameter pointers, 1 one packed buffer,
// 2 an array through cuLaunchKernelEx allowing programmatic serialization (as XLA launches).
static void launch(CUfunction f, int form, void **args, void **extra, CUstream s) {
    if (form < 2) {
        CK(cuLaunchKernel(f, BLOCKS, 1, 1, THREADS, 1, 1, 0, s, form ? NULL : args,
                          form ? extra : NULL));
        return;
    }
    CUlaunchAttribute a;
    memset(&a, 0, sizeof a);
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    a.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = BLOCKS;
    c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = THREADS;
    c.blockDimY = c.blockDimZ = 1;
    c.hStream = s;
    c.attrs = &a;
    c.numAttrs = 1;
    CK(cuLaunchKernelEx(&c, f, args, NULL));
}

int main(void) {
    CK(cuInit(0));
    cudaFree(0); // the runtime's primary context, current on this thread
    CUfunction fdelay = function_of((const void *)delay);
    CUfunction ftma = function_of((const void *)tma_copy);
    CUfunction fplain = function_of((const void *)plain_copy);
    CUstream s;
    CUevent start, stop;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    volatile unsigned *word;
    CK(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dword;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    unsigned long long limit = 50000000; // the delay kernel gives up after 50 ms
    void *delay_args[] = {&dword, &limit};
    static const char *forms[] = {"pointer array", "packed buffer", "Ex + PDL"};

    const size_t elems = (size_t)BLOCKS * TILE * TILE;
    float *host = (float *)malloc(elems * 4), *back = (float *)malloc(elems * 4);
    for (size_t i = 0; i < elems; i++)
        host[i] = (float)i;
    Big big;
    memset(&big, 1, sizeof big);
    for (int vmm = 0; vmm < 2; vmm++) {
        CUdeviceptr in, out;
        if (vmm) {
            in = vmm_alloc(elems * 4);
            out = vmm_alloc(elems * 4);
        } else {
            CK(cuMemAlloc(&in, elems * 4));
            CK(cuMemAlloc(&out, elems * 4));
        }
        CK(cuMemcpyHtoD(in, host, elems * 4));
        CUtensorMap tm;
        cuuint64_t dims[2] = {TILE, (cuuint64_t)BLOCKS * TILE};
        cuuint64_t strides[1] = {TILE * 4};
        cuuint32_t box[2] = {TILE, TILE}, estr[2] = {1, 1};
        CK(cuTensorMapEncodeTiled(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)in, dims,
                                  strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
        void *tma_args[] = {&tm, &out};
        void *plain_args[] = {&big, &in, &out};
        struct {
            const char *name;
            CUfunction f;
            void **args;
            int count;
        } kernels[] = {{"tma", ftma, tma_args, 2}, {"plain", fplain, plain_args, 3}};
        const char *memory = vmm ? "cuMemCreate" : "cuMemAlloc";
        for (int k = 0; k < 2; k++) {
            CK(cuMemsetD8(out, 0, elems * 4));
            launch(kernels[k].f, 0, kernels[k].args, NULL, s);
            CK(cuStreamSynchronize(s));
            CK(cuMemcpyDtoH(back, out, elems * 4));
            printf("%s, %s: output %s\n", memory, kernels[k].name,
                   memcmp(back, host, elems * 4) == 0 ? "equal to input" : "WRONG");
        }
        for (int k = 0; k < 2; k++) {
            for (int form = 0; form < 3; form++) {
                unsigned char buf[512];
                size_t size = pack(kernels[k].f, kernels[k].args, kernels[k].count, buf);
                void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE,
                                 &size, CU_LAUNCH_PARAM_END};
                int timed_out = 0;
                for (int i = 0; i < N + 200; i++) {
                    *word = 0;
                    CK(cuLaunchKernel(fdelay, 1, 1, 1, 1, 1, 1, 0, s, delay_args, NULL));
                    CK(cuEventRecord(start, s));
                    launch(kernels[k].f, form, kernels[k].args, extra, s);
                    CK(cuEventRecord(stop, s));
                    __sync_synchronize();
                    if (*word == 2)
                        timed_out++;
                    *word = 1;
                    CK(cuEventSynchronize(stop));
                    float ms;
                    CK(cuEventElapsedTime(&ms, start, stop));
                    if (i >= 200)
                        t[i - 200] = ms * 1000.0;
                }
                printf("%s, %s, %s: median %.2f us (timed out %d)\n", memory, kernels[k].name,
                       forms[form], median(t, N), timed_out);
            }
        }
    }
    return 0;
}
