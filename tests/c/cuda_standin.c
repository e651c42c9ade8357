/* A stand-in for an unmodified CUDA program (tests/consolidated.rs): it loads the driver the
 * way the CUDA runtime does — dlopen("libcuda.so.1") by soname, dlsym of cuGetProcAddress_v2
 * only, every other entry point through cuGetProcAddress at CUDA 13.0 — and checks what a
 * program relies on against gpushared.
 *
 *   cuda_standin all QUOTA        every section; the policy gives this user QUOTA bytes
 *   cuda_standin user QUOTA SEED  holds memory with pattern SEED, prints `holding`, waits
 *                                     for a line on stdin, then checks it and copies more
 *   cuda_standin vmm-hold SEED    holds memory of the virtual memory API (one piece unmapped
 *                                     but kept), prints `holding`, waits for a line on stdin,
 *                                     then maps it again and checks it all
 *   cuda_standin ipc-export SEED UID EXPECT
 *                                 shares an allocation and an event through CUDA IPC with a
 *                                     process of its own (as UID unless -1), in ipc-import mode
 *   cuda_standin vmm-export SEED UID EXPECT
 *                                 exports memory of pattern SEED and starts itself (as UID
 *                                     unless -1) in vmm-import mode with the descriptor
 *   cuda_standin vmm-import FD SEED EXPECT
 *                                 takes that memory (EXPECT "ok") and writes SEED + 1, or
 *                                     checks that taking it is refused (EXPECT "refused")
 *   cuda_standin noinit           cuInit must fail (no gpushared at GPUSHARE_SOCKET)
 *   cuda_standin away             holds memory, prints `ready`, waits for a line on stdin
 *                                     (the test stops gpushared meanwhile), then copies back
 *                                     and synchronizes twice, printing each result's name
 *   cuda_standin spin COUNT US [BLOCKS]  launches COUNT kernels of a sim module, grids of
 *                                     BLOCKS (1), that each occupy the device for US
 *                                     microseconds (tests/scheduling.rs), prints `ready` after
 *                                     the first, synchronizes, prints `spun`
 *   cuda_standin modules COUNT BYTES  loads a sim module of BYTES and unloads it, COUNT times;
 *                                     prints `rss FIRST LAST` (kB, after the first tenth of the
 *                                     cycles and at the end)
 *   cuda_standin gpus SEED        works on two devices at once (STANDIN_DEVICES=2)
 *   cuda_standin gpus-hold SEED   holds memory on two devices, prints `holding`, waits for a
 *                                     line on stdin, then prints how each device fares
 *   cuda_standin bystander SEED   works and checks every result, round after round, until
 *                                     stdin ends (tests/driver_fuzz.rs); prints `ready` after
 *                                     the first round and `rounds N` at the end
 *
 * Prints `section NAME: ok` per section and `cuda standin: all checks passed` at the end;
 * exits 1 on any failed check. $GPUSHARE_TEST_LIBCUDA names the library that must be loaded. */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define DEFINE(name, args) CUresult (*name) args;
#define DEFINE_PT(name, args) CUresult (*pt_##name) args;
ENTRY_POINTS(DEFINE)
PER_THREAD_ENTRY_POINTS(DEFINE_PT)
#undef DEFINE
#undef DEFINE_PT

int failures;
CUdevice device;
int devices = 1;
CUcontext primary;

typedef CUresult (*GetProcAddress)(const char *, void **, int, unsigned long long, int *);
static GetProcAddress get_proc_address;

static const char *section_name;
static int section_failures;

void section_begin(const char *name) {
    section_name = name;
    section_failures = failures;
}

void section_end(void) {
    printf("section %s: %s\n", section_name, failures == section_failures ? "ok" : "FAILED");
    fflush(stdout);
}

void go_ahead(const char *format, ...) {
    char said[128];
    va_list args;
    va_start(args, format);
    vsnprintf(said, sizeof said, format, args);
    va_end(args);
    printf("%s\n", said);
    fflush(stdout);
    char line[64];
    CHECK(fgets(line, sizeof line, stdin) != NULL, "the go-ahead on stdin after \"%s\"", said);
}

