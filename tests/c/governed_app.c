/* An unmodified CUDA program for the interposer tests (tests/governed.rs). It opens the driver
 * named by argv[1] with dlopen, finds cuGetProcAddress_v2 with dlsym and everything else
 * through it, as the CUDA runtime does. Modes:
 *   symbols       for each entry point, whether cuGetProcAddress handed back the interposer's
 *                 wrapper or the driver's own function ("NAME VERSION FLAGS -> wrapper|real")
 *   quota SIZE    allocates SIZE bytes with each allocation family in turn, freeing some, and
 *                 prints each call's result ("alloc FAMILY CODE", "free FAMILY CODE")
 *   hold N SIZE   allocates SIZE bytes, launches N kernels, synchronizes, prints "ready", and
 *                 frees and exits after a line on stdin
 *   internal      looks cuLaunchKernel up for CUDA 13.5, for which the stand-in answers with a
 *                 function of its own that the interposer cannot wrap, and launches through it
 *                 ("internal launch CODE")
 *   loop MS THREADS HOW BLOCKS
 *                 a training loop: THREADS threads (besides the main one, which waits) each
 *                 launch batches of 8 kernels of BLOCKS blocks and synchronize their stream,
 *                 for MS milliseconds; HOW picks the entry point, as a runtime under per-thread
 *                 default streams or cuBLAS on Hopper would: "kernel" (cuLaunchKernel),
 *                 "ptsz" (cuLaunchKernel_ptsz), "ex" (cuLaunchKernelEx), "mixed" (one thread
 *                 each, round robin). Then synchronizes the context (reporting every launch),
 *                 prints "launched N" (all threads' launches) and exits at a line or the end
 *                 of stdin.
 *   steps SIZE    initialises, allocates SIZE bytes ("ready CODE"), then runs one step per
 *                 line of stdin, printing its result and how often the driver was called for
 *                 it: "launch" (a launch and a synchronization: "launch CODE CALLS"),
 *                 "alloc BYTES" ("alloc CODE CALLS"), "free" (the last of those allocations:
 *                 "free CODE"); exits at the end of stdin. */
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *Ptr;
typedef CUresult (*gpa_v2_t)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long);
typedef void *(*address_t)(const char *);
typedef unsigned long (*calls_t)(const char *);

static void *lib;
static gpa_v2_t gpa;

static void *get(const char *name, int version, unsigned long long flags) {
    void *f = NULL;
    int status = -1;
    if (gpa(name, &f, version, flags, &status) != 0 || !f) {
        fprintf(stderr, "cuGetProcAddress(%s, %d, %llu) failed\n", name, version, flags);
        exit(3);
    }
    return f;
}

static const char *which(void *f, const char *resolved) {
    address_t address = (address_t)dlsym(lib, "standin_address");
    if (f == address(resolved)) return "real";
    if (f == dlsym(RTLD_DEFAULT, resolved)) return "wrapper";
    return "other";
}

