// Why some of XLA's autotuning candidates time 2.5-3.5 µs longer through gpushare (runs
// M1a-M1c: TMA candidates and one cuBLASLt GEMM with its epilogue; a small TMA kernel in
// tma_gate.cu timed alike). What those share is large dynamic shared memory, clusters and
// programmatic dependent launch between kernels, so this probe times each of them alone (and
// what else may come between a timer's start and its kernel), the way XLA's GPU timer does (a delay kernel holds the stream until everything is queued; see
// timer_gate.c). Kernels cover every SM (one block each), 128 threads, and write 4 bytes a
// thread:
//   smem S KiB        one kernel asking S KiB of dynamic shared memory (0.5, 100, 200);
//   cluster 2         the 200 KiB kernel in clusters of 2 (cuLaunchKernelEx);
//   pair              two 200 KiB kernels back to back;
//   pair PDL          the same, the second launched with programmatic stream serialization
//                     and waiting (griddepcontrol.wait) for the first, which lets its
//                     dependants launch (griddepcontrol.launch_dependents) as it starts;
//   ... after L1      the 200 KiB kernel right after a kernel that prefers L1 (the delay
//                     kernel's carveout set to 0 %), against 100 % shared;
//   H2D pageable ...  a 128-byte asynchronous copy before the kernel, as a framework copies a
//                     kernel's small arguments (a TMA descriptor, scalars) to the device: from
//                     pageable memory, from page-locked memory, a memset, a device-to-device
//                     copy;
//   pause + kernel    the host busy for 1 ms between the start's record and the launch;
//   encode + kernel   a tensor map encoded there, a new one each time (XLA encodes its TMA
//                     kernels' maps before each launch; through gpushare a new map is asked of
//                     gpushared);
//   2 records + kernel two more timed events recorded between the start and the launch;
//   2 untimed + kernel the same with events made with CU_EVENT_DISABLE_TIMING;
//   waited + kernel   an untimed event recorded there that another stream waits for before
//                     recording a timed one;
//   waited, 2 timed   one untimed event waited for, with two timed events behind the wait;
//   waited + other    one untimed event waited for, one timed event behind the wait, and one
//                     timed event on a third stream that waits for nothing (how gpushared
//                     ends one span of a client's device time and starts the next);
//   write + kernel    a cuStreamWriteValue32 into page-locked host memory there (last: not
//                     in gpushare's driver).
// Prints the median of N timings (µs) each. Build on the GPU machine:
// nvcc -O2 -arch=sm_90a -o candidate_gate candidate_gate.cu -lcuda; run it directly and under
// `gpushare run`.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gate.cuh"
#include "timing.h"

enum { THREADS = 128, N = 1000, WARM = 100, KIB = 1024, SMALL = 128 };

// Touches its dynamic shared memory (so the block holds it) and writes one value a thread.
__device__ void body(float *out) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}

__global__ void plain(float *out) { body(out); }

// First of a PDL pair: lets its dependants launch as soon as every block has started.
__global__ void first(float *out) {
    asm volatile("griddepcontrol.launch_dependents;");
    body(out);
}

// Second of a PDL pair: waits for the first's memory before writing.
__global__ void second(float *out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    body(out);
}

static int blocks;
static CUstream s;

