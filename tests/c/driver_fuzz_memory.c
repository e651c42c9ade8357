/* The driver fuzzer's memory operations (see driver_fuzz.c): allocations and frees, copies
 * of every kind, memsets, page-locked and registered host memory, pointer queries, and the
 * data checks, which must see exactly what they wrote whatever came before.
 *
 * Host pointers the fuzzer passes are always its own memory, valid for the length it passes
 * (CUDA's contract; a driver may read them), except where the device side of the call must
 * fail first: no live allocation is larger than any host buffer. */
#define _GNU_SOURCE
#include "driver_fuzz.h"

#include <string.h>
#include <sys/mman.h>

#define PAGE 4096ull

/* A copy's or memset's outcome on memory the program does not hold: it must have failed. */
static void must_fail_outside(const char *call, CUresult r, uint64_t p, uint64_t len) {
    if (r == CUDA_SUCCESS && len && !in_live_alloc(p, len))
        fail("%s on [%#llx, +%llu), which no live allocation holds, succeeded", call,
             (unsigned long long)p, (unsigned long long)len);
}

/* Whether [p, p + len) touches the busy thread's allocation (under busy_lock). */
static int touches_busy(uint64_t p, uint64_t len) {
    if (!busy_running || !busy_ptr) return 0;
    uint64_t end = len > UINT64_MAX - p ? UINT64_MAX : p + (len ? len : 1);
    return p < busy_ptr + busy_len && busy_ptr < end;
}

/* Takes busy_lock for a copy or memset on device ranges a and b (length 0: none), unless one
 * touches the busy thread's allocation: that memory is the program's own, so the call would
 * succeed, and its writes would spoil the busy thread's check. Then it returns 0 and the
 * operation is left out. The busy thread neither allocates nor frees while the lock is held. */
static int lock_clear_of_busy(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
    pthread_mutex_lock(&busy_lock);
    if ((alen && touches_busy(a, alen)) || (blen && touches_busy(b, blen))) {
        pthread_mutex_unlock(&busy_lock);
        return 0;
    }
    return 1;
}

/* A size no allocation here may have: between the largest the fuzzer makes and the hostile
 * ones (which fail on any device), it would only cost memory. */
static uint64_t alloc_size(void) {
    uint64_t size;
    switch (in_below(6)) {
    case 0: size = in_hostile(); break;
    case 1: size = MAX_ALLOC; break;
    case 2: size = 1 + in_below(4096); break;
    default: size = 1 + in_u32() % MAX_ALLOC;
    }
    return size > MAX_ALLOC && size < (1ull << 40) ? MAX_ALLOC : size;
}

static void op_alloc(void) {
    uint64_t size = alloc_size();
    int null_out = in_below(16) == 0, async = in_below(4) == 0;
    CUstream s = async ? pick_stream() : NULL;
    size_t free0 = 0, free1 = 0, total = 0;
    if (null_out) R(cuMemGetInfo(&free0, &total));
    CUdeviceptr p = 0, *out = null_out ? NULL : &p;
    CUresult r = async ? R(cuMemAllocAsync(out, size, s)) : R(cuMemAlloc(out, size));
    if (null_out) {
        if (r == CUDA_SUCCESS) fail("cuMemAlloc(NULL, %llu) succeeded", (unsigned long long)size);
        if (R(cuMemGetInfo(&free1, &total)) == CUDA_SUCCESS && free0 && free1 < free0 &&
            !busy_running)
            fail("cuMemAlloc(NULL, %llu) failed, yet took %zu bytes", (unsigned long long)size,
                 free0 - free1);
    }
    if (r != CUDA_SUCCESS || null_out) return;
    if (size > MAX_ALLOC) {
        fail("cuMemAlloc(%llu) succeeded on a device far smaller", (unsigned long long)size);
        R(cuMemFree(p));
        return;
    }
    unsigned slot = span_slot(allocs, N_ALLOCS);
    if (allocs[slot].live && R(cuMemFree(allocs[slot].ptr)) != CUDA_SUCCESS)
        fail("freeing a live allocation failed");
    allocs[slot] = (struct span){p, size, 1};
}

