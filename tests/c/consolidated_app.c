/* An unmodified CUDA program for the `gpushare run` tests (tests/run.rs). It reaches the
 * driver as the CUDA runtime does: `dlopen(LIB)` (LIB: "libcuda.so.1", or a path to a real
 * libcuda) and `cuGetProcAddress_v2` for everything but cuInit; built with -DLINKED, it is
 * linked against a libcuda instead (LIB is then ignored). Modes:
 *   init LIB          prints "driver PATH" (the file cuInit came from), "cuInit A B" (two
 *                     calls' results) and the loader's LD_LIBRARY_PATH and LD_AUDIT
 *                     ("env NAME VALUE", "-" when unset)
 *   hold LIB BYTES    allocates BYTES of device memory, copies a pattern there and back,
 *                     checks that there is no device 1 (gpushare gives a program one GPU),
 *                     prints "ready PID" once all that held, and frees and exits at end of
 *                     input
 *   where LIB         prints "cuda UUID" (device 0's, from cuDeviceGetUuid), then what NVML
 *                     shows as pynvml and PyTorch ask it (dlopen "libnvidia-ml.so.1"):
 *                     "nvml COUNT" and "nvml I UUID" for each device, and the environment
 *                     of the placement ("env NAME VALUE")
 *   spawn LIB BYTES CHILD_BYTES
 *                     as hold, but first starts itself (fork and exec) in hold mode with
 *                     CHILD_BYTES; both print their "ready PID"; exits with the child's
 *                     status after both saw end of input
 *   rank LIB          a process of a job of one process per GPU: prints "cuda count N",
 *                     "cuda I UUID" for each device, "peer 0 1 CAN" (cuDeviceCanAccessPeer)
 *                     and "p2p access 0 1 CAN" (cuDeviceGetP2PAttribute),
 *                     then works on device LOCAL_RANK (a copy there and back) and prints
 *                     "current DEV" (cuCtxGetDevice), "other device RETAIN DEV peer PEER
 *                     alloc ALLOC sync SYNC" (the next device's primary context: retained,
 *                     its device, peer access to it, an allocation and a sync with it
 *                     current: work there runs on that GPU), "nvml COUNT", "ready PID";
 *                     exits at the next line of input */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*init_t)(unsigned);
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, int *);

#ifdef LINKED
CUresult cuInit(unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
#endif

static init_t init;
static gpa_t gpa;

static void load(const char *lib) {
#ifdef LINKED
    (void)lib;
    init = cuInit;
    gpa = cuGetProcAddress_v2;
#else
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", lib, dlerror()); exit(2); }
    init = (init_t)dlsym(h, "cuInit");
    gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
    if (!init || !gpa) { fprintf(stderr, "%s lacks cuInit or cuGetProcAddress_v2\n", lib); exit(2); }
#endif
}

static void *get(const char *name) {
    void *f = NULL;
    int status = -1;
    if (gpa(name, &f, 12000, 0, &status) != 0 || !f) {
        fprintf(stderr, "cuGetProcAddress(%s) failed\n", name);
        exit(3);
    }
    return f;
}

#define CHECK(call) do { CUresult r_ = (call); if (r_ != 0) { fprintf(stderr, "%s: %d\n", #call, r_); exit(4); } } while (0)

static void show_env(const char *name) {
    const char *v = getenv(name);
    printf("env %s %s\n", name, v ? v : "-");
}

static int init_only(void) {
    Dl_info info;
    const char *from = dladdr((void *)init, &info) && info.dli_fname ? info.dli_fname : "?";
    printf("driver %s\n", from);
    CUresult a = init(0);
    CUresult b = init(0);
    printf("cuInit %d %d\n", a, b);
    show_env("LD_LIBRARY_PATH");
    show_env("LD_AUDIT");
    return 0;
}

static void wait_for_end_of_input(void) {
    char line[64];
    while (fgets(line, sizeof line, stdin)) {}
}

/* Makes device `ordinal`'s primary context current, allocates and copies a pattern there and
 * back; returns the allocation. */
static CUdeviceptr round_trip(int ordinal, size_t bytes) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(((CUresult (*)(CUdevice *, int))get("cuDeviceGet"))(&dev, ordinal));
    CHECK(((CUresult (*)(CUcontext *, CUdevice))get("cuDevicePrimaryCtxRetain"))(&ctx, dev));
    CHECK(((CUresult (*)(CUcontext))get("cuCtxSetCurrent"))(ctx));
    CUdeviceptr d = 0;
    CHECK(((CUresult (*)(CUdeviceptr *, size_t))get("cuMemAlloc"))(&d, bytes));
    size_t n = bytes < 4096 ? bytes : 4096;
    unsigned char *out = malloc(n), *back = calloc(1, n);
    if (!out || !back) exit(5);
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)(i * 7 + 3);
    CHECK(((CUresult (*)(CUdeviceptr, const void *, size_t))get("cuMemcpyHtoD"))(d, out, n));
    CHECK(((CUresult (*)(void *, CUdeviceptr, size_t))get("cuMemcpyDtoH"))(back, d, n));
    if (memcmp(out, back, n) != 0) { fprintf(stderr, "the copy came back different\n"); exit(6); }
    free(out);
    free(back);
    return d;
}