/* cuGetProcAddress of `name`, as the runtime asks (CUDA 13.0); NULL after a failed check. */
static void *lookup(const char *name, unsigned long long flags) {
    void *fn = NULL;
    int status = -1;
    CUresult r = get_proc_address(name, &fn, 13000, flags, &status);
    if (r != CUDA_SUCCESS || status != 0 || !fn) {
        failures++;
        printf("FAIL cuGetProcAddress(%s, 13000, %llu) gave %d, status %d, %p\n", name, flags, r,
               status, fn);
        return NULL;
    }
    return fn;
}

/* Function pointers from data pointers, without the cast ISO C leaves undefined. */
#define RESOLVE(name, args)                                                                   \
    {                                                                                         \
        void *p_ = lookup(#name, 0);                                                          \
        memcpy(&name, &p_, sizeof p_);                                                        \
    }
#define RESOLVE_PT(name, args)                                                                \
    {                                                                                         \
        void *p_ = lookup(#name, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);              \
        memcpy(&pt_##name, &p_, sizeof p_);                                                   \
    }

static int load_driver(void) {
    section_begin("loading");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL dlopen(libcuda.so.1): %s\n", dlerror());
        return 0;
    }
    const char *want = getenv("GPUSHARE_TEST_LIBCUDA");
    struct link_map *map = NULL;
    char loaded[PATH_MAX], wanted[PATH_MAX];
    CHECK(dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map, "dlinfo: %s", dlerror());
    CHECK(want && map && realpath(map->l_name, loaded) && realpath(want, wanted) &&
              !strcmp(loaded, wanted),
          "loaded %s, not %s", map ? map->l_name : "?", want ? want : "(unset)");
    void *sym = dlsym(lib, "cuGetProcAddress_v2");
    if (!sym) {
        printf("FAIL dlsym(cuGetProcAddress_v2): %s\n", dlerror());
        return 0;
    }
    memcpy(&get_proc_address, &sym, sizeof sym);
    ENTRY_POINTS(RESOLVE)
    PER_THREAD_ENTRY_POINTS(RESOLVE_PT)
    if (failures) return 0;

    /* cuGetProcAddress finds itself; unknown names and too-old versions are NOT_FOUND. */
    CHECK(lookup("cuGetProcAddress", 0) == sym, "cuGetProcAddress at 13000 is the _v2 form");
    void *fn = &fn;
    int status = -1;
    EXPECT(get_proc_address("cuNoSuchEntryPoint", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL && status == 1, "unknown symbol: %p, status %d", fn, status);
    fn = &fn;
    EXPECT(get_proc_address("cuStreamGetId", &fn, 11000, 0, &status), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL && status == 2, "version not sufficient: %p, status %d", fn, status);
    EXPECT(get_proc_address(NULL, &fn, 13000, 0, &status), CUDA_ERROR_INVALID_VALUE);
    /* Per-thread forms are other functions; where there is none, the plain one. */
    CHECK((void *)pt_cuMemsetD32Async != (void *)cuMemsetD32Async, "per-thread memset");
    CHECK((void *)pt_cuEventRecord != (void *)cuEventRecord, "per-thread event record");
    CHECK(lookup("cuMemsetD32Async", CU_GET_PROC_ADDRESS_LEGACY_STREAM) ==
              (void *)cuMemsetD32Async,
          "the legacy-stream flag gives the plain form");
    CHECK(lookup("cuMemAlloc", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ==
              lookup("cuMemAlloc", 0),
          "cuMemAlloc has no per-thread form");

    /* Before cuInit: the version answers, the rest is NOT_INITIALIZED. */
    int version = 0, count = -1;
    OK(cuDriverGetVersion(&version));
    CHECK(version >= 12000, "driver version %d", version);
    EXPECT(cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
    section_end();
    return failures == 0;
}

static int init(void) {
    section_begin("init");
    OK(cuInit(0));
    /* One device, or (STANDIN_DEVICES) a job's several, working on its local rank's. */
    const char *seen = getenv("STANDIN_DEVICES"), *rank = getenv("LOCAL_RANK");
    int count = 0, want = seen ? atoi(seen) : 1;
    OK(cuDeviceGetCount(&count));
    CHECK(count == want, "%d devices, want %d", count, want);
    devices = count;
    OK(cuDeviceGet(&device, rank ? atoi(rank) : 0));
    char name[256] = {0};
    OK(cuDeviceGetName(name, sizeof name, device));
    CHECK(name[0] != 0, "a device name");
    /* What the runtime does: retain the primary context and make it current. */
    OK(cuDevicePrimaryCtxRetain(&primary, device));
    OK(cuCtxSetCurrent(primary));
    CUcontext current = NULL;
    OK(cuCtxGetCurrent(&current));
    CHECK(current == primary && primary != NULL, "current %p, primary %p", (void *)current,
          (void *)primary);
    section_end();
    return failures == 0;
}

/* Another user's program: holds half its quota with its own pattern while the test runs the
 * other user's alongside, then checks nothing touched it. */
static void run_as_user(size_t quota, unsigned seed) {
    check_allocation(quota);
    section_begin("holding");
    size_t bytes = quota / 2, free_bytes = 0, total = 0;
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    CUdeviceptr d = 0;
    CHECK(host && back, "host memory");
    if (!host || !back) return;
    fill_pattern(host, bytes, seed);
    OK(cuMemAlloc(&d, bytes));
    OK(cuMemcpyHtoD(d, host, bytes));
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(total == quota && free_bytes == quota - bytes, "free %zu of %zu", free_bytes, total);
    EXPECT(cuMemAlloc(&(CUdeviceptr){0}, bytes + 1), CUDA_ERROR_OUT_OF_MEMORY);
    go_ahead("holding %zu", bytes);
    OK(cuMemcpyDtoH(back, d, bytes));
    size_t at = pattern_mismatch(back, bytes, seed);
    CHECK(at == bytes, "held memory changed at byte %zu", at);
    OK(cuMemFree(d));
    free(host);
    free(back);
    section_end();
    check_copies(quota / 4);
    check_memsets(quota / 4);
}

/* The broker goes away while the program holds memory: what its next calls return. */
static void run_away(void) {
    unsigned char host[4096] = {1};
    CUdeviceptr d = 0;
    OK(cuMemAlloc(&d, sizeof host));
    OK(cuMemcpyHtoD(d, host, sizeof host));
    go_ahead("ready");
    CUresult copy = cuMemcpyDtoH(host, d, sizeof host);
    CUresult sync = cuCtxSynchronize(NULL);
    CUresult again = cuCtxSynchronize(NULL);
    printf("after copy=%s sync=%s again=%s\n", error_name(copy), error_name(sync), error_name(again));
}

/* A module's kernels, one by one, as a program's would go: on the sim device (gpushare's own
 * module format; a real GPU would want PTX) each occupies it for `micros`. */
static void run_spin(unsigned long count, unsigned long long micros, unsigned blocks) {
    static const char image[] = "gpushare-sim-module 1\nkernel spin\n";
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream stream = NULL;
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (failures) return;
    void *args[] = {&micros};
    /* As CUDA answers them: a name the module lacks, and shapes no GPU runs. */
    CUfunction none = NULL;
    EXPECT(cuModuleGetFunction(&none, module, "nope"), CUDA_ERROR_NOT_FOUND);
    EXPECT(cuLaunchKernel(spin, 1, 1, 1, 1025, 1, 1, 0, stream, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(spin, 1, 1, 1, 32, 32, 2, 0, stream, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(spin, 1, 65536, 1, 32, 1, 1, 0, stream, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(spin, 0, 1, 1, 32, 1, 1, 0, stream, args, NULL), CUDA_ERROR_INVALID_VALUE);
    for (unsigned long i = 0; i < count; i++) {
        CUresult r = cuLaunchKernel(spin, blocks, 1, 1, 32, 1, 1, 0, stream, args, NULL);
        if (r != CUDA_SUCCESS) {
            CHECK(0, "launch %lu gave %s", i, error_name(r));
            return;
        }
        if (i == 0) {
            printf("ready\n");
            fflush(stdout);
        }
    }
    OK(cuStreamSynchronize(stream));
    OK(cuStreamDestroy(stream));
    OK(cuModuleUnload(module));
    printf("spun %lu\n", count);
}

/* Synchronizations with nothing to wait for, and those that have: a copy to pageable memory
 * waited for its stream, so syncs and queries of it right after (as PyTorch's .item() does)
 * are answered without asking gpushared, which the test sees in its command count between
 * "copied" and "synced"; work sent after that, or on another stream, is waited for again.
 * Needs a --sim-realtime broker: the spin kernel of MICROS then runs that long. */
static void run_quiet_syncs(unsigned long long micros) {
    static const char image[] = "gpushare-sim-module 1\nkernel spin\n";
    enum { SYNCS = 1000 };
    CUmodule module = NULL;
    CUfunction spin = NULL;
    CUstream a = NULL, b = NULL;
    CUevent e = NULL;
    CUdeviceptr d = 0;
    unsigned char host[4096];
    void *args[] = {&micros};
    section_begin("quiet syncs");
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&e, 0));
    OK(cuMemAlloc(&d, sizeof host));
    if (failures) {
        section_end();
        return;
    }
    OK(cuMemsetD8Async(d, 5, sizeof host, a));
    OK(cuMemcpyDtoHAsync(host, d, sizeof host, a));
    CHECK(host[0] == 5 && host[sizeof host - 1] == 5, "copied %u %u", host[0],
          host[sizeof host - 1]);
    go_ahead("copied");
    for (int i = 0; i < SYNCS; i++) {
        OK(cuStreamSynchronize(a));
        OK(cuStreamQuery(a));
    }
    /* The first waits for everything; those after it have nothing to wait for. */
    for (int i = 0; i < SYNCS; i++) OK(cuCtxSynchronize(NULL));
    OK(cuStreamSynchronize(b));
    go_ahead("synced");
    /* Work sent after the wait is waited for. */
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    OK(cuEventRecord(e, a));
    OK(cuStreamSynchronize(a));
    OK(cuEventQuery(e));
    /* A copy that waited for stream a says nothing of stream b's earlier work. */
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, b, args, NULL));
    OK(cuEventRecord(e, b));
    OK(cuMemcpyDtoHAsync(host, d, sizeof host, a));
    OK(cuStreamSynchronize(b));
    OK(cuEventQuery(e));
    OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, b, args, NULL));
    OK(cuEventRecord(e, b));
    OK(cuMemcpyDtoHAsync(host, d, sizeof host, a));
    EXPECT(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    OK(cuCtxSynchronize(NULL));
    OK(cuEventQuery(e));
    OK(cuStreamDestroy(b));
    OK(cuEventDestroy(e));
    OK(cuStreamDestroy(a));
    OK(cuMemFree(d));
    OK(cuModuleUnload(module));
    section_end();
}

/* This process's resident memory, in kB. */
static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* Loads and unloads one module COUNT times: the program must not grow with the cycles. */
static void run_modules(unsigned long count, size_t bytes) {
    /* Padded with one long kernel name: the sim reads it at once. */
    static const char head[] = "gpushare-sim-module 1\nkernel spin\nkernel pad";
    if (bytes < sizeof head + 1) bytes = sizeof head + 1;
    char *image = malloc(bytes);
    CHECK(image != NULL, "memory for the image");
    if (!image) return;
    memset(image, 'x', bytes - 2);
    memcpy(image, head, sizeof head - 1);
    image[bytes - 2] = '\n';
    image[bytes - 1] = 0;
    long first = -1;
    for (unsigned long i = 0; i < count && !failures; i++) {
        CUmodule module = NULL;
        CUfunction spin = NULL;
        OK(cuModuleLoadData(&module, image));
        OK(cuModuleGetFunction(&spin, module, "spin"));
        OK(cuModuleUnload(module));
        if (i + 1 == count / 10) first = rss_kb();
    }
    free(image);
    printf("rss %ld %ld\n", first, rss_kb());
}

/* A program working beside a hostile one: memory it holds, and each round copies both ways
 * through page-locked memory, a memset, a device-to-device copy and a kernel on a stream of
 * its own, every result checked, until its stdin has a line or ends. */
static void run_bystander(unsigned seed) {
    enum { HELD = 1 << 20, MOST = 256 << 10 };
    static const char image[] = "gpushare-sim-module 1\nkernel spin\n";
    static unsigned char held_host[HELD], back[HELD];
    section_begin("bystander");
    CUdeviceptr held = 0, a = 0, b = 0;
    CUstream s = NULL;
    CUmodule module = NULL;
    CUfunction spin = NULL;
    unsigned char *up = NULL, *down = NULL; /* page-locked: an async copy's must stay put */
    fill_pattern(held_host, HELD, seed);
    OK(cuMemAlloc(&held, HELD));
    OK(cuMemcpyHtoD(held, held_host, HELD));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuMemHostAlloc((void **)&up, MOST, 0));
    OK(cuMemHostAlloc((void **)&down, MOST, 0));
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    unsigned long rounds = 0;
    while (!failures) {
        unsigned r = seed + (unsigned)rounds + 1;
        size_t n = 4 * (1024 + (size_t)r * 4099 % (MOST / 4 - 1024)), half = n / 8 * 4;
        unsigned long long micros = r % 50;
        void *args[] = {&micros};
        OK(cuMemAlloc(&a, n));
        OK(cuMemAlloc(&b, n));
        fill_pattern(up, n, r);
        OK(cuMemcpyHtoDAsync(a, up, n, s));
        OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
        OK(cuMemsetD32Async(b, r, n / 4, s));
        OK(cuMemcpyDtoDAsync(b, a, half, s));
        memset(down, 0, n);
        OK(cuMemcpyDtoHAsync(down, b, n, s));
        OK(cuStreamSynchronize(s));
        size_t at = pattern_mismatch(down, half, r);
        CHECK(at == half, "round %lu: byte %zu of the copied half differs", rounds, at);
        for (size_t i = half; i < n && !memcmp(down + i, &r, 4); i += 4) at = i + 4;
        CHECK(at == n, "round %lu: the memset's word at byte %zu differs", rounds, at);
        OK(cuMemFree(a));
        OK(cuMemFree(b));
        OK(cuMemcpyDtoH(back, held, HELD));
        at = pattern_mismatch(back, HELD, seed);
        CHECK(at == HELD, "round %lu: held memory changed at byte %zu", rounds, at);
        if (rounds++ == 0) printf("ready\n");
        struct pollfd in = {.fd = 0, .events = POLLIN};
        if (poll(&in, 1, 0) != 0) break; /* a line, or the end of input: enough */
    }
    printf("rounds %lu\n", rounds);
    OK(cuModuleUnload(module));
    OK(cuMemFreeHost(up));
    OK(cuMemFreeHost(down));
    OK(cuStreamDestroy(s));
    OK(cuMemFree(held));
    section_end();
}

/* The optional grid size after a spin mode's COUNT and US (1 block if not given). */
static unsigned grid_of(int argc, char **argv) {
    return argc > 4 ? (unsigned)strtoul(argv[4], NULL, 0) : 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!load_driver()) goto done;
    if (!strcmp(mode, "noinit")) {
        section_begin("noinit");
        EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
        EXPECT(cuInit(0), CUDA_ERROR_NO_DEVICE);
        int count = -1;
        EXPECT(cuDeviceGetCount(&count), CUDA_ERROR_NO_DEVICE);
        section_end();
        goto done;
    }
    if (!init()) goto done;
    if (!strcmp(mode, "away")) {
        run_away();
        goto done;
    }
    size_t quota = argc > 2 ? strtoull(argv[2], NULL, 0) : 0;
    if (!strcmp(mode, "all") && quota) {
        check_export_tables();
        check_allocation(quota);
        check_copies(17u << 20);
        check_fork();
        check_memsets(5u << 20);
        check_streams();
        check_events();
        check_default_streams();
        check_deferred_errors();
        check_unsupported();
        check_host_functions();
        check_tensor_maps();
        check_memory_pools();
        check_virtual_memory(quota);
        check_graphs();
    } else if (!strcmp(mode, "ipc-export") && argc > 4) {
        run_ipc_export(argv[0], (unsigned)strtoul(argv[2], NULL, 0), strtol(argv[3], NULL, 0),
                       argv[4]);
    } else if (!strcmp(mode, "ipc-import") && argc > 5) {
        run_ipc_import(argv[2], argv[3], (unsigned)strtoul(argv[4], NULL, 0), argv[5]);
    } else if (!strcmp(mode, "vmm-export") && argc > 4) {
        run_vmm_export(argv[0], (unsigned)strtoul(argv[2], NULL, 0), strtol(argv[3], NULL, 0),
                       argv[4]);
    } else if (!strcmp(mode, "vmm-import") && argc > 4) {
        run_vmm_import(atoi(argv[2]), (unsigned)strtoul(argv[3], NULL, 0), argv[4]);
    } else if (!strcmp(mode, "free-busy")) {
        run_free_busy(argv[0]);
    } else if (!strcmp(mode, "reuse-check") && argc > 3) {
        run_reuse_check(atoi(argv[2]), atoi(argv[3]));
    } else if (!strcmp(mode, "graph-spin") && argc > 3) {
        run_graph_spin(strtoul(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), grid_of(argc, argv));
    } else if (!strcmp(mode, "host-hang")) {
        run_host_hang();
        goto done;
    } else if (!strcmp(mode, "graph-hold")) {
        run_graph_holding();
    } else if (!strcmp(mode, "vmm-hold") && argc > 2) {
        run_vmm_holding((unsigned)strtoul(argv[2], NULL, 0));
    } else if (!strcmp(mode, "user") && quota && argc > 3) {
        run_as_user(quota, (unsigned)strtoul(argv[3], NULL, 0));
    } else if (!strcmp(mode, "quiet-syncs") && argc > 2) {
        run_quiet_syncs(strtoull(argv[2], NULL, 0));
    } else if (!strcmp(mode, "timer-records") && argc > 2) {
        run_timer_records(strtoull(argv[2], NULL, 0));
    } else if (!strcmp(mode, "timer-held") && argc > 2) {
        run_timer_held(strtoull(argv[2], NULL, 0));
    } else if (!strcmp(mode, "spin") && argc > 3) {
        run_spin(strtoul(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), grid_of(argc, argv));
    } else if (!strcmp(mode, "modules") && argc > 3) {
        run_modules(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
    } else if (!strcmp(mode, "gpus-hold") && argc > 2) {
        run_gpus_holding((unsigned)strtoul(argv[2], NULL, 0));
    } else if (!strcmp(mode, "gpus") && argc > 2) {
        run_several_devices((unsigned)strtoul(argv[2], NULL, 0));
    } else if (!strcmp(mode, "bystander") && argc > 2) {
        run_bystander((unsigned)strtoul(argv[2], NULL, 0));
    } else {
        printf("FAIL usage: %s all QUOTA | user QUOTA SEED | spin COUNT US [BLOCKS] | "
               "modules COUNT BYTES | quiet-syncs US | timer-records US | timer-held US | bystander SEED | graph-spin COUNT US [BLOCKS] | graph-hold | free-busy | noinit | away\n",
               argv[0]);
        failures++;
    }
    section_begin("finish");
    OK(cuCtxSynchronize(NULL));
    section_end();
done:
    if (failures) {
        printf("consolidated app: %d checks failed\n", failures);
        return 1;
    }
    printf("cuda standin: all checks passed\n");
    return 0;
}