static void op_free(void) {
    struct span *a = &allocs[in_below(N_ALLOCS)];
    uint64_t p;
    switch (in_below(6)) {
    case 0: p = a->ptr + 1 + in_below(4096); break;
    case 1: p = (uint64_t)(uintptr_t)junk_handle(); break;
    case 2: p = 0; break;
    default: p = a->ptr;
    }
    pthread_mutex_lock(&busy_lock);
    if (busy_running && busy_ptr && p >= busy_ptr && p < busy_ptr + busy_len) {
        pthread_mutex_unlock(&busy_lock);
        return;
    }
    CUresult r = in_below(4) ? R(cuMemFree(p)) : R(cuMemFreeAsync(p, pick_stream()));
    pthread_mutex_unlock(&busy_lock);
    if (r != CUDA_SUCCESS || !p) return;
    for (int i = 0; i < N_ALLOCS; i++)
        if (allocs[i].live && allocs[i].ptr == p) {
            allocs[i].live = 0;
            return;
        }
    fail("freeing %#llx, which starts no live allocation, succeeded", (unsigned long long)p);
}

static void op_htod(void) {
    uint64_t dst = pick_dptr(), len = in_len(MAX_ALLOC);
    const void *src = in_below(16) ? pick_host(len) : NULL;
    int sync = in_below(2);
    CUstream s = sync ? NULL : pick_stream();
    if (!lock_clear_of_busy(dst, len, 0, 0)) return;
    CUresult r = sync ? R(cuMemcpyHtoD(dst, src, len)) : R(cuMemcpyHtoDAsync(dst, src, len, s));
    pthread_mutex_unlock(&busy_lock);
    must_fail_outside("cuMemcpyHtoD", r, dst, len);
}

static void op_dtoh(void) {
    uint64_t src = pick_dptr(), len = in_len(MAX_ALLOC);
    void *dst = in_below(16) ? pick_host(len) : NULL;
    int form = in_below(3);
    CUstream s = form == 2 ? pick_stream() : NULL;
    if (!lock_clear_of_busy(src, len, 0, 0)) return;
    CUresult r;
    switch (form) {
    case 0: r = R(cuMemcpyDtoH(dst, src, len)); break;
    case 1: r = R(pt_cuMemcpyDtoH(dst, src, len)); break;
    default: r = R(cuMemcpyDtoHAsync(dst, src, len, s));
    }
    pthread_mutex_unlock(&busy_lock);
    must_fail_outside("cuMemcpyDtoH", r, src, len);
}

static void op_dtod(void) {
    uint64_t dst = pick_dptr(), len = in_len(MAX_ALLOC);
    /* Half the time the source overlaps the destination. */
    uint64_t src = in_below(2) ? pick_dptr() : dst + in_below(8192) - 4096;
    int sync = in_below(2);
    CUstream s = sync ? NULL : pick_stream();
    if (!lock_clear_of_busy(dst, len, src, len)) return;
    CUresult r = sync ? R(cuMemcpyDtoD(dst, src, len)) : R(cuMemcpyDtoDAsync(dst, src, len, s));
    pthread_mutex_unlock(&busy_lock);
    must_fail_outside("cuMemcpyDtoD (destination)", r, dst, len);
    must_fail_outside("cuMemcpyDtoD (source)", r, src, len);
}

/* One side of a unified copy (cuMemcpy): a live allocation, from an address inside it (the
 * length may run past its end), or host memory valid for `len`. Never a freed or made-up
 * address: the driver takes what is not device memory for host memory, as CUDA does. */
static uint64_t unified_side(uint64_t len, int *device) {
    const struct span *a = &allocs[in_below(N_ALLOCS)];
    *device = a->live && in_below(2);
    return *device ? a->ptr + in_u32() % a->size : (uint64_t)(uintptr_t)pick_host(len);
}

