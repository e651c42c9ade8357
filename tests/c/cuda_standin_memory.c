/* The stand-in program's memory checks: export tables, allocation against the quota, copies
 * (pageable, page-locked, registered; synchronous and on a stream), memsets, and the calls a
 * consolidated program cannot make. */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- export tables --------------------------------------------------------------------- */

/* The slots the libraries call (cuda_standin_export.c), a section of its own; weak, so that a
 * build of the program without that file still links (and skips it). */
void check_library_slots(void) __attribute__((weak));

static CUuuid uuid(const char *hex) {
    CUuuid u;
    for (int i = 0; i < 16; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        u.bytes[i] = (unsigned char)v;
    }
    return u;
}

/* Slot `i` of a table as a function pointer of type `T`. */
#define SLOT(T, table, i) ((T)slot_fn((table), (i)))
typedef void (*AnyFn)(void);
static AnyFn slot_fn(const void *table, int i) {
    AnyFn f;
    memcpy(&f, (const char *)table + 8 * i, sizeof f);
    return f;
}

static size_t slot_word(const void *table, int i) {
    size_t w;
    memcpy(&w, (const char *)table + 8 * i, sizeof w);
    return w;
}

void check_export_tables(void) {
    section_begin("export tables");
    /* The tables the CUDA runtime asks for, then cuBLASLt's and NVRTC's; context-local
     * storage's has no size header. */
    static const char *const ids[] = {
        "6bd5fb6c5bf4e74a8987d93912fd9df9", "42d85a8123f6cb478298f6e78a3aecdc",
        "a094798c2e742e7493f20800200c0a66", "c693336e1121df11a8c368f355d89593",
        "263e88607cd2614392f6bbd5006dfa7e", "d4082055bde6704b8d34ba123c66e1f2",
        "f8cff95121468b4eb9e2fb469e7c0dd9", "21318c60971432488ca641ff7324c8f2",
        "1734dc26800d47458726c0f1e7dd8bca", "da9151d33ae6cc41a5c04f26d533e328",
    };
    const void *tables[10] = {0};
    for (int t = 0; t < 10; t++) {
        CUuuid id = uuid(ids[t]);
        OK(cuGetExportTable(&tables[t], &id));
        CHECK(tables[t] != NULL, "table %s", ids[t]);
        if (!tables[t]) continue;
        if (t == 3) {
            for (int i = 0; i < 3; i++) CHECK(slot_word(tables[t], i) != 0, "storage slot %d", i);
        } else {
            size_t size = slot_word(tables[t], 0);
            CHECK(size >= 16 && size % 8 == 0 && size <= 8 * 256, "table %s size %zu", ids[t],
                  size);
            CHECK(slot_word(tables[t], 1) != 0, "table %s slot 1", ids[t]);
        }
    }
    CUuuid unknown = uuid("0123456789abcdef0123456789abcdef");
    const void *none = &none;
    EXPECT(cuGetExportTable(&none, &unknown), CUDA_ERROR_NOT_FOUND);
    if (failures) goto out;

    /* What the runtime calls through them. */
    CUcontext ctx = NULL;
    OK(SLOT(CUresult(*)(CUcontext *, CUdevice), tables[0], 2)(&ctx, device));
    CHECK(ctx == primary, "the runtime's primary context %p, not %p", (void *)ctx, (void *)primary);
    ctx = NULL;
    OK(SLOT(CUresult(*)(CUcontext *), tables[1], 2)(&ctx));
    CHECK(ctx == primary, "the tools' current context %p", (void *)ctx);
    int key = 0, value = 0;
    void *got = NULL;
    OK(SLOT(CUresult(*)(CUcontext, void *, void *, void *), tables[3], 0)(NULL, &key, &value, NULL));
    OK(SLOT(CUresult(*)(void **, CUcontext, void *), tables[3], 2)(&got, NULL, &key));
    CHECK(got == &value, "context-local storage gave %p back", got);
    OK(SLOT(CUresult(*)(CUcontext, void *), tables[3], 1)(NULL, &key));
    CHECK(SLOT(CUresult(*)(void **, CUcontext, void *), tables[3], 2)(&got, NULL, &key) != 0,
          "a deleted context-local value is gone");
    unsigned flags = 99;
    const void *detail = NULL;
    OK(SLOT(CUresult(*)(CUcontext, unsigned *, const void **), tables[4], 2)(primary, &flags,
                                                                                &detail));
    CHECK(flags == 0, "context check flags %u", flags);
    uint64_t digest[2] = {0, 0};
    OK(SLOT(CUresult(*)(unsigned, unsigned long long, uint64_t(*)[2]), tables[5], 1)(
        13000, (unsigned long long)time(NULL), &digest));
    CHECK(digest[0] || digest[1], "an integrity digest");
out:
    section_end();
    if (check_library_slots) check_library_slots();
}

