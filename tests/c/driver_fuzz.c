/* A fuzzer for gpushare's CUDA driver (tests/driver_fuzz.rs): a stand-in CUDA program that
 * loads libcuda.so.1 as the CUDA runtime does and calls its entry points in the order, and
 * with the arguments, an input byte string says: NULL pointers, handles never made or
 * already destroyed, freed and interior addresses, huge and overlapping sizes, images cut
 * short, hostile launch shapes, threads, forks and a sudden exit.
 *
 *   driver_fuzz INPUT      runs the operations the bytes of the file INPUT choose
 *   driver_fuzz --ops      prints the operations' names, one a line, in the order an
 *                          input's bytes number them: an input's first byte says whether
 *                          cuInit comes first (unless a multiple of 8), its second byte B
 *                          picks its first operation (B modulo their number)
 *
 * What a correct driver must do, checked on the way: every call returns a CUresult the
 * driver knows, never CUDA_ERROR_UNKNOWN (its answer to a panic of its own); a call on
 * memory the program does not hold fails; and the data checks (driver_fuzz_memory.c) see
 * exactly what they wrote. Each finding prints `FAIL ...`; the program then exits 1. A
 * crash is the test's to see. It prints `driver fuzz: N ops, C calls, E errors` at the end.
 *
 * DRIVER_FUZZ_TRACE=1 prints every operation and call result. */
#define _GNU_SOURCE
#include "driver_fuzz.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFINE(name, args) CUresult (*name) args;
#define DEFINE_PT(name, args) CUresult (*pt_##name) args;
ENTRY_POINTS(DEFINE)
PER_THREAD_ENTRY_POINTS(DEFINE_PT)
FUZZ_ENTRY_POINTS(DEFINE)
#undef DEFINE
#undef DEFINE_PT

GetProcAddress get_proc_address;
int failures;
CUdevice device;
CUcontext primary;

struct span allocs[N_ALLOCS];
unsigned char *hosts[N_HOSTS];
struct span pinned[N_PINNED];
struct span registered[N_REGISTERED];
CUstream streams[N_STREAMS];
CUevent events[N_EVENTS];
CUmodule modules[N_MODULES];
CUfunction funcs[N_FUNCS];
CUcontext ctxs[N_CTXS];
CUgraph graphs[N_GRAPHS];
CUgraphExec execs[N_EXECS];
int initialized;

static int trace;
static unsigned long ops_run, calls, errors;
static const char *op_name = "setup";

/* ---- input ----------------------------------------------------------------------------- */

static const uint8_t *input;
static size_t input_len, input_at;

uint8_t in_u8(void) { return input_at < input_len ? input[input_at++] : (input_at++, 0); }

uint32_t in_u32(void) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)in_u8() << (8 * i);
    return v;
}

uint64_t in_u64(void) { return in_u32() | (uint64_t)in_u32() << 32; }

int in_done(void) { return input_at >= input_len; }

unsigned in_below(unsigned n) { return n <= 256 ? in_u8() % n : in_u32() % n; }

uint64_t in_hostile(void) {
    static const uint64_t values[] = {
        0,           1,           2,          3,          4095,       4096,
        4097,        65536,       1u << 31,   UINT32_MAX, 1ull << 32, 1ull << 40,
        1ull << 48,  1ull << 62,  1ull << 63, INT64_MAX,  UINT64_MAX, UINT64_MAX - 4095,
        UINT64_MAX - 1,
    };
    unsigned i = in_below(sizeof values / sizeof values[0] + 1);
    return i < sizeof values / sizeof values[0] ? values[i] : in_u64();
}

uint64_t in_len(uint64_t max) {
    switch (in_below(8)) {
    case 0: return 0;
    case 1: return max;
    case 2: return max + 1 + in_below(4096);
    case 3: return in_hostile();
    case 4: return 1 + in_below(64);
    default: return max ? in_u32() % max + 1 : 0;
    }
}

/* ---- what the program holds ------------------------------------------------------------ */

int in_live_alloc(uint64_t p, uint64_t len) {
    for (int i = 0; i < N_ALLOCS; i++) {
        const struct span *a = &allocs[i];
        if (a->live && p >= a->ptr && p - a->ptr < a->size && len <= a->size - (p - a->ptr))
            return 1;
    }
    return 0;
}

void *junk_handle(void) {
    static const uintptr_t junk[] = {0x3, 0x5a, 0x15a, 0xffffff5a, 0xe7, 0x1e7, 0x1000,
                                     (uintptr_t)-1, (uintptr_t)-256 | 0x5a};
    unsigned i = in_below(sizeof junk / sizeof junk[0] + 1);
    return (void *)(i < sizeof junk / sizeof junk[0] ? junk[i] : (uintptr_t)in_u64());
}