static void op_memcpy_unified(void) {
    uint64_t len = in_len(HOST_BYTES);
    if (len > HOST_BYTES) len = HOST_BYTES;
    int dst_dev, src_dev;
    uint64_t dst = unified_side(len, &dst_dev), src = unified_side(len, &src_dev);
    int sync = in_below(2);
    CUstream s = sync ? NULL : pick_stream();
    if (!lock_clear_of_busy(dst, dst_dev ? len : 0, src, src_dev ? len : 0)) return;
    CUresult r = sync ? R(cuMemcpy(dst, src, len)) : R(cuMemcpyAsync(dst, src, len, s));
    pthread_mutex_unlock(&busy_lock);
    if (dst_dev) must_fail_outside("cuMemcpy (destination)", r, dst, len);
    if (src_dev) must_fail_outside("cuMemcpy (source)", r, src, len);
}

static void op_memset(void) {
    uint64_t dst = pick_dptr();
    unsigned shift = in_below(3), value = in_u32();
    uint64_t count = in_len(MAX_ALLOC >> shift);
    uint64_t bytes = count > (UINT64_MAX >> shift) ? UINT64_MAX : count << shift;
    int form = in_below(shift == 2 ? 3 : 2);
    CUstream s = form ? pick_stream() : NULL;
    if (!lock_clear_of_busy(dst, bytes, 0, 0)) return;
    CUresult r;
    switch (shift * 3 + form) {
    case 0: r = R(cuMemsetD8(dst, (unsigned char)value, count)); break;
    case 1: r = R(cuMemsetD8Async(dst, (unsigned char)value, count, s)); break;
    case 3: r = R(cuMemsetD16(dst, (unsigned short)value, count)); break;
    case 4: r = R(cuMemsetD16Async(dst, (unsigned short)value, count, s)); break;
    case 6: r = R(cuMemsetD32(dst, value, count)); break;
    case 7: r = R(cuMemsetD32Async(dst, value, count, s)); break;
    default: r = R(pt_cuMemsetD32Async(dst, value, count, s));
    }
    pthread_mutex_unlock(&busy_lock);
    must_fail_outside("cuMemsetD*", r, dst, bytes);
}

static void op_memcpy_peer(void) {
    uint64_t dst = pick_dptr(), src = pick_dptr(), len = in_len(MAX_ALLOC);
    CUcontext dctx = pick_ctx(), sctx = pick_ctx();
    if (!lock_clear_of_busy(dst, len, src, len)) return;
    CUresult r = R(cuMemcpyPeer(dst, dctx, src, sctx, len));
    pthread_mutex_unlock(&busy_lock);
    must_fail_outside("cuMemcpyPeer (destination)", r, dst, len);
    must_fail_outside("cuMemcpyPeer (source)", r, src, len);
}

static void op_mem_info(void) {
    size_t free_bytes = 0, total = 0;
    unsigned which = in_below(4);
    CUresult r = R(cuMemGetInfo(which & 1 ? NULL : &free_bytes, which & 2 ? NULL : &total));
    if (r == CUDA_SUCCESS && (which || free_bytes > total))
        fail("cuMemGetInfo gave free %zu of %zu (NULLs: %u)", free_bytes, total, which);
    CUdeviceptr base = 0;
    size_t size = 0;
    uint64_t p = pick_dptr();
    which = in_below(4);
    /* The busy thread's allocation is the program's own too: an address in it has a range. */
    pthread_mutex_lock(&busy_lock);
    r = R(cuMemGetAddressRange(which & 1 ? NULL : &base, which & 2 ? NULL : &size, p));
    int busy_holds = touches_busy(p, 1);
    pthread_mutex_unlock(&busy_lock);
    if (r == CUDA_SUCCESS && !busy_holds && !in_live_alloc(p, 1))
        fail("cuMemGetAddressRange(%#llx), in no live allocation, succeeded",
             (unsigned long long)p);
}

static void op_host_alloc(void) {
    uint64_t size = in_below(3) ? 1 + in_u32() % MAX_ALLOC : in_hostile();
    if (size > MAX_ALLOC && size < (1ull << 40)) size = MAX_ALLOC;
    unsigned flags = in_below(2) ? in_below(16) : in_u32();
    void *p = NULL, **out = in_below(16) ? &p : NULL;
    CUresult r = in_below(4) ? R(cuMemHostAlloc(out, size, flags)) : R(cuMemAllocHost(out, size));
    if (r != CUDA_SUCCESS || !out) return;
    unsigned slot = span_slot(pinned, N_PINNED);
    if (pinned[slot].live) R(cuMemFreeHost((void *)(uintptr_t)pinned[slot].ptr));
    pinned[slot] = (struct span){(uint64_t)(uintptr_t)p, size, 1};
}