static int symbols(void) {
    struct { const char *name; int version; unsigned long long flags; const char *resolved; } t[] = {
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
        {"cuInit", 12000, 0, "cuInit"},
        {"cuMemAlloc", 12000, 0, "cuMemAlloc_v2"},
        {"cuMemAllocPitch", 12000, 0, "cuMemAllocPitch_v2"},
        {"cuMemFree", 12000, 0, "cuMemFree_v2"},
        {"cuMemAllocManaged", 12000, 0, "cuMemAllocManaged"},
        {"cuMemAllocAsync", 12000, 0, "cuMemAllocAsync"},
        {"cuMemAllocAsync", 12000, 2, "cuMemAllocAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", 12000, 0, "cuMemAllocFromPoolAsync"},
        {"cuMemAllocFromPoolAsync", 12000, 2, "cuMemAllocFromPoolAsync_ptsz"},
        {"cuMemFreeAsync", 12000, 0, "cuMemFreeAsync"},
        {"cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz"},
        {"cuMemCreate", 12000, 0, "cuMemCreate"},
        {"cuMemRelease", 12000, 0, "cuMemRelease"},
        {"cuLaunchKernel", 12000, 0, "cuLaunchKernel"},
        {"cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"},
        {"cuLaunchKernelEx", 12000, 0, "cuLaunchKernelEx"},
        {"cuLaunchKernelEx", 12000, 2, "cuLaunchKernelEx_ptsz"},
        {"cuLaunchCooperativeKernel", 12000, 0, "cuLaunchCooperativeKernel"},
        {"cuLaunchCooperativeKernel", 12000, 2, "cuLaunchCooperativeKernel_ptsz"},
        {"cuGraphLaunch", 12000, 0, "cuGraphLaunch"},
        {"cuGraphLaunch", 12000, 2, "cuGraphLaunch_ptsz"},
        {"cuCtxCreate", 11000, 0, "cuCtxCreate_v2"},
        {"cuCtxCreate", 12000, 0, "cuCtxCreate_v3"},
        {"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"},
        {"cuDevicePrimaryCtxRetain", 12000, 0, "cuDevicePrimaryCtxRetain"},
        {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize"},
        {"cuStreamSynchronize", 12000, 0, "cuStreamSynchronize"},
        {"cuStreamSynchronize", 12000, 2, "cuStreamSynchronize_ptsz"},
        {"cuEventSynchronize", 12000, 0, "cuEventSynchronize"},
        {"cuDeviceGetCount", 12000, 0, "cuDeviceGetCount"},
    };
    for (unsigned i = 0; i < sizeof t / sizeof *t; i++)
        printf("%s %d %llu -> %s\n", t[i].name, t[i].version, t[i].flags, which(get(t[i].name, t[i].version, t[i].flags), t[i].resolved));
    printf("dlsym cuGetProcAddress_v2 -> %s\n", which((void *)gpa, "cuGetProcAddress_v2"));
    /* The v1 entry point, found through v2, answers through the wrapper too. */
    gpa_t v1 = (gpa_t)get("cuGetProcAddress", 11030, 0);
    void *f = NULL;
    if (v1("cuMemAlloc", &f, 11030, 0) != 0) return 4;
    printf("v1 cuMemAlloc 11030 0 -> %s\n", which(f, "cuMemAlloc_v2"));
    /* A wrapper reaches the driver. */
    CUdeviceptr d = 0;
    CUresult r = ((CUresult(*)(CUdeviceptr *, size_t))f)(&d, 4096);
    calls_t calls = (calls_t)dlsym(lib, "standin_calls");
    printf("forwarded cuMemAlloc_v2 %d %lu\n", r, calls("cuMemAlloc_v2"));
    return 0;
}

static int quota(size_t size) {
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc", 12000, 0);
    CUresult (*free_)(CUdeviceptr) = get("cuMemFree", 12000, 0);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned) = get("cuMemAllocManaged", 12000, 0);
    CUresult (*async)(CUdeviceptr *, size_t, Ptr) = get("cuMemAllocAsync", 12000, 0);
    CUresult (*pool)(CUdeviceptr *, size_t, Ptr, Ptr) = get("cuMemAllocFromPoolAsync", 12000, 2);
    CUresult (*free_async)(CUdeviceptr, Ptr) = get("cuMemFreeAsync", 12000, 0);
    CUresult (*create)(unsigned long long *, size_t, const void *, unsigned long long) = get("cuMemCreate", 12000, 0);
    CUresult (*release)(unsigned long long) = get("cuMemRelease", 12000, 0);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) = get("cuMemAllocPitch", 12000, 0);
    calls_t calls = (calls_t)dlsym(lib, "standin_calls");
    CUdeviceptr a = 0, m = 0, s = 0, p = 0, q = 0;
    unsigned long long h = 0;
    size_t row = 0;
    printf("alloc classic %d\n", alloc(&a, size));
    printf("alloc managed %d\n", managed(&m, size, 1));
    printf("alloc async %d\n", async(&s, size, NULL));
    printf("alloc pool %d\n", pool(&p, size, NULL, NULL));
    printf("driver pool calls %lu\n", calls("cuMemAllocFromPoolAsync_ptsz"));
    printf("free async %d\n", free_async(s, NULL));
    printf("alloc pool %d\n", pool(&p, size, NULL, NULL));
    printf("alloc vmm %d\n", create(&h, size, NULL, 0));
    printf("alloc pitch %d\n", pitch(&q, &row, size / 2, 2, 4));
    printf("free classic %d\n", free_(a));
    printf("alloc vmm %d\n", create(&h, size, NULL, 0));
    printf("free vmm %d\n", release(h));
    printf("alloc pitch %d\n", pitch(&q, &row, size / 2, 2, 4));
    printf("free pitch %d\n", free_(q));
    printf("free managed %d\n", free_(m));
    printf("free pool %d\n", free_async(p, NULL));
    return 0;
}

static int hold(int n, size_t size) {
    CUresult (*init)(unsigned) = get("cuInit", 12000, 0);
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc", 12000, 0);
    CUresult (*free_)(CUdeviceptr) = get("cuMemFree", 12000, 0);
    CUresult (*launch)(Ptr, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Ptr, void **, void **) =
        get("cuLaunchKernel", 12000, 0);
    CUresult (*sync)(Ptr) = get("cuStreamSynchronize", 12000, 0);
    if (init(0) != 0) return 5;
    CUdeviceptr d = 0;
    if (alloc(&d, size) != 0) return 6;
    for (int i = 0; i < n; i++)
        if (launch(NULL, 4, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) != 0) return 7;
    if (sync(NULL) != 0) return 8;
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 9;
    return free_(d) == 0 ? 0 : 10;
}

typedef CUresult (*launch_t)(Ptr, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Ptr,
                             void **, void **);