/* Initialises, then as round_trip on device 0; there must be no device 1. */
static CUdeviceptr set_up(size_t bytes) {
    CHECK(init(0));
    CUdeviceptr d = round_trip(0, bytes);
    CUdevice other;
    if (((CUresult (*)(CUdevice *, int))get("cuDeviceGet"))(&other, 1) == 0) {
        fprintf(stderr, "a second device exists\n");
        exit(7);
    }
    return d;
}

static int hold(size_t bytes) {
    CUdeviceptr d = set_up(bytes);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    wait_for_end_of_input();
    CHECK(((CUresult (*)(CUdeviceptr))get("cuMemFree"))(d));
    return 0;
}

static int spawn(const char *argv0, const char *lib, size_t bytes, const char *child_bytes) {
    CUdeviceptr d = set_up(bytes);
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 7; }
    if (child == 0) {
        execl("/proc/self/exe", argv0, "hold", lib, child_bytes, (char *)NULL);
        perror("exec");
        _exit(8);
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    wait_for_end_of_input();
    CHECK(((CUresult (*)(CUdeviceptr))get("cuMemFree"))(d));
    int status = 0;
    if (waitpid(child, &status, 0) != child) return 9;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 10;
}

typedef struct { char bytes[16]; } uuid_t_;

/* Device `ordinal`'s UUID as CUDA says it, after `prefix`. */
static void print_uuid(const char *prefix, int ordinal) {
    CUdevice dev;
    CHECK(((CUresult (*)(CUdevice *, int))get("cuDeviceGet"))(&dev, ordinal));
    uuid_t_ u;
    CHECK(((CUresult (*)(uuid_t_ *, CUdevice))get("cuDeviceGetUuid"))(&u, dev));
    const unsigned char *b = (const unsigned char *)u.bytes;
    printf("%sGPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
           prefix, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
           b[12], b[13], b[14], b[15]);
}

static int nvml_devices(int list);

/* Device 0's UUID as CUDA says it, and every device NVML shows. */
static int where(void) {
    CHECK(init(0));
    print_uuid("cuda ", 0);
    int r = nvml_devices(1);
    if (r) return r;
    show_env("GPUSHARE_GPU");
    show_env("CUDA_VISIBLE_DEVICES");
    return 0;
}