static void op_free_host(void) {
    const struct span *pin = &pinned[in_below(N_PINNED)];
    uint64_t p;
    switch (in_below(6)) {
    case 0: p = 0; break;
    case 1: p = (uint64_t)(uintptr_t)hosts[in_below(N_HOSTS)] + in_below(8192); break;
    case 2: p = registered[in_below(N_REGISTERED)].ptr; break;
    case 3: p = pin->ptr + 1 + in_below(8192); break;
    default: p = pin->ptr;
    }
    if (R(cuMemFreeHost((void *)(uintptr_t)p)) != CUDA_SUCCESS) return;
    for (int i = 0; i < N_PINNED; i++)
        if (pinned[i].live && pinned[i].ptr == p) {
            pinned[i].live = 0;
            return;
        }
    fail("cuMemFreeHost(%#llx), no page-locked allocation's start, succeeded",
         (unsigned long long)p);
}

static int overlaps_registered(uint64_t p, uint64_t len) {
    uint64_t lo = p / PAGE * PAGE, hi = (p + len + PAGE - 1) / PAGE * PAGE;
    for (int i = 0; i < N_REGISTERED; i++) {
        const struct span *r = &registered[i];
        uint64_t rlo = r->ptr / PAGE * PAGE, rhi = (r->ptr + r->size + PAGE - 1) / PAGE * PAGE;
        if (r->live && lo < rhi && rlo < hi) return 1;
    }
    return 0;
}

static void op_host_register(void) {
    unsigned h = in_below(N_HOSTS);
    uint64_t off = in_below(2) ? in_below(HOST_BYTES / PAGE) * PAGE : in_u32() % HOST_BYTES;
    /* Within the buffer, or so large that no address space holds it (never the program's
     * other memory: registering moves the pages it covers). */
    uint64_t len = in_below(4) ? 1 + in_u32() % (HOST_BYTES - off)
                               : (in_below(2) ? 0 : UINT64_MAX - in_below(1u << 16));
    unsigned flags = in_below(2) ? 0 : in_below(2) ? in_below(16) : in_u32();
    void *p = hosts[h] + off;
    int plain = 1;
    switch (in_below(8)) {
    case 0: p = NULL, plain = 0; break;
    case 1: { /* page-locked memory: shared already */
        const struct span *pin = &pinned[in_below(N_PINNED)];
        if (!pin->live) break;
        p = (void *)(uintptr_t)pin->ptr, plain = 0;
        if (len <= HOST_BYTES && len > pin->size) len = pin->size;
    }
    }
    int bad = !plain || !len || len > HOST_BYTES - off ||
              overlaps_registered((uint64_t)(uintptr_t)p, len);
    if (R(cuMemHostRegister(p, len, flags)) != CUDA_SUCCESS) return;
    if (bad) {
        fail("cuMemHostRegister(%p, %llu) succeeded (memory shared already, or not there)", p,
             (unsigned long long)len);
        return;
    }
    unsigned slot = span_slot(registered, N_REGISTERED);
    if (registered[slot].live) R(cuMemHostUnregister((void *)(uintptr_t)registered[slot].ptr));
    registered[slot] = (struct span){(uint64_t)(uintptr_t)p, len, 1};
}

static void op_host_unregister(void) {
    const struct span *reg = &registered[in_below(N_REGISTERED)];
    uint64_t p;
    switch (in_below(6)) {
    case 0: p = 0; break;
    case 1: p = (uint64_t)(uintptr_t)hosts[in_below(N_HOSTS)] + in_u32() % HOST_BYTES; break;
    case 2: p = pinned[in_below(N_PINNED)].ptr; break;
    case 3: p = reg->ptr + PAGE + in_below(8192); break;
    default: p = reg->ptr;
    }
    if (R(cuMemHostUnregister((void *)(uintptr_t)p)) != CUDA_SUCCESS) return;
    for (int i = 0; i < N_REGISTERED; i++)
        if (registered[i].live && registered[i].ptr / PAGE == p / PAGE) {
            registered[i].live = 0;
            return;
        }
    fail("cuMemHostUnregister(%#llx), in no registered range's first page, succeeded",
         (unsigned long long)p);
}