uint64_t pick_dptr(void) {
    const struct span *a = &allocs[in_below(N_ALLOCS)];
    switch (in_below(8)) {
    case 0: return 0;
    case 1: return (uint64_t)(uintptr_t)junk_handle();
    case 2: return a->ptr ? a->ptr + a->size : 0; /* one past the end */
    case 3: return a->ptr ? a->ptr - 1 - in_below(64) : in_hostile();
    case 4: return a->ptr + (a->size ? in_u32() % a->size : 0);
    default: return a->ptr;
    }
}

void *pick_host(uint64_t len) {
    if (len > HOST_BYTES) len = HOST_BYTES;
    if (in_below(3) == 0) {
        const struct span *p = &pinned[in_below(N_PINNED)];
        if (p->live && p->size >= len)
            return (void *)(uintptr_t)(p->ptr + in_u32() % (p->size - len + 1));
    }
    return hosts[in_below(N_HOSTS)] + in_u32() % (HOST_BYTES - len + 1);
}

CUstream pick_stream(void) {
    switch (in_below(8)) {
    case 0: return NULL;
    case 1: return CU_STREAM_LEGACY;
    case 2: return CU_STREAM_PER_THREAD;
    case 3: return (CUstream)junk_handle();
    default: return streams[in_below(N_STREAMS)];
    }
}

CUevent pick_event(void) {
    return in_below(6) ? events[in_below(N_EVENTS)] : (CUevent)junk_handle();
}

CUcontext pick_ctx(void) {
    switch (in_below(6)) {
    case 0: return NULL;
    case 1: return (CUcontext)junk_handle();
    case 2: return primary;
    default: return ctxs[in_below(N_CTXS)];
    }
}

int slot_of(void *const *slots, unsigned n, const void *h) {
    for (unsigned i = 0; h && i < n; i++)
        if (slots[i] == h) return (int)i;
    return -1;
}

unsigned span_slot(const struct span *spans, unsigned n) {
    for (unsigned i = 0; i < n; i++)
        if (!spans[i].live) return i;
    return in_below(n);
}

/* ---- results ----------------------------------------------------------------------------- */

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL op %lu (%s): ", ops_run, op_name);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
}

