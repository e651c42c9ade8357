/* What updating an instantiated graph's kernel nodes costs before each launch, as XLA's
 * command buffers do every step (JAX gives every kernel node new buffer addresses): a graph of
 * 12 one-thread kernels captured once, then per iteration K nodes' parameters set
 * (cuGraphExecKernelNodeSetParams), the graph launched and the stream synchronized. Run
 * directly and under `gpushare run`; the difference between K = 11 and K = 0 is the update's.
 *
 * With `packed`, the new parameters are given as one packed buffer (`extra`,
 * CU_LAUNCH_PARAM_BUFFER_POINTER), as gpushare's device worker gives them, instead of an array
 * of pointers (`kernelParams`).
 *
 * Build and run on the GPU machine:
 *   cc -O2 -o graph_update graph_update.c -ldl && ./graph_update [ITERATIONS] [packed]
 * Prints one JSON line per K: {"updates", "packed", "median_us", "p90_us", "correct"}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe.h"
#include "timing.h"

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec, *CUgraphNode;

typedef struct {
    CUfunction func;
    unsigned grid[3], block[3], shared;
    void **params, **extra;
    void *kern;
    CUcontext ctx;
} KernelNodeParams; /* CUDA_KERNEL_NODE_PARAMS_v2 */

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry put(.param .u64 out, .param .u32 v)\n{\n"
    "\t.reg .b32 %r<2>;\n\t.reg .b64 %rd<3>;\n"
    "\tld.param.u64 %rd1, [out];\n\tld.param.u32 %r1, [v];\n"
    "\tcvta.to.global.u64 %rd2, %rd1;\n\tst.global.u32 [%rd2], %r1;\n\tret;\n}\n";

enum { NODES = 12 };

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 2000;
    int packed = argc > 2 && strcmp(argv[2], "packed") == 0;
    if (iterations < 10) iterations = 10;
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDeviceGet)(int *, int) = sym("cuDeviceGet");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym("cuModuleGetFunction");
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym("cuStreamCreate");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **) =
        sym("cuLaunchKernel");
    CUresult (*cuStreamBeginCapture)(CUstream, int) = sym("cuStreamBeginCapture_v2");
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *) = sym("cuStreamEndCapture");
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long) =
        sym("cuGraphInstantiateWithFlags");
    CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *) = sym("cuGraphGetNodes");
    CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec, CUgraphNode,
                                               const KernelNodeParams *) =
        sym("cuGraphExecKernelNodeSetParams_v2");
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = sym("cuGraphLaunch");
    CUresult (*cuStreamSynchronize)(CUstream) = sym("cuStreamSynchronize");

    int dev = 0;
    CUcontext ctx = NULL;
    CUmodule module = NULL;
    CUfunction put = NULL;
    CUstream s = NULL;
    CUdeviceptr buf = 0;
    CALL(cuInit(0));
    CALL(cuDeviceGet(&dev, 0));
    CALL(cuDevicePrimaryCtxRetain(&ctx, dev));
    CALL(cuCtxSetCurrent(ctx));
    CALL(cuModuleLoadData(&module, PTX));
    CALL(cuModuleGetFunction(&put, module, "put"));
    CALL(cuStreamCreate(&s, 1));
    CALL(cuMemAlloc(&buf, 2 * NODES * sizeof(unsigned)));

    /* Node i writes i into word i. */
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    CALL(cuStreamBeginCapture(s, 0));
    for (unsigned i = 0; i < NODES; i++) {
        CUdeviceptr at = buf + i * sizeof(unsigned);
        void *args[] = {&at, &i};
        CALL(cuLaunchKernel(put, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
    }
    CALL(cuStreamEndCapture(s, &g));
    CALL(cuGraphInstantiate(&x, g, 0));
    CUgraphNode nodes[NODES];
    size_t count = NODES;
    CALL(cuGraphGetNodes(g, nodes, &count));
    if (count != NODES) {
        fprintf(stderr, "the graph has %zu nodes\n", count);
        return 3;
    }

    double *times = malloc(sizeof(double) * (size_t)iterations);
    int updates[] = {0, NODES - 1};
    for (int u = 0; u < 2; u++) {
        int k = updates[u];
        unsigned value = 0;
        for (int it = -100; it < iterations; it++) {
            double t = now_us();
            /* Each updated node writes into the other half of the buffer, alternating. */
            for (int i = 0; i < k; i++) {
                CUdeviceptr at = buf + ((it & 1 ? NODES : 0) + i) * sizeof(unsigned);
                value = (unsigned)(it + 1000 * i);
                void *args[] = {&at, &value};
                /* The same two parameters packed: the pointer, then the value, aligned. */
                struct {
                    CUdeviceptr at;
                    unsigned value;
                } buffer = {at, value};
                size_t size = sizeof(CUdeviceptr) + sizeof(unsigned);
                void *extra[] = {(void *)1, &buffer, (void *)2, &size, (void *)0};
                KernelNodeParams p = {put,  {1, 1, 1}, {1, 1, 1}, 0, packed ? NULL : args,
                                      packed ? extra : NULL, NULL, NULL};
                CALL(cuGraphExecKernelNodeSetParams(x, nodes[i], &p));
            }
            CALL(cuGraphLaunch(x, s));
            CALL(cuStreamSynchronize(s));
            if (it >= 0) times[it] = now_us() - t;
        }
        /* The last iteration's updated nodes wrote their values where it said. */
        unsigned got[2 * NODES];
        CALL(cuMemcpyDtoH(got, buf, sizeof got));
        int last = iterations - 1, correct = 1;
        for (int i = 0; i < k; i++)
            correct &= got[(last & 1 ? NODES : 0) + i] == (unsigned)(last + 1000 * i);
        qsort(times, (size_t)iterations, sizeof(double), by_value);
        printf("{\"updates\": %d, \"packed\": %s, \"median_us\": %.2f, \"p90_us\": %.2f, "
               "\"correct\": %s}\n",
               k, packed ? "true" : "false", times[iterations / 2], times[iterations * 9 / 10],
               correct ? "true" : "false");
    }
    free(times);
    return 0;
}
