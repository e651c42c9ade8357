/* Where do a module's globals land in a context that takes over after a fault?
 *
 * gpushare's spare worker makes every module a client loaded, in the order it was loaded, so
 * that taking over loads none; a client that looked up a module global keeps its state only if
 * the global is at the same address there (docs/reliability.md, "Module globals that move":
 * on the H200 cuBLAS's deviceConstants moved by 0x32000000). This probe runs the same module
 * loads in two fresh processes, the first with a history like a serving worker's (a big
 * address reservation, streams, events, a kernel that needs much local memory) and the second
 * like a spare's, and prints where the global landed in each, with and without address
 * randomisation and with the stack limit set up front, so that the cause can be told.
 *
 * Build and run on the GPU machine:
 *   cc -O2 -o module_globals module_globals.c -ldl && ./module_globals
 * Prints one JSON line per case: {"case", "active", "spare", "same"}. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;

#define CHECK(call) do { CUresult r_ = (call); if (r_) { fprintf(stderr, "%s -> %d\n", #call, r_); exit(1); } } while (0)

/* A module with a global, and a kernel that needs 16 KiB of local memory per thread. */
static const char PTX[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .global .align 4 .b8 table[4096];\n"
    ".visible .entry deep(.param .u64 out)\n{\n"
    "\t.local .align 4 .b8 stack[16384];\n\t.reg .b64 %a;\n\t.reg .b32 %v;\n"
    "\tmov.u32 %v, 7;\n\tst.local.u32 [stack+16380], %v;\n\tld.local.u32 %v, [stack+16380];\n"
    "\tld.param.u64 %a, [out];\n\tst.global.u32 [%a], %v;\n\tret;\n}\n";

static void *lib;
static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "no %s\n", name); exit(2); }
    return p;
}

/* One process: its history, then the module; writes the global's address to `fd`. */
static void run(int active, int stack_first, CUdeviceptr hint, int fd) {
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); exit(2); }
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuCtxSetCurrent)(CUcontext) = sym("cuCtxSetCurrent");
    CUresult (*cuCtxSetLimit)(int, size_t) = sym("cuCtxSetLimit");
    CUresult (*cuCtxSynchronize)(void) = sym("cuCtxSynchronize");
    CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) =
        sym("cuMemAddressReserve");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) = sym("cuModuleGetFunction");
    CUresult (*cuModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *) = sym("cuModuleGetGlobal_v2");
    CUresult (*cuStreamCreate)(CUstream *, unsigned) = sym("cuStreamCreate");
    CUresult (*cuEventCreate)(CUevent *, unsigned) = sym("cuEventCreate");
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **) = sym("cuLaunchKernel");
    CUcontext ctx;
    CUdeviceptr space;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    if (stack_first) CHECK(cuCtxSetLimit(0 /* CU_LIMIT_STACK_SIZE */, 16384 + 1024));
    CHECK(cuMemAddressReserve(&space, (size_t)512 << 30, 32 << 20, hint, 0));
    CUmodule warm, m;
    CHECK(cuModuleLoadData(&warm, PTX));
    if (active) {
        /* What a serving worker did before the client's module came: streams, events, a
         * kernel with deep local memory. */
        CUfunction deep;
        CUdeviceptr out;
        CHECK(cuModuleGetFunction(&deep, warm, "deep"));
        CHECK(cuMemAlloc(&out, 4096));
        for (int i = 0; i < 64; i++) { CUstream s; CHECK(cuStreamCreate(&s, 1)); }
        for (int i = 0; i < 256; i++) { CUevent e; CHECK(cuEventCreate(&e, 2)); }
        void *args[] = {&out};
        CHECK(cuLaunchKernel(deep, 132, 1, 1, 1024, 1, 1, 0, NULL, args, NULL));
        CHECK(cuCtxSynchronize());
    }
    CHECK(cuModuleLoadData(&m, PTX));
    CUdeviceptr g;
    size_t n;
    CHECK(cuModuleGetGlobal(&g, &n, m, "table"));
    CUdeviceptr both[2] = {g, space};
    if (write(fd, both, sizeof both) != sizeof both) exit(3);
}

/* Runs one process of the case; returns (global, reservation). */
static void child(int active, int stack_first, int no_aslr, CUdeviceptr hint, CUdeviceptr out[2]) {
    int p[2];
    if (pipe(p)) exit(3);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        if (no_aslr) personality(personality(0xffffffff) | ADDR_NO_RANDOMIZE | ADDR_COMPAT_LAYOUT);
        else personality(personality(0xffffffff) | ADDR_COMPAT_LAYOUT);
        /* The personality holds from the next exec: run ourselves again as the child. */
        char fd[16], a[4], s[4], h[32];
        snprintf(fd, sizeof fd, "%d", p[1]);
        snprintf(a, sizeof a, "%d", active);
        snprintf(s, sizeof s, "%d", stack_first);
        snprintf(h, sizeof h, "%llu", hint);
        execl("/proc/self/exe", "module_globals", "child", fd, a, s, h, (char *)NULL);
        exit(4);
    }
    close(p[1]);
    if (read(p[0], out, 2 * sizeof *out) != 2 * (ssize_t)sizeof *out) out[0] = out[1] = 0;
    close(p[0]);
    waitpid(pid, NULL, 0);
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "child") == 0) {
        run(atoi(argv[3]), atoi(argv[4]), strtoull(argv[5], NULL, 10), atoi(argv[2]));
        return 0;
    }
    const char *names[] = {"aslr", "no-aslr", "no-aslr, stack limit first"};
    for (int c = 0; c < 3; c++) {
        int no_aslr = c > 0, stack_first = c == 2;
        CUdeviceptr a[2], s[2];
        child(1, stack_first, no_aslr, 0, a);
        child(0, stack_first, no_aslr, a[1], s);
        printf("{\"case\": \"%s\", \"active\": \"%#llx\", \"spare\": \"%#llx\", \"same\": %s, "
               "\"reservations\": [\"%#llx\", \"%#llx\"]}\n",
               names[c], a[0], s[0], a[0] == s[0] ? "true" : "false", a[1], s[1]);
    }
    return 0;
}