static void launch(CUfunction f, unsigned smem, int cluster, int pdl, CUdeviceptr *out) {
    void *args[] = {out};
    CUlaunchAttribute a[2];
    memset(a, 0, sizeof a);
    int n = 0;
    if (cluster > 1) {
        a[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        a[n].value.clusterDim.x = cluster;
        a[n].value.clusterDim.y = a[n].value.clusterDim.z = 1;
        n++;
    }
    if (pdl) {
        a[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        a[n].value.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (n == 0) {
        CK(cuLaunchKernel(f, blocks, 1, 1, THREADS, 1, 1, smem, s, args, NULL));
        return;
    }
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = blocks;
    c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = THREADS;
    c.blockDimY = c.blockDimZ = 1;
    c.sharedMemBytes = smem;
    c.hStream = s;
    c.attrs = a;
    c.numAttrs = n;
    CK(cuLaunchKernelEx(&c, f, args, NULL));
}

static double t[N];
static unsigned long long serial;

int main(void) {
    CK(cuInit(0));
    cudaFree(0); // the runtime's primary context, current on this thread
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    CK(cuDeviceGetAttribute(&blocks, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    blocks &= ~1; // whole clusters of 2
    CUfunction fdelay = function_of((const void *)delay);
    CUfunction fplain = function_of((const void *)plain);
    CUfunction ffirst = function_of((const void *)first);
    CUfunction fsecond = function_of((const void *)second);
    CUfunction all[] = {fplain, ffirst, fsecond};
    for (int i = 0; i < 3; i++) {
        CK(cuFuncSetAttribute(all[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200 * KIB));
        CK(cuFuncSetAttribute(all[i], CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
    }
    CUevent start, stop;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUstream clock, other;
    CK(cuStreamCreate(&clock, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    CUevent extra[2];
    CK(cuEventCreate(&extra[0], CU_EVENT_DEFAULT));
    CK(cuEventCreate(&extra[1], CU_EVENT_DEFAULT));
    CUevent untimed[2];
    CK(cuEventCreate(&untimed[0], CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&untimed[1], CU_EVENT_DISABLE_TIMING));
    volatile unsigned *word;
    CK(cuMemHostAlloc((void **)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dword, out;
    CK(cuMemHostGetDevicePointer(&dword, (void *)word, 0));
    CK(cuMemAlloc(&out, (size_t)blocks * THREADS * 4));
    CUdeviceptr small;
    CK(cuMemAlloc(&small, 2 * SMALL));
    void *pinned;
    CK(cuMemHostAlloc(&pinned, SMALL, 0));
    unsigned char *pageable = (unsigned char *)malloc(SMALL);
    memset(pageable, 3, SMALL);
    memset(pinned, 3, SMALL);
    unsigned long long limit = 50000000; // the delay kernel gives up after 50 ms
    void *delay_args[] = {&dword, &limit};

    struct {
        const char *name;
        unsigned smem;
        int cluster, pair, pdl, carveout, prelude;
    } cases[] = {
        {"smem 0.5 KiB", THREADS * 4, 1, 0, 0, -1, 0},
        {"smem 100 KiB", 100 * KIB, 1, 0, 0, -1, 0},
        {"smem 200 KiB", 200 * KIB, 1, 0, 0, -1, 0},
        {"cluster 2, 200 KiB", 200 * KIB, 2, 0, 0, -1, 0},
        {"pair, 200 KiB", 200 * KIB, 1, 1, 0, -1, 0},
        {"pair PDL, 200 KiB", 200 * KIB, 1, 1, 1, -1, 0},
        {"200 KiB after L1", 200 * KIB, 1, 0, 0, 0, 0},
        {"200 KiB after shared", 200 * KIB, 1, 0, 0, 100, 0},
        {"H2D pageable + kernel", THREADS * 4, 1, 0, 0, -1, 1},
        {"H2D pinned + kernel", THREADS * 4, 1, 0, 0, -1, 2},
        {"memset + kernel", THREADS * 4, 1, 0, 0, -1, 3},
        {"D2D + kernel", THREADS * 4, 1, 0, 0, -1, 4},
        {"pause + kernel", THREADS * 4, 1, 0, 0, -1, 5},
        {"2 records + kernel", THREADS * 4, 1, 0, 0, -1, 6},
        {"encode + kernel", THREADS * 4, 1, 0, 0, -1, 7},
        {"2 untimed + kernel", THREADS * 4, 1, 0, 0, -1, 8},
        {"waited + kernel", THREADS * 4, 1, 0, 0, -1, 10},
        {"2 waited + kernel", THREADS * 4, 1, 0, 0, -1, 11},
        {"waited, 2 timed", THREADS * 4, 1, 0, 0, -1, 12},
        {"waited + other", THREADS * 4, 1, 0, 0, -1, 13},
        {"write + kernel", THREADS * 4, 1, 0, 0, -1, 9},
    };
    const int ncases = sizeof cases / sizeof cases[0];
    for (int c = 0; c < ncases; c++) {
        CUresult r = cuFuncSetAttribute(fdelay, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                        cases[c].carveout);
        if (r != CUDA_SUCCESS)
            printf("(the delay kernel's carveout %d refused: %d)\n", cases[c].carveout, (int)r);
        int timed_out = 0;
        for (int i = 0; i < N + WARM; i++) {
            *word = 0;
            CK(cuLaunchKernel(fdelay, 1, 1, 1, 1, 1, 1, 0, s, delay_args, NULL));
            CK(cuEventRecord(start, s));
            switch (cases[c].prelude) {
            case 1: CK(cuMemcpyHtoDAsync(small, pageable, SMALL, s)); break;
            case 2: CK(cuMemcpyHtoDAsync(small, pinned, SMALL, s)); break;
            case 3: CK(cuMemsetD8Async(small, 7, SMALL, s)); break;
            case 4: CK(cuMemcpyDtoDAsync(small, small + SMALL, SMALL, s)); break;
            case 5: for (double a = now_us(); now_us() - a < 1000;) {} break;
            case 7: {
                CUtensorMap tm;
                cuuint64_t dims[2] = {32, 4 + (cuuint64_t)(serial++ % 1000000)};
                cuuint64_t strides[1] = {32 * 4};
                cuuint32_t box[2] = {32, 4}, estr[2] = {1, 1};
                CK(cuTensorMapEncodeTiled(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)out,
                                          dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                          CU_TENSOR_MAP_SWIZZLE_NONE,
                                          CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
                break;
            }
            case 6: CK(cuEventRecord(extra[0], s)); CK(cuEventRecord(extra[1], s)); break;
            case 8: CK(cuEventRecord(untimed[0], s)); CK(cuEventRecord(untimed[1], s)); break;
            case 9: CK(cuStreamWriteValue32(s, dword + 64, (cuuint32_t)i, 0)); break;
            case 12:
            case 13:
                CK(cuEventRecord(untimed[0], s));
                CK(cuStreamWaitEvent(clock, untimed[0], 0));
                CK(cuEventRecord(extra[0], clock));
                CK(cuEventRecord(extra[1], cases[c].prelude == 12 ? clock : other));
                break;
            case 11:
                CK(cuEventRecord(untimed[1], s));
                CK(cuStreamWaitEvent(clock, untimed[1], 0));
                CK(cuEventRecord(extra[1], clock));
                /* fall through */
            case 10:
                CK(cuEventRecord(untimed[0], s));
                CK(cuStreamWaitEvent(clock, untimed[0], 0));
                CK(cuEventRecord(extra[0], clock));
                break;
            }
            if (cases[c].pair) {
                launch(ffirst, cases[c].smem, 1, 0, &out);
                launch(fsecond, cases[c].smem, 1, cases[c].pdl, &out);
            } else {
                launch(fplain, cases[c].smem, cases[c].cluster, 0, &out);
            }
            CK(cuEventRecord(stop, s));
            __sync_synchronize();
            if (*word == 2)
                timed_out++;
            *word = 1;
            CK(cuEventSynchronize(stop));
            float ms;
            CK(cuEventElapsedTime(&ms, start, stop));
            if (i >= WARM)
                t[i - WARM] = ms * 1000.0;
        }
        qsort(t, N, sizeof t[0], by_value);
        printf("%-22s median %6.2f us  p10 %6.2f  p90 %6.2f  (timed out %d)\n", cases[c].name,
               t[N / 2], t[N / 10], t[N * 9 / 10], timed_out);
    }
    return 0;
}