CUresult res(const char *call, CUresult r) {
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    if (r != CUDA_SUCCESS) __atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
    const char *name = NULL;
    if (r == CUDA_ERROR_UNKNOWN)
        fail("%s gave CUDA_ERROR_UNKNOWN", call);
    else if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        fail("%s gave %d, which is no CUresult", call, r);
    if (trace) printf("  %s -> %s\n", call, error_name(r));
    return r;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- loading ------------------------------------------------------------------------------ */

static void *lookup(const char *name, unsigned long long flags) {
    void *fn = NULL;
    int status = -1;
    if (get_proc_address(name, &fn, 13000, flags, &status) != CUDA_SUCCESS || !fn) {
        printf("FAIL cuGetProcAddress(%s) gave status %d\n", name, status);
        exit(1);
    }
    return fn;
}

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

static void load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *sym = lib ? dlsym(lib, "cuGetProcAddress_v2") : NULL;
    if (!sym) {
        printf("FAIL loading libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
    memcpy(&get_proc_address, &sym, sizeof sym);
    ENTRY_POINTS(RESOLVE)
    PER_THREAD_ENTRY_POINTS(RESOLVE_PT)
    FUZZ_ENTRY_POINTS(RESOLVE)
}

static void read_input(const char *path) {
    FILE *f = fopen(path, "rb");
    static uint8_t buf[1 << 16];
    if (!f) {
        printf("FAIL cannot open %s\n", path);
        exit(1);
    }
    input_len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    input = buf;
}

/* ---- operations of the process as a whole --------------------------------------------- */

static void op_init(void) {
    unsigned flags = in_below(4) ? 0 : in_u32();
    CUresult r = R(cuInit(flags));
    if (r == CUDA_SUCCESS && !initialized) {
        if (flags) fail("cuInit(%#x) succeeded: flags must be 0", flags);
        initialized = 1;
        R(cuDeviceGet(&device, 0));
        R(cuDevicePrimaryCtxRetain(&primary, device));
        R(cuCtxSetCurrent(primary));
    }
}

struct thread_args {
    uint64_t dst, count;
    unsigned value;
    CUevent event;
};

/* Another thread's calls: the per-thread default stream, made at its first use and destroyed
 * when the thread ends (with its work maybe still queued). */
static void *thread_body(void *p) {
    struct thread_args *a = p;
    CUcontext current = (CUcontext)1;
    R(cuCtxGetCurrent(&current));
    if (current != NULL && initialized) fail("a new thread's current context is %p", current);
    R(pt_cuMemsetD32Async(a->dst, a->value, a->count, NULL));
    R(pt_cuEventRecord(a->event, NULL));
    unsigned long long id = 0;
    R(pt_cuStreamGetId(NULL, &id));
    if (a->count & 1) R(pt_cuStreamSynchronize(NULL));
    return NULL;
}

static void op_thread(void) {
    struct thread_args a = {pick_dptr(), in_len(MAX_ALLOC / 4), in_u32(), pick_event()};
    pthread_t t;
    if (pthread_create(&t, NULL, thread_body, &a) == 0) pthread_join(t, NULL);
}

/* A thread of the program's own that works beside everything else until told to stop: its
 * memory, copies and per-thread stream must come through whatever the others do. */
static pthread_t busy;
int busy_running;
pthread_mutex_t busy_lock = PTHREAD_MUTEX_INITIALIZER;
uint64_t busy_ptr, busy_len;
static int busy_stop;
static unsigned long busy_rounds;

static void *busy_body(void *p) {
    static unsigned char src[256 << 10], back[256 << 10];
    unsigned seed = (unsigned)(uintptr_t)p;
    R(cuCtxSetCurrent(primary));
    while (!__atomic_load_n(&busy_stop, __ATOMIC_ACQUIRE)) {
        seed = seed * 1103515245u + 12345u;
        size_t n = 4 + seed % (sizeof src - 4);
        CUdeviceptr d = 0;
        pthread_mutex_lock(&busy_lock);
        CUresult got = R(cuMemAlloc(&d, n));
        busy_ptr = got == CUDA_SUCCESS ? d : 0;
        busy_len = n;
        pthread_mutex_unlock(&busy_lock);
        if (got != CUDA_SUCCESS) {
            fail("the busy thread's cuMemAlloc(%zu) failed", n);
            return NULL;
        }
        fill_pattern(src, n, seed);
        memset(back, 0, n);
        /* Errors of others' work may come with any call that waits; data that came must be
         * right. */
        if (R(cuMemcpyHtoD(d, src, n)) == CUDA_SUCCESS &&
            R(pt_cuMemsetD32Async(d, seed, 1, NULL)) == CUDA_SUCCESS &&
            R(pt_cuMemcpyDtoH(back, d, n)) == CUDA_SUCCESS) {
            memcpy(src, &seed, 4);
            if (memcmp(src, back, n))
                fail("the busy thread read back other bytes than it wrote (%zu bytes)", n);
        }
        pthread_mutex_lock(&busy_lock);
        CUresult freed = R(cuMemFree(d));
        busy_ptr = 0;
        pthread_mutex_unlock(&busy_lock);
        if (freed != CUDA_SUCCESS) fail("the busy thread's cuMemFree failed");
        busy_rounds++;
    }
    return NULL;
}

static void stop_busy(void) {
    if (!busy_running) return;
    __atomic_store_n(&busy_stop, 1, __ATOMIC_RELEASE);
    pthread_join(busy, NULL);
    busy_running = 0;
}

static void op_busy(void) {
    if (busy_running || !initialized) {
        stop_busy();
        return;
    }
    busy_stop = 0;
    busy_running = pthread_create(&busy, NULL, busy_body, (void *)(uintptr_t)in_u32()) == 0;
}

/* A forked child gets what NVIDIA's driver gives it (scripts/probes/fork_pinned.c): no CUDA
 * when its parent had called cuInit (every call, cuInit too, says NOT_INITIALIZED), and
 * registered memory of its own (a write there never reaches the parent). A child of a parent
 * that never called cuInit is a client of its own. */
static void op_fork(void) {
    if (in_below(4)) return;
    stop_busy(); /* a child of a process amid a call of another thread's: not tested here */
    const struct span *reg = &registered[in_below(N_REGISTERED)];
    volatile unsigned char *mine = reg->live ? (unsigned char *)(uintptr_t)reg->ptr : NULL;
    unsigned char before = mine ? *mine : 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr d = 0;
        unsigned v = 0;
        if (mine) *mine = (unsigned char)(before + 1);
        if (cuMemAlloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED) _exit(2);
        if (initialized) _exit(cuInit(0) == CUDA_ERROR_NOT_INITIALIZED ? 0 : 6);
        if (cuInit(0) != CUDA_SUCCESS) _exit(0);
        if (cuMemAlloc(&d, 4096) != CUDA_SUCCESS) _exit(3);
        if (cuMemsetD32(d, 0x5eed, 1024) || cuMemcpyDtoH(&v, d, 4) || v != 0x5eed) _exit(4);
        _exit(cuMemFree(d) == CUDA_SUCCESS ? 0 : 5);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return;
    if (WIFSIGNALED(status))
        fail("a forked child died of signal %d", WTERMSIG(status));
    else if (WEXITSTATUS(status))
        fail("a forked child's CUDA calls went wrong (exit %d)", WEXITSTATUS(status));
    if (mine && *mine != before)
        fail("a forked child's write to registered memory reached the parent");
}

/* Gone at once, with whatever it holds and has queued: gpushared must reclaim it all. */
static void op_exit(void) {
    if (in_u8() < 4) {
        printf("driver fuzz: exits now, after %lu ops\n", ops_run);
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
}

static const struct op process_ops[] = {
    {"init", op_init},
    {"thread", op_thread},
    {"fork", op_fork},
    {"exit", op_exit},
    {"busy thread", op_busy},
};
static const unsigned n_process_ops = sizeof process_ops / sizeof process_ops[0];

/* Gives back what it holds (or, half the time, leaves that to gpushared). */
static void finish(void) {
    op_name = "finish";
    stop_busy();
    if (!initialized || in_u8() & 1) return;
    end_captures();
    for (int i = 0; i < N_ALLOCS; i++)
        if (allocs[i].live) R(cuMemFree(allocs[i].ptr));
    for (int i = 0; i < N_PINNED; i++)
        if (pinned[i].live) R(cuMemFreeHost((void *)(uintptr_t)pinned[i].ptr));
    for (int i = 0; i < N_REGISTERED; i++)
        if (registered[i].live) R(cuMemHostUnregister((void *)(uintptr_t)registered[i].ptr));
    for (int i = 0; i < N_STREAMS; i++)
        if (streams[i]) cuStreamDestroy(streams[i]);
    for (int i = 0; i < N_EVENTS; i++)
        if (events[i]) cuEventDestroy(events[i]);
    for (int i = 0; i < N_MODULES; i++)
        if (modules[i]) cuModuleUnload(modules[i]);
    R(cuCtxSynchronize(NULL));
}

static const struct {
    const struct op *ops;
    const unsigned *n;
} tables[] = {{process_ops, &n_process_ops},
              {memory_ops, &n_memory_ops},
              {work_ops, &n_work_ops},
              {query_ops, &n_query_ops}};
#define N_TABLES (sizeof tables / sizeof tables[0])

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        printf("FAIL usage: %s INPUT | --ops\n", argv[0]);
        return 1;
    }
    if (!strcmp(argv[1], "--ops")) {
        for (unsigned t = 0; t < N_TABLES; t++)
            for (unsigned i = 0; i < *tables[t].n; i++) printf("%s\n", tables[t].ops[i].name);
        return 0;
    }
    trace = getenv("DRIVER_FUZZ_TRACE") != NULL;
    read_input(argv[1]);
    load_driver();
    for (int i = 0; i < N_HOSTS; i++) {
        hosts[i] = mmap(NULL, HOST_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
        if (hosts[i] == MAP_FAILED) {
            printf("FAIL mmap\n");
            return 1;
        }
        memset(hosts[i], 0x11 * (i + 1), HOST_BYTES);
    }
    /* Most inputs start as programs do; some call the driver before cuInit. */
    if (in_below(8)) {
        if (R(cuInit(0)) == CUDA_SUCCESS) {
            initialized = 1;
            R(cuDeviceGet(&device, 0));
            R(cuDevicePrimaryCtxRetain(&primary, device));
            R(cuCtxSetCurrent(primary));
        }
    }
    unsigned n_ops = 0;
    for (unsigned t = 0; t < N_TABLES; t++) n_ops += *tables[t].n;
    while (!in_done() && ops_run < 4000) {
        unsigned i = in_below(n_ops), t = 0;
        for (; i >= *tables[t].n; t++) i -= *tables[t].n;
        const struct op *op = &tables[t].ops[i];
        op_name = op->name;
        ops_run++;
        if (trace) printf("op %lu: %s (at %.3f s)\n", ops_run, op->name, seconds());
        op->run();
    }
    finish();
    printf("driver fuzz: %lu ops, %lu calls, %lu errors; the busy thread checked %lu rounds\n",
           ops_run, calls, errors, busy_rounds);
    if (failures) {
        printf("driver fuzz: %d findings\n", failures);
        return 1;
    }
    return 0;
}
