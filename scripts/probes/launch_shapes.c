/* What NVIDIA's driver answers to launch shapes and names no GPU runs, so that gpushare's
 * driver and sim device answer the same (client-lib/protocol/src/command/launch.rs,
 * shape_is_valid; tests/c/cuda_standin.c, run_spin).
 *
 * Build and run on the GPU machine:
 *   cc -O2 -o launch_shapes launch_shapes.c -ldl && ./launch_shapes
 * Prints one JSON line per case: {"case", "result"} (the CUresult, by number). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

static const char PTX[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
                          ".visible .entry nothing()\n{\n\tret;\n}\n";

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "no %s\n", name);
        exit(2);
    }
    return p;
}

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return 2;
    CUresult (*cuInit)(unsigned) = sym(lib, "cuInit");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym(lib, "cuCtxSetCurrent");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym(lib, "cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        sym(lib, "cuModuleGetFunction");
    CUresult (*cuCtxSynchronize)(void) = sym(lib, "cuCtxSynchronize");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = sym(lib, "cuLaunchKernel");
    CUcontext ctx;
    CUmodule m;
    CUfunction f, none = NULL;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&m, PTX) || cuModuleGetFunction(&f, m, "nothing"))
        return 3;
    printf("{\"case\": \"cuModuleGetFunction unknown name\", \"result\": %d}\n",
           cuModuleGetFunction(&none, m, "nope"));
    static const struct {
        const char *name;
        unsigned g[3], b[3], shared;
    } cases[] = {
        {"fits", {1, 1, 1}, {32, 1, 1}, 0},
        {"largest grid", {2147483647u, 1, 1}, {1, 1, 1}, 0},
        {"grid x 2^31", {2147483648u, 1, 1}, {1, 1, 1}, 0},
        {"grid y 65536", {1, 65536, 1}, {1, 1, 1}, 0},
        {"grid z 65536", {1, 1, 65536}, {1, 1, 1}, 0},
        {"grid x 0", {0, 1, 1}, {32, 1, 1}, 0},
        {"block 1024", {1, 1, 1}, {1024, 1, 1}, 0},
        {"block x 1025", {1, 1, 1}, {1025, 1, 1}, 0},
        {"block z 64", {1, 1, 1}, {1, 1, 64}, 0},
        {"block z 65", {1, 1, 1}, {1, 1, 65}, 0},
        {"block 32x32x2", {1, 1, 1}, {32, 32, 2}, 0},
        {"block y 0", {1, 1, 1}, {1, 0, 1}, 0},
        {"shared 48 KiB", {1, 1, 1}, {32, 1, 1}, 49152},
        {"shared 48 KiB + 1", {1, 1, 1}, {32, 1, 1}, 49153},
        {"shared opt-in max 232448", {1, 1, 1}, {32, 1, 1}, 232448},
        {"shared 232449", {1, 1, 1}, {32, 1, 1}, 232449},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CUresult r = launch(f, cases[i].g[0], cases[i].g[1], cases[i].g[2], cases[i].b[0],
                            cases[i].b[1], cases[i].b[2], cases[i].shared, NULL, NULL, NULL);
        printf("{\"case\": \"%s\", \"result\": %d, \"sync\": %d}\n", cases[i].name, r,
               cuCtxSynchronize());
    }
    return 0;
}