/* A host address for queries that only look it up: anything, freed or not. */
static void *any_host_address(void) {
    switch (in_below(5)) {
    case 0: return (void *)(uintptr_t)pinned[in_below(N_PINNED)].ptr;
    case 1: return (void *)(uintptr_t)(pinned[in_below(N_PINNED)].ptr + in_below(8192));
    case 2: return (void *)(uintptr_t)registered[in_below(N_REGISTERED)].ptr;
    case 3: return hosts[in_below(N_HOSTS)] + in_below(HOST_BYTES);
    default: return junk_handle();
    }
}

static void op_pointer_query(void) {
    static uint64_t data[8][8];
    void *p = any_host_address();
    CUdeviceptr d = 0;
    unsigned flags = 0;
    R(cuMemHostGetDevicePointer(in_below(8) ? &d : NULL, p, in_below(4) ? 0 : in_u32()));
    R(cuMemHostGetFlags(in_below(8) ? &flags : NULL, p));

    uint64_t ptr = in_below(2) ? pick_dptr() : (uint64_t)(uintptr_t)any_host_address();
    int attr = in_below(4) ? (int)in_below(24) : (int)in_u32();
    int null_data = in_below(16) == 0;
    CUresult r = R(cuPointerGetAttribute(null_data ? NULL : data[0], attr, ptr));
    unsigned kind = 0;
    memcpy(&kind, data[0], sizeof kind);
    if (!null_data && attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE && in_live_alloc(ptr, 1) &&
        (r != CUDA_SUCCESS || kind != CU_MEMORYTYPE_DEVICE))
        fail("the memory type of live device memory is %u (%s)", kind, error_name(r));

    int attrs[8];
    void *slots[8];
    unsigned n = in_below(9);
    for (unsigned i = 0; i < 8; i++) {
        attrs[i] = in_below(4) ? (int)in_below(24) : (int)in_u32();
        slots[i] = in_below(8) ? data[i] : NULL;
    }
    R(cuPointerGetAttributes(n, in_below(16) ? attrs : NULL, in_below(16) ? slots : NULL, ptr));
}

/* ---- the data checks ------------------------------------------------------------------- */

static unsigned char expect[MAX_ALLOC], back[MAX_ALLOC];