/* See the modes above. */
static int rank(void) {
    CHECK(init(0));
    int n = 0;
    CHECK(((CUresult (*)(int *))get("cuDeviceGetCount"))(&n));
    printf("cuda count %d\n", n);
    for (int i = 0; i < n; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "cuda %d ", i);
        print_uuid(prefix, i);
    }
    if (n > 1) {
        int can = -1;
        CHECK(((CUresult (*)(int *, CUdevice, CUdevice))get("cuDeviceCanAccessPeer"))(&can, 0, 1));
        printf("peer 0 1 %d\n", can);
        int access = -1;
        CHECK(((CUresult (*)(int *, int, CUdevice, CUdevice))get("cuDeviceGetP2PAttribute"))(
            &access, 2 /* ACCESS_SUPPORTED */, 0, 1));
        printf("p2p access 0 1 %d\n", access);
    }
    const char *r = getenv("LOCAL_RANK");
    int me = r ? atoi(r) : 0;
    CUdeviceptr d = round_trip(me, 1 << 20);
    CUdevice cur = -1;
    CHECK(((CUresult (*)(CUdevice *))get("cuCtxGetDevice"))(&cur));
    printf("current %d\n", cur);
    /* The next device's primary context: handed out (CUDA's runtime asks every device's at
     * start), it answers for its device, takes peer access, and runs work on its GPU. */
    CUdevice next = (me + 1) % (n > 0 ? n : 1);
    CUcontext own = NULL, other = NULL;
    CHECK(((CUresult (*)(CUcontext *))get("cuCtxGetCurrent"))(&own));
    CUresult retained = ((CUresult (*)(CUcontext *, CUdevice))get("cuDevicePrimaryCtxRetain"))(&other, next);
    CUresult peer = ((CUresult (*)(CUcontext, unsigned))get("cuCtxEnablePeerAccess"))(other, 0);
    CHECK(((CUresult (*)(CUcontext))get("cuCtxSetCurrent"))(other));
    CUdevice there = -1;
    CHECK(((CUresult (*)(CUdevice *))get("cuCtxGetDevice"))(&there));
    CUdeviceptr none = 0;
    CUresult alloc = ((CUresult (*)(CUdeviceptr *, size_t))get("cuMemAlloc"))(&none, 4096);
    CUresult sync = ((CUresult (*)(void))get("cuCtxSynchronize"))();
    CHECK(((CUresult (*)(CUcontext))get("cuCtxSetCurrent"))(own));
    printf("other device %d %d peer %d alloc %d sync %d\n", retained, there, peer, alloc, sync);
    int e = nvml_devices(0);
    if (e) return e;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 15;
    CHECK(((CUresult (*)(CUdeviceptr))get("cuMemFree"))(d));
    return 0;
}

/* NVML's device count ("nvml N") and, with `list`, each device's UUID ("nvml I UUID"). */
static int nvml_devices(int list) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml) { fprintf(stderr, "dlopen libnvidia-ml.so.1: %s\n", dlerror()); return 11; }
    int (*nvml_init)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(nvml, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    int (*uuid)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(nvml, "nvmlDeviceGetUUID");
    if (!nvml_init || !count || !by_index || !uuid) { fprintf(stderr, "NVML lacks a function\n"); return 12; }
    unsigned n = 0;
    if (nvml_init() != 0 || count(&n) != 0) { fprintf(stderr, "NVML failed\n"); return 13; }
    printf("nvml %u\n", n);
    for (unsigned i = 0; list && i < n; i++) {
        void *h = NULL;
        char text[96] = {0};
        if (by_index(i, &h) != 0 || uuid(h, text, sizeof text) != 0) return 14;
        printf("nvml %u %s\n", i, text);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s init|hold|spawn LIB ...\n", argv[0]); return 2; }
    load(argv[2]);
    if (!strcmp(argv[1], "init")) return init_only();
    if (!strcmp(argv[1], "where")) return where();
    if (!strcmp(argv[1], "rank")) return rank();
    if (!strcmp(argv[1], "hold") && argc == 4) return hold(strtoull(argv[3], NULL, 10));
    if (!strcmp(argv[1], "spawn") && argc == 5)
        return spawn(argv[0], argv[2], strtoull(argv[3], NULL, 10), argv[4]);
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