/* ---- allocation ------------------------------------------------------------------------ */

void check_allocation(size_t quota) {
    section_begin("allocation");
    size_t free_bytes = 0, total = 0;
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(total == quota && free_bytes == quota, "free %zu of %zu, quota %zu", free_bytes, total,
          quota);
    CUdeviceptr a = 0, b = 0;
    OK(cuMemAlloc(&a, quota / 2));
    CHECK(a != 0, "an address");
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(total == quota && free_bytes == quota - quota / 2, "free %zu after allocating %zu",
          free_bytes, quota / 2);
    /* Past the quota: refused, and nothing changes. */
    EXPECT(cuMemAlloc(&b, quota - quota / 2 + 4096), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(free_bytes == quota - quota / 2, "free %zu after a refused allocation", free_bytes);
    EXPECT(cuMemAlloc(&b, 0), CUDA_ERROR_INVALID_VALUE);
    /* Nowhere to put the address: refused before anything is allocated. */
    EXPECT(cuMemAlloc(NULL, 4096), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(free_bytes == quota - quota / 2, "free %zu after cuMemAlloc(NULL)", free_bytes);
    unsigned type = 0;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 100));
    CHECK(type == CU_MEMORYTYPE_DEVICE, "memory type %u", type);
    OK(cuMemFree(a));
    EXPECT(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree(0x1234000), CUDA_ERROR_INVALID_VALUE);
    /* All of it, once the rest is free. */
    OK(cuMemAlloc(&b, quota));
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(free_bytes == 0, "free %zu with the whole quota allocated", free_bytes);
    EXPECT(cuMemAlloc(&a, 256), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemFree(b));
    OK(cuMemGetInfo(&free_bytes, &total));
    CHECK(free_bytes == quota, "free %zu at the end", free_bytes);
    section_end();
}

/* ---- copies ---------------------------------------------------------------------------- */

#define SAME(buf, n, seed, what)                                                              \
    do {                                                                                      \
        size_t at_ = pattern_mismatch((const unsigned char *)(buf), (n), (seed));             \
        CHECK(at_ == (n), "%s: byte %zu of %zu differs", (what), at_, (size_t)(n));           \
    } while (0)

/* A shared mapping of a /dev/shm file registered as it is, the way NCCL's shared-memory
 * transport registers the buffer its peer process maps too: a size that is no whole number of
 * pages, a device address for device code, copies both ways, and every mapping of the file
 * (here a second one, standing for the peer's) seeing the device's writes, during and after. */