typedef CUresult (*launch_ex_t)(const void *, Ptr, void **, void **);
typedef CUresult (*sync_t)(Ptr);

/* The start of CUlaunchConfig: grid, block, shared memory, stream, attributes. */
struct launch_config {
    unsigned grid[3], block[3], shared;
    Ptr stream;
    void *attrs;
    unsigned nattrs;
};

struct worker {
    const char *how;
    unsigned blocks;
    double until;
    unsigned long launched;
    int failed;
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *work(void *arg) {
    struct worker *w = arg;
    int ptsz = !strcmp(w->how, "ptsz");
    launch_t launch = get("cuLaunchKernel", 12000, ptsz ? 2 : 0);
    launch_ex_t launch_ex = get("cuLaunchKernelEx", 12000, 0);
    sync_t sync = get("cuStreamSynchronize", 12000, ptsz ? 2 : 0);
    struct launch_config config = {{w->blocks, 1, 1}, {128, 1, 1}, 0, NULL, NULL, 0};
    while (now_ms() < w->until) {
        for (int i = 0; i < 8; i++) {
            CUresult r = !strcmp(w->how, "ex") ? launch_ex(&config, NULL, NULL, NULL)
                                                : launch(NULL, w->blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (r != 0) { w->failed = 1; return NULL; }
            w->launched++;
        }
        if (sync(NULL) != 0) { w->failed = 1; return NULL; }
    }
    return NULL;
}

static int loop(double ms, int threads, const char *how, unsigned blocks) {
    static const char *mixed[] = {"kernel", "ptsz", "ex"};
    CUresult (*init)(unsigned) = get("cuInit", 12000, 0);
    if (init(0) != 0) return 5;
    if (threads < 1 || threads > 16) return 2;
    pthread_t t[16];
    struct worker w[16];
    double until = now_ms() + ms;
    for (int i = 0; i < threads; i++) {
        w[i] = (struct worker){!strcmp(how, "mixed") ? mixed[i % 3] : how, blocks, until, 0, 0};
        if (pthread_create(&t[i], NULL, work, &w[i]) != 0) return 11;
    }
    unsigned long launched = 0;
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        launched += w[i].launched;
        failed |= w[i].failed;
    }
    CUresult (*ctx_sync)(void) = get("cuCtxSynchronize", 12000, 0);
    if (ctx_sync() != 0) return 8;
    printf("launched %lu\n", launched);
    fflush(stdout);
    char line[64];
    (void)!fgets(line, sizeof line, stdin);
    return failed ? 7 : 0;
}

static int steps(size_t size) {
    CUresult (*init)(unsigned) = get("cuInit", 12000, 0);
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc", 12000, 0);
    CUresult (*free_)(CUdeviceptr) = get("cuMemFree", 12000, 0);
    launch_t launch = get("cuLaunchKernel", 12000, 0);
    sync_t sync = get("cuStreamSynchronize", 12000, 0);
    calls_t calls = (calls_t)dlsym(lib, "standin_calls");
    CUresult r = init(0);
    CUdeviceptr held = 0, extra[64];
    int n = 0;
    if (r == 0) r = alloc(&held, size);
    printf("ready %d\n", r);
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "launch", 6)) {
            r = launch(NULL, 4, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            if (r == 0) r = sync(NULL);
            printf("launch %d %lu\n", r, calls("cuLaunchKernel"));
        } else if (!strncmp(line, "alloc ", 6) && n < 64) {
            r = alloc(&extra[n], strtoull(line + 6, NULL, 0));
            if (r == 0) n++;
            printf("alloc %d %lu\n", r, calls("cuMemAlloc_v2"));
        } else if (!strncmp(line, "free", 4) && n > 0) {
            printf("free %d\n", free_(extra[--n]));
        } else {
            printf("what %s", line);
        }
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    gpa = (gpa_v2_t)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) return 2;
    if (!strcmp(argv[2], "symbols")) return symbols();
    if (!strcmp(argv[2], "steps") && argc > 3) return steps(strtoull(argv[3], NULL, 0));
    if (!strcmp(argv[2], "quota") && argc > 3) return quota(strtoull(argv[3], NULL, 0));
    if (!strcmp(argv[2], "hold") && argc > 4) return hold(atoi(argv[3]), strtoull(argv[4], NULL, 0));
    if (!strcmp(argv[2], "internal")) {
        CUresult (*init)(unsigned) = get("cuInit", 12000, 0);
        launch_t launch = get("cuLaunchKernel", 13050, 0);
        if (init(0) != 0) return 5;
        printf("internal launch %d\n", launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        return 0;
    }
    if (!strcmp(argv[2], "loop") && argc > 6)
        return loop(atof(argv[3]), atoi(argv[4]), argv[5], (unsigned)strtoul(argv[6], NULL, 0));
    return 2;
}
