/* Which SMs a program's kernels run on, launched one by one and as a captured CUDA graph:
 * run under `gpushare run` as a best-effort program beside a high-priority client with
 * `[priority] lower_sm_share`, both must stay on the SM partition (docs/consolidated.md,
 * "CUDA graphs"); run alone, both spread over the GPU.
 *
 * Build and run on the GPU machine:
 *   cc -O2 -o sm_ids sm_ids.c -ldl && ./sm_ids [BLOCKS] [SPIN_CYCLES]
 *   ./sm_ids hold SECONDS   (a client that only stays connected: the high-priority one)
 * Prints one JSON line per way of launching: {"launch", "blocks", "sms", "max_smid"}, where
 * sms is how many distinct SMs the blocks ran on. Each block spins SPIN_CYCLES (default
 * 200000) so that blocks spread over every SM they may use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe.h"

typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphExec;

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry smid(.param .u64 out, .param .u64 spin)\n{\n"
    "\t.reg .pred %p;\n\t.reg .b32 %r<3>;\n\t.reg .b64 %rd<9>;\n"
    "\tld.param.u64 %rd1, [out];\n\tld.param.u64 %rd2, [spin];\n"
    "\tmov.u32 %r1, %smid;\n\tmov.u32 %r2, %ctaid.x;\n\tmov.u64 %rd3, %clock64;\n"
    "LOOP:\n\tmov.u64 %rd4, %clock64;\n\tsub.u64 %rd5, %rd4, %rd3;\n"
    "\tsetp.lt.u64 %p, %rd5, %rd2;\n\t@%p bra LOOP;\n"
    "\tcvta.to.global.u64 %rd6, %rd1;\n\tmul.wide.u32 %rd7, %r2, 4;\n"
    "\tadd.s64 %rd8, %rd6, %rd7;\n\tst.global.u32 [%rd8], %r1;\n\tret;\n}\n";

static void report(const char *how, const unsigned *ids, unsigned blocks) {
    static unsigned char seen[4096];
    memset(seen, 0, sizeof seen);
    unsigned distinct = 0, max = 0;
    for (unsigned i = 0; i < blocks; i++) {
        unsigned id = ids[i] < sizeof seen ? ids[i] : sizeof seen - 1;
        distinct += !seen[id];
        seen[id] = 1;
        if (ids[i] > max) max = ids[i];
    }
    printf("{\"launch\": \"%s\", \"blocks\": %u, \"sms\": %u, \"max_smid\": %u}\n", how, blocks,
           distinct, max);
    fflush(stdout);
}

#include <unistd.h>

int main(int argc, char **argv) {
    int hold = argc > 2 && !strcmp(argv[1], "hold");
    unsigned blocks = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 0) : 1056;
    unsigned long long spin = argc > 2 ? strtoull(argv[2], NULL, 0) : 200000;
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 2;
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym("cuModuleGetFunction");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t) = sym("cuMemsetD8_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym("cuStreamCreate");
    CUresult (*cuStreamSynchronize)(CUstream) = sym("cuStreamSynchronize");
    CUresult (*cuStreamBeginCapture)(CUstream, int) = sym("cuStreamBeginCapture_v2");
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *) = sym("cuStreamEndCapture");
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long) =
        sym("cuGraphInstantiateWithFlags");
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = sym("cuGraphLaunch");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = sym("cuLaunchKernel");
    CUcontext ctx;
    CUmodule m;
    CUfunction f;
    CUstream s;
    CUdeviceptr out;
    CALL(cuInit(0));
    CALL(cuDevicePrimaryCtxRetain(&ctx, 0));
    CALL(cuCtxSetCurrent(ctx));
    if (hold) {
        printf("{\"holding\": %s}\n", argv[2]);
        fflush(stdout);
        sleep((unsigned)strtoul(argv[2], NULL, 0));
        return 0;
    }
    CALL(cuModuleLoadData(&m, PTX));
    CALL(cuModuleGetFunction(&f, m, "smid"));
    CALL(cuStreamCreate(&s, 1));
    CALL(cuMemAlloc(&out, (size_t)blocks * 4));
    unsigned *ids = calloc(blocks, 4);
    if (!ids) return 4;
    void *params[] = {&out, &spin};

    CALL(cuMemsetD8(out, 0xff, (size_t)blocks * 4));
    CALL(launch(f, blocks, 1, 1, 1, 1, 1, 0, s, params, NULL));
    CALL(cuStreamSynchronize(s));
    CALL(cuMemcpyDtoH(ids, out, (size_t)blocks * 4));
    report("kernel", ids, blocks);

    CUgraph g;
    CUgraphExec e;
    CALL(cuStreamBeginCapture(s, 0));
    CALL(launch(f, blocks, 1, 1, 1, 1, 1, 0, s, params, NULL));
    CALL(cuStreamEndCapture(s, &g));
    CALL(cuGraphInstantiate(&e, g, 0));
    CALL(cuMemsetD8(out, 0xff, (size_t)blocks * 4));
    CALL(cuGraphLaunch(e, s));
    CALL(cuStreamSynchronize(s));
    CALL(cuMemcpyDtoH(ids, out, (size_t)blocks * 4));
    report("graph", ids, blocks);
    return 0;
}