static void check_shared_file(CUdeviceptr d, CUstream s) {
    const size_t n = 64 << 10, size = n + 4;
    char path[] = "/dev/shm/gpushare-standin-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "a /dev/shm file");
    if (fd < 0) return;
    CHECK(ftruncate(fd, (off_t)size) == 0, "sized");
    unsigned char *mine = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    unsigned char *peer = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(mine != MAP_FAILED && peer != MAP_FAILED, "mapped twice");
    if (mine == MAP_FAILED || peer == MAP_FAILED) return;
    /* Removed before registering, its descriptor still open, as NCCL's importing side does. */
    unlink(path);
    OK(cuMemHostRegister(mine, size, 0x1 | 0x2)); /* portable, device-mapped */
    close(fd);
    EXPECT(cuMemHostRegister(mine, size, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CUdeviceptr at = 0;
    OK(cuMemHostGetDevicePointer(&at, mine, 0));
    CHECK(at != 0, "a device address for the registered file");
    fill_pattern(peer, n, 9);
    OK(cuMemcpyHtoDAsync(d, mine, n, s));
    OK(cuStreamSynchronize(s));
    memset(peer, 0, n);
    OK(cuMemcpyDtoHAsync(mine, d, n, s));
    OK(cuStreamSynchronize(s));
    SAME(peer, n, 9, "the peer's mapping sees a copy into the registered file");
    OK(cuMemsetD8(at + 4096, 0x5a, 4096));
    OK(cuCtxSynchronize(NULL));
    CHECK(peer[4096] == 0x5a && peer[8191] == 0x5a, "the peer sees the device's writes");
    OK(cuMemHostUnregister(mine));
    peer[0] = 0x77;
    CHECK(mine[0] == 0x77, "still one file after unregistering");
    munmap(mine, size);
    munmap(peer, size);
}

void check_copies(size_t n) {
    section_begin("copies");
    unsigned char *src = malloc(n), *dst = malloc(n);
    CUdeviceptr d1 = 0, d2 = 0;
    CUstream s = NULL;
    CHECK(src && dst, "host memory");
    if (!src || !dst) goto out;
    OK(cuMemAlloc(&d1, n));
    OK(cuMemAlloc(&d2, n));
    OK(cuStreamCreate(&s, 0));

    /* Pageable, synchronous. */
    fill_pattern(src, n, 1);
    OK(cuMemcpyHtoD(d1, src, n));
    memset(dst, 0, n);
    OK(cuMemcpyDtoH(dst, d1, n));
    SAME(dst, n, 1, "pageable HtoD/DtoH");
    OK(cuMemcpyDtoD(d2, d1, n));
    memset(dst, 0, n);
    OK(cuMemcpyDtoH(dst, d2, n));
    SAME(dst, n, 1, "DtoD");

    /* Pageable, on a stream: the source may change once the call returns. */
    fill_pattern(src, n, 2);
    OK(cuMemcpyHtoDAsync(d1, src, n, s));
    fill_pattern(src, n, 3);
    OK(cuMemcpyDtoDAsync(d2, d1, n, s));
    memset(dst, 0, n);
    OK(cuMemcpyDtoHAsync(dst, d2, n, s));
    OK(cuStreamSynchronize(s));
    SAME(dst, n, 2, "pageable async");

    /* Page-locked (cuMemHostAlloc), on a stream. */
    unsigned char *pin = NULL, *pout = NULL;
    OK(cuMemHostAlloc((void **)&pin, n, 0));
    OK(cuMemHostAlloc((void **)&pout, n, 0));
    if (!pin || !pout) goto out;
    unsigned type = 0;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)pin));
    CHECK(type == CU_MEMORYTYPE_HOST, "page-locked memory type %u", type);
    CUdeviceptr mapped = 0;
    OK(cuMemHostGetDevicePointer(&mapped, pin, 0));
    CHECK(mapped != 0, "a device address for page-locked memory");
    fill_pattern(pin, n, 4);
    OK(cuMemcpyHtoDAsync(d1, pin, n, s));
    memset(pout, 0, n);
    OK(cuMemcpyDtoHAsync(pout, d1, n, s));
    OK(cuStreamSynchronize(s));
    SAME(pout, n, 4, "page-locked async");
    fill_pattern(pin, n, 5);
    OK(cuMemcpyHtoD(d2, pin, n));
    OK(cuMemcpyDtoH(pout, d2, n));
    SAME(pout, n, 5, "page-locked sync");

    /* Registered (cuMemHostRegister): the program's own pages keep their contents. */
    size_t len = (n + 4095) & ~(size_t)4095;
    unsigned char *reg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(reg != MAP_FAILED, "mmap");
    if (reg == MAP_FAILED) goto out;
    fill_pattern(reg, n, 6);
    OK(cuMemHostRegister(reg, len, 0));
    SAME(reg, n, 6, "registering kept the contents");
    EXPECT(cuMemHostRegister(reg, len, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    OK(cuMemcpyHtoDAsync(d1, reg, n, s));
    OK(cuStreamSynchronize(s)); /* page-locked memory is read when the copy runs */
    memset(reg, 0, n);
    OK(cuMemcpyDtoHAsync(reg, d1, n, s));
    OK(cuStreamSynchronize(s));
    SAME(reg, n, 6, "registered async");
    OK(cuMemHostUnregister(reg));
    EXPECT(cuMemHostUnregister(reg), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    /* Sizes past the end of the address space: refused. */
    EXPECT(cuMemHostRegister(reg, (size_t)-4096, 0), CUDA_ERROR_INVALID_VALUE);
    void *huge = NULL;
    EXPECT(cuMemHostAlloc(&huge, (size_t)-4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
    SAME(reg, n, 6, "unregistering kept the contents");
    munmap(reg, len);

    /* Unified addressing: cuMemcpy tells host from device. */
    fill_pattern(src, n, 7);
    OK(cuMemcpy(d2, (CUdeviceptr)src, n));
    memset(dst, 0, n);
    OK(cuMemcpy((CUdeviceptr)dst, d2, n));
    SAME(dst, n, 7, "cuMemcpy");
    OK(cuMemcpyAsync(d1, d2, n, s));
    memset(pout, 0, n);
    OK(cuMemcpyAsync((CUdeviceptr)pout, d1, n, s));
    OK(cuStreamSynchronize(s));
    SAME(pout, n, 7, "cuMemcpyAsync");

    /* Inside an allocation, at odd offsets. */
    fill_pattern(src, 777, 8);
    OK(cuMemcpyHtoD(d1 + 1001, src, 777));
    memset(dst, 0, 777);
    OK(cuMemcpyDtoH(dst, d1 + 1001, 777));
    SAME(dst, 777, 8, "offset copy");

    /* Outside any allocation: refused at once, as CUDA does, and nothing is left to report. */
    EXPECT(cuMemcpyHtoD(d1 + n - 4, src, 8), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyDtoH(dst, d1 + n, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyHtoDAsync(0x1000, src, 64, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyDtoDAsync(d1, 0x1000, 64, s), CUDA_ERROR_INVALID_VALUE);
    /* An address inside an allocation is device memory however long the copy: one running
     * past the allocation's end is refused, not taken for host memory. */
    EXPECT(cuMemcpy(d1 + n - 4, (CUdeviceptr)src, 8), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpy((CUdeviceptr)dst, d1 + 8, n), CUDA_ERROR_INVALID_VALUE);
    OK(cuCtxSynchronize(NULL));

    OK(cuMemFreeHost(pin));
    OK(cuMemFreeHost(pout));
    EXPECT(cuMemFreeHost(pin), CUDA_ERROR_INVALID_VALUE);
    check_shared_file(d1, s);
out:
    if (s) OK(cuStreamDestroy(s));
    if (d1) OK(cuMemFree(d1));
    if (d2) OK(cuMemFree(d2));
    free(src);
    free(dst);
    section_end();
}

/* ---- memsets --------------------------------------------------------------------------- */

void check_memsets(size_t n) {
    section_begin("memsets");
    n &= ~(size_t)3;
    unsigned char *h = malloc(n);
    CUdeviceptr d = 0;
    CUstream s = NULL;
    CHECK(h != NULL, "host memory");
    if (!h) goto out;
    OK(cuMemAlloc(&d, n));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    size_t bad = n;

    OK(cuMemsetD8(d, 0xa5, n));
    OK(cuMemcpyDtoH(h, d, n));
    for (size_t i = 0; i < n && bad == n; i++)
        if (h[i] != 0xa5) bad = i;
    CHECK(bad == n, "D8: byte %zu is %#x", bad, bad < n ? h[bad] : 0);

    OK(cuMemsetD16(d, 0xbeef, n / 2));
    OK(cuMemcpyDtoH(h, d, n));
    for (size_t i = 0; i < n / 2 && bad == n; i++)
        if (((uint16_t *)h)[i] != 0xbeef) bad = i;
    CHECK(bad == n, "D16: element %zu", bad);

    OK(cuMemsetD32(d, 0xdeadbeef, n / 4));
    OK(cuMemcpyDtoH(h, d, n));
    for (size_t i = 0; i < n / 4 && bad == n; i++)
        if (((uint32_t *)h)[i] != 0xdeadbeef) bad = i;
    CHECK(bad == n, "D32: element %zu", bad);

    /* A range inside: what is around it stays. */
    OK(cuMemsetD8(d, 0, n));
    OK(cuMemsetD32(d + 4096, 0x01020304, 1024));
    OK(cuMemcpyDtoH(h, d, n));
    for (size_t i = 0; i < n && bad == n; i++) {
        unsigned want = i >= 4096 && i < 8192 ? (unsigned)(4 - (i & 3)) : 0;
        if (h[i] != want) bad = i;
    }
    CHECK(bad == n, "D32 range: byte %zu is %u", bad, bad < n ? h[bad] : 0);

    /* On a stream, in order. */
    OK(cuMemsetD8Async(d, 0x11, n, s));
    OK(cuMemsetD16Async(d + n / 2, 0x2233, n / 4, s));
    OK(cuMemsetD32Async(d + 12, 0x44556677, 3, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemcpyDtoH(h, d, n));
    static const unsigned char word[4] = {0x77, 0x66, 0x55, 0x44};
    for (size_t i = 0; i < n && bad == n; i++) {
        unsigned want = i >= 12 && i < 24 ? word[i & 3] : i >= n / 2 ? (i & 1 ? 0x22 : 0x33) : 0x11;
        if (h[i] != want) bad = i;
    }
    CHECK(bad == n, "async memsets: byte %zu is %#x", bad, bad < n ? h[bad] : 0);

    EXPECT(cuMemsetD32(d + n - 4, 1, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemsetD8Async(0x1000, 1, 16, s), CUDA_ERROR_INVALID_VALUE);

    /* Page-locked host memory, by its address (unified addressing), in stream order as XLA
     * sets its flags. */
    uint32_t *pinned = NULL;
    OK(cuMemHostAlloc((void **)&pinned, 4096, 0));
    if (pinned) {
        memset(pinned, 0, 4096);
        OK(cuMemsetD32Async((CUdeviceptr)(size_t)pinned + 8, 0xcafef00d, 2, s));
        OK(cuStreamSynchronize(s));
        CHECK(pinned[1] == 0 && pinned[2] == 0xcafef00d && pinned[3] == 0xcafef00d &&
                  pinned[4] == 0,
              "host memset: %#x %#x %#x %#x", pinned[1], pinned[2], pinned[3], pinned[4]);
        EXPECT(cuMemsetD8Async((CUdeviceptr)(size_t)pinned + 4000, 1, 200, s),
               CUDA_ERROR_INVALID_VALUE);
        /* ... and as a copy's device side, both ways. */
        uint64_t word64 = 0, back64 = 0x0102030405060708ull;
        OK(cuMemcpyDtoHAsync(&word64, (CUdeviceptr)(size_t)pinned + 8, 8, s));
        OK(cuStreamSynchronize(s));
        CHECK(word64 == 0xcafef00dcafef00dull, "copied from host memory: %#llx",
              (unsigned long long)word64);
        OK(cuMemcpyHtoD((CUdeviceptr)(size_t)pinned + 16, &back64, 8));
        OK(cuCtxSynchronize(NULL)); /* the DMA from staging may still run, as with CUDA */
        CHECK(pinned[4] == 0x05060708u, "copied into host memory: %#x", pinned[4]);
        OK(cuMemFreeHost(pinned));
    }
out:
    if (s) OK(cuStreamDestroy(s));
    if (d) OK(cuMemFree(d));
    free(h);
    section_end();
}

/* ---- what is not supported ------------------------------------------------------------- */

void check_unsupported(void) {
    section_begin("unsupported");
    /* The device says so, as a driver without these features does. */
    int managed = -1, concurrent = -1;
    OK(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, device));
    OK(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, device));
    CHECK(managed == 0 && concurrent == 0, "managed memory %d, concurrent access %d", managed,
          concurrent);
    CUdeviceptr d = 0, m = 0;
    OK(cuMemAlloc(&d, 4096));
    CUcontext other = NULL;
    OK(cuCtxCreate(&other, NULL, 0, device));
    OK(cuCtxSetCurrent(primary));
    /* Nowhere to put the handle: no context is made, none made current. */
    CUcontext current = NULL;
    EXPECT(cuCtxCreate(NULL, NULL, 0, device), CUDA_ERROR_INVALID_VALUE);
    OK(cuCtxGetCurrent(&current));
    CHECK(current == primary, "current context %p after cuCtxCreate(NULL)", (void *)current);
    /* Each twice: one line on stderr per call all the same. */
    for (int i = 0; i < 2; i++) {
        EXPECT(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_NOT_SUPPORTED);
        EXPECT(cuCtxEnablePeerAccess(other, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    }
    /* Page-locked host memory from the virtual memory API, as NCCL probes it: the granularity
     * is told, the memory refused (NCCL then uses /dev/shm files, registered as they are). */
    CUmemAllocationProp host = {0};
    host.type = 1;
    host.requestedHandleTypes = 1;
    host.location.type = 3; /* CU_MEM_LOCATION_TYPE_HOST_NUMA */
    size_t hg = 0;
    OK(cuMemGetAllocationGranularity(&hg, &host, 0));
    CHECK(hg >= 4096, "host granularity %zu", hg);
    CUmemGenericAllocationHandle hh = 0;
    for (int i = 0; i < 2; i++) EXPECT(cuMemCreate(&hh, hg, &host, 0), CUDA_ERROR_NOT_SUPPORTED);
    /* Misuse gets the error it would get anyway. */
    EXPECT(cuCtxEnablePeerAccess(primary, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxEnablePeerAccess(other, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxDisablePeerAccess(other), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    OK(cuCtxDestroy(other));
    /* Nothing else was harmed. */
    OK(cuMemsetD8(d, 1, 4096));
    OK(cuCtxSynchronize(NULL));
    OK(cuMemFree(d));
    section_end();
}

/* ---- fork ------------------------------------------------------------------------------ */

/* A child's byte written at `p`: what the parent reads after the child has exited. */
static unsigned char after_child_writes(volatile unsigned char *p) {
    p[0] = 0x11;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        p[0] = 0x22;
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "the writing child ended with status %#x", status);
    return p[0];
}

/* What NVIDIA's driver gives a forked child (scripts/probes/fork_pinned.c on the H200): the
 * page-locked memory of cuMemAllocHost shared with the parent, registered memory its own
 * copy, and no CUDA at all. */
void check_fork(void) {
    section_begin("fork");
    void *pinned = NULL;
    OK(cuMemHostAlloc(&pinned, 1 << 20, 0));
    unsigned char seen = after_child_writes(pinned);
    CHECK(seen == 0x22, "a child's write to cuMemHostAlloc memory: the parent read %#x", seen);
    size_t len = 1 << 20;
    unsigned char *mine =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mine != MAP_FAILED, "mmap");
    if (mine == MAP_FAILED) return;
    memset(mine, 0x33, len);
    OK(cuMemHostRegister(mine + 100, len - 200, 0));
    seen = after_child_writes(mine + 4096);
    CHECK(seen == 0x11, "a child's write to registered memory: the parent read %#x", seen);
    /* The child's copy is whole; the parent's registration still works. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        for (size_t i = 4097; i < len; i++)
            if (mine[i] != 0x33) _exit(1);
        CUdeviceptr d = 0;
        if (cuMemAlloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED) _exit(2);
        if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) _exit(3);
        if (cuMemAlloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED) _exit(4);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0,
          "the child's memory or CUDA calls went wrong: status %#x", status);
    CUdeviceptr d = 0;
    OK(cuMemAlloc(&d, len));
    OK(cuMemcpyHtoD(d, mine, len));
    memset(mine, 0, len);
    OK(cuMemcpyDtoH(mine, d, len));
    CHECK(mine[len - 1] == 0x33 && mine[4096] == 0x11, "after the children: %#x %#x",
          mine[len - 1], mine[4096]);
    OK(cuMemFree(d));
    OK(cuMemHostUnregister(mine + 100));
    /* Unregistered, the pages are the program's private memory again, contents kept: a
     * child's write stays the child's, and the range may be registered anew. */
    seen = after_child_writes(mine + 8192);
    CHECK(seen == 0x11, "a child's write to unregistered memory: the parent read %#x", seen);
    CHECK(mine[len - 1] == 0x33, "unregistering kept the contents: %#x", mine[len - 1]);
    OK(cuMemHostRegister(mine, len, 0));
    OK(cuMemHostUnregister(mine));
    munmap(mine, len);
    OK(cuMemFreeHost(pinned));
    section_end();
}
