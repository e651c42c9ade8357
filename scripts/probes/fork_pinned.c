/* What does a fork()ed child get of its parent's page-locked memory, from NVIDIA's driver?
 *
 * For each kind of page-locked memory (cuMemAllocHost, cuMemHostAlloc, and an mmap'd range
 * after cuMemHostRegister, and the same range after cuMemHostUnregister), the parent writes
 * 0x11 into the first byte and forks twice: one child reads the byte, one writes 0x22 into it.
 * Then the parent reads it again. Also what a child's first CUDA calls return. gpushare's
 * driver matches what this prints (tests/c/cuda_standin_memory.c, check_fork).
 *
 * Build and run on the GPU machine:
 *   cc -O2 -o fork_pinned fork_pinned.c -ldl && ./fork_pinned
 * Prints one JSON line per case:
 *   {"case", "child_read": value or "signal N", "child_write": "ok" or "signal N",
 *    "parent_after": value} and {"case": "cuda in child", ...}. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CHECK(call)                                                                           \
    do {                                                                                      \
        CUresult r_ = (call);                                                                 \
        if (r_) {                                                                             \
            fprintf(stderr, "%s -> %d\n", #call, r_);                                         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuMemAllocHost)(void **, size_t);
static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
static CUresult (*cuMemHostRegister)(void *, size_t, unsigned);
static CUresult (*cuMemHostUnregister)(void *);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuCtxGetCurrent)(CUcontext *);

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "no %s\n", name);
        exit(2);
    }
    return p;
}

/* What a child got: "0x.." for a value, "signal N", or "exit N". */
static void outcome(pid_t pid, char *buf, size_t n) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        snprintf(buf, n, "signal %d", WTERMSIG(status));
    else
        snprintf(buf, n, "0x%02x", WEXITSTATUS(status));
}

static void probe(const char *name, volatile unsigned char *p) {
    char read[32], wrote[32];
    p[0] = 0x11;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(p[0]);
    outcome(pid, read, sizeof read);
    pid = fork();
    if (pid == 0) {
        p[0] = 0x22;
        _exit(0);
    }
    outcome(pid, wrote, sizeof wrote);
    printf("{\"case\": \"%s\", \"child_read\": \"%s\", \"child_write\": \"%s\", "
           "\"parent_after\": \"0x%02x\"}\n",
           name, read, wrote, p[0]);
}

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    cuInit = sym(lib, "cuInit");
    cuDeviceGet = sym(lib, "cuDeviceGet");
    cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
    cuCtxSetCurrent = sym(lib, "cuCtxSetCurrent");
    cuMemAllocHost = sym(lib, "cuMemAllocHost_v2");
    cuMemHostAlloc = sym(lib, "cuMemHostAlloc");
    cuMemHostRegister = sym(lib, "cuMemHostRegister_v2");
    cuMemHostUnregister = sym(lib, "cuMemHostUnregister");
    cuMemAlloc = sym(lib, "cuMemAlloc_v2");
    cuCtxGetCurrent = sym(lib, "cuCtxGetCurrent");
    setvbuf(stdout, NULL, _IOLBF, 0);

    int dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    void *a = NULL, *b = NULL;
    CHECK(cuMemAllocHost(&a, 1 << 20));
    probe("cuMemAllocHost", a);
    CHECK(cuMemHostAlloc(&b, 1 << 20, 0x1 /* PORTABLE */));
    probe("cuMemHostAlloc portable", b);
    void *small = NULL;
    CHECK(cuMemAllocHost(&small, 16));
    probe("cuMemAllocHost 16 bytes", small);

    size_t len = 1 << 20;
    unsigned char *m =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    probe("mmap before register", m);
    CHECK(cuMemHostRegister(m, len, 0));
    probe("cuMemHostRegister", m);
    CHECK(cuMemHostUnregister(m));
    probe("after cuMemHostUnregister", m);
    unsigned char *h = malloc(3 << 20);
    unsigned char *mid = h + 5000; /* not page aligned: the pages around it too */
    CHECK(cuMemHostRegister(mid, 100000, 0));
    probe("cuMemHostRegister malloc, unaligned", mid);
    probe("same page, before the registered range", mid - 100);
    CHECK(cuMemHostUnregister(mid));

    /* A child's CUDA: what its first calls return. */
    fflush(stdout);
    int pipefd[2];
    if (pipe(pipefd)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
        int r[4];
        CUdeviceptr d = 0;
        CUcontext cur = NULL;
        r[0] = cuMemAlloc(&d, 4096);
        r[1] = cuCtxGetCurrent(&cur);
        r[2] = cuInit(0);
        r[3] = cuMemAlloc(&d, 4096);
        if (write(pipefd[1], r, sizeof r) != sizeof r) _exit(3);
        _exit(0);
    }
    int r[4] = {-1, -1, -1, -1};
    char how[32];
    close(pipefd[1]);
    ssize_t got = read(pipefd[0], r, sizeof r);
    outcome(pid, how, sizeof how);
    printf("{\"case\": \"cuda in child\", \"bytes\": %zd, \"cuMemAlloc_first\": %d, "
           "\"cuCtxGetCurrent\": %d, \"cuInit\": %d, \"cuMemAlloc_after_init\": %d, "
           "\"exit\": \"%s\"}\n",
           got, r[0], r[1], r[2], r[3], how);
    return 0;
}