#define MUST(call)                                                                            \
    do {                                                                                      \
        CUresult r_ = R(call);                                                                \
        if (r_ != CUDA_SUCCESS) {                                                             \
            fail("data check: %s gave %s", #call, error_name(r_));                            \
            return;                                                                           \
        }                                                                                     \
    } while (0)

static void compare(const char *how, size_t n, unsigned seed) {
    size_t at = pattern_mismatch(back, n, seed);
    if (at != n)
        fail("data check (%s, %zu bytes): byte %zu reads %#x, wrote %#x", how, n, at, back[at],
             pattern_byte(at, seed));
}

/* Writes a pattern to [p, p + n) one way, reads it back another, and compares. */
static void check_span(uint64_t p, size_t n, unsigned seed) {
    fill_pattern(expect, n, seed);
    memset(back, 0, n);
    switch (seed % 4) {
    case 0: /* pageable, synchronous */
        MUST(cuMemcpyHtoD(p, expect, n));
        MUST(cuMemcpyDtoH(back, p, n));
        compare("pageable", n, seed);
        break;
    case 1: { /* a memset, then a device-to-device copy of it */
        size_t words = n / 4;
        MUST(cuMemsetD32(p, seed, words));
        MUST(cuMemcpyDtoH(back, p, words * 4));
        for (size_t i = 0; i < words; i++)
            if (memcmp(back + 4 * i, &seed, 4)) {
                fail("data check (memset, %zu words): word %zu is not %#x", words, i, seed);
                return;
            }
        MUST(cuMemcpyHtoD(p, expect, n));
        CUdeviceptr other = 0;
        MUST(cuMemAlloc(&other, n));
        CUresult copied = R(cuMemcpyDtoD(other, p, n));
        if (copied == CUDA_SUCCESS) copied = R(cuMemcpyDtoH(back, other, n));
        MUST(cuMemFree(other));
        if (copied != CUDA_SUCCESS) {
            fail("data check: a device to device copy and back gave %s", error_name(copied));
            return;
        }
        compare("device to device", n, seed);
        break;
    }
    default: { /* page-locked memory on a stream of its own */
        CUstream s = NULL;
        void *host = NULL;
        MUST(cuStreamCreate(&s, seed & 4 ? CU_STREAM_NON_BLOCKING : 0));
        MUST(cuMemHostAlloc(&host, n, 0));
        memcpy(host, expect, n);
        MUST(cuMemcpyHtoDAsync(p, host, n, s));
        MUST(cuStreamSynchronize(s));
        memset(host, 0, n);
        MUST(cuMemcpyDtoHAsync(host, p, n, s));
        MUST(cuStreamSynchronize(s));
        memcpy(back, host, n);
        MUST(cuMemFreeHost(host));
        MUST(cuStreamDestroy(s));
        compare("page-locked, on a stream", n, seed);
    }
    }
}

/* A copy larger than the arena it is staged through (64 MiB), in pieces several at a time. */
static void check_big(unsigned seed) {
    static unsigned char *src, *dst;
    size_t n = (17u << 20) + seed % (56u << 20);
    if (!src) {
        src = mmap(NULL, 73u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        dst = mmap(NULL, 73u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (src == MAP_FAILED || dst == MAP_FAILED) {
            src = NULL;
            return;
        }
    }
    fill_pattern(src, n, seed);
    memset(dst, 0, n);
    CUdeviceptr d = 0;
    MUST(cuMemAlloc(&d, n));
    CUresult r = R(cuMemcpyHtoD(d, src, n));
    if (r == CUDA_SUCCESS) r = R(cuMemcpyDtoH(dst, d, n));
    MUST(cuMemFree(d));
    if (r != CUDA_SUCCESS) {
        fail("data check: a copy of %zu bytes through the arena gave %s", n, error_name(r));
        return;
    }
    size_t at = pattern_mismatch(dst, n, seed);
    if (at != n) fail("data check (%zu bytes, through the arena): byte %zu differs", n, at);
}

/* After whatever came before, memory the program holds still reads as written, and a fresh
 * allocation works. */
static void op_check(void) {
    const struct span *a = &allocs[in_below(N_ALLOCS)];
    unsigned seed = in_u32();
    if (!initialized) return;
    end_captures();
    R(cuCtxSetCurrent(primary));
    /* The first synchronization reports what earlier work met; later ones find none. */
    int synced = 0;
    for (int i = 0; i < 3 && !synced; i++) synced = R(cuCtxSynchronize(NULL)) == CUDA_SUCCESS;
    if (!synced) {
        fail("cuCtxSynchronize keeps failing");
        return;
    }
    if (seed % 16 == 0) {
        check_big(seed);
        return;
    }
    if (a->live) {
        check_span(a->ptr, a->size, seed);
        return;
    }
    CUdeviceptr fresh = 0;
    size_t n = 1 + seed % MAX_ALLOC;
    MUST(cuMemAlloc(&fresh, n));
    check_span(fresh, n, seed);
    if (R(cuMemFree(fresh)) != CUDA_SUCCESS) fail("data check: freeing its allocation failed");
}

const struct op memory_ops[] = {
    {"alloc", op_alloc},
    {"free", op_free},
    {"htod", op_htod},
    {"dtoh", op_dtoh},
    {"dtod", op_dtod},
    {"memcpy", op_memcpy_unified},
    {"memset", op_memset},
    {"memset", op_memset},
    {"memcpy peer", op_memcpy_peer},
    {"mem info", op_mem_info},
    {"host alloc", op_host_alloc},
    {"free host", op_free_host},
    {"host register", op_host_register},
    {"host unregister", op_host_unregister},
    {"pointer query", op_pointer_query},
    {"check", op_check},
    {"check", op_check},
};
const unsigned n_memory_ops = sizeof memory_ops / sizeof memory_ops[0];
