/* The virtual memory API as llama.cpp's pool, PyTorch's expandable segments and XLA use it:
 * granularity, a reservation, physical memory mapped into it piece by piece, copies across
 * pieces, a range grown by mapping the same memory into a bigger reservation, and the quota
 * counting physical memory from cuMemCreate until it is released and unmapped. */
#include "cuda_standin.h"

#include <stdlib.h>
#include <string.h>

static CUmemAllocationProp device_prop(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = 1;
    p.requestedHandleTypes = 1;
    p.location.type = 1;
    p.location.id = device;
    return p;
}

static size_t free_now(void) {
    size_t f = 0, t = 0;
    OK(cuMemGetInfo(&f, &t));
    return f;
}

void check_virtual_memory(size_t quota) {
    section_begin("virtual memory");
    int vmm = -1;
    OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                            device));
    CHECK(vmm == 1, "virtual memory management supported: %d", vmm);
    CUmemAllocationProp prop = device_prop();
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, 0));
    CHECK(g >= 4096 && (g & (g - 1)) == 0, "granularity %zu", g);
    if (!g || g > quota / 8) {
        section_end();
        return;
    }
    size_t start = free_now();

    /* A reservation of four granules, and two pieces of two granules mapped into it. */
    CUdeviceptr va = 0;
    OK(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    CHECK(va != 0 && va % g == 0, "reserved at %#llx", va);
    CHECK(free_now() == start, "address space costs no memory");
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0;
    OK(cuMemCreate(&h1, 2 * g, &prop, 0));
    OK(cuMemCreate(&h2, 2 * g, &prop, 0));
    CHECK(free_now() == start - 4 * g, "free %zu after making 4 granules (from %zu)", free_now(),
          start);
    EXPECT(cuMemCreate(&h3, g + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h3, quota, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemMap(va, 2 * g, 0, h1, 0));
    OK(cuMemMap(va + 2 * g, 2 * g, 0, h2, 0));
    CUmemAccessDesc rw = {{1, device}, 3};
    OK(cuMemSetAccess(va, 4 * g, &rw, 1));
    unsigned long long flags = 0;
    CUmemLocation here = {1, device};
    OK(cuMemGetAccess(&flags, &here, va + 3 * g));
    CHECK(flags == 3, "access %llu", flags);
    /* Access for the job's other GPU, as NCCL gives every peer as it allocates; with one
     * device, a device it does not see. */
    CUmemAccessDesc both[2] = {{{1, device}, 3}, {{1, (device + 1) % 2}, 3}};
    if (devices > 1) {
        OK(cuMemSetAccess(va, 4 * g, both, 2));
        CUmemLocation peer = {1, (device + 1) % 2};
        OK(cuMemGetAccess(&flags, &peer, va));
        CHECK(flags == 3, "the peer's access %llu", flags);
    } else {
        EXPECT(cuMemSetAccess(va, 4 * g, both, 2), CUDA_ERROR_INVALID_DEVICE);
    }

    /* Misuse. */
    EXPECT(cuMemMap(va + g, 2 * g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);     /* over a mapping */
    EXPECT(cuMemMap(va + 4 * g, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);     /* past the end */
    EXPECT(cuMemMap(va, 2 * g, g, h1, 0), CUDA_ERROR_INVALID_VALUE);         /* an offset */
    EXPECT(cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE);                     /* half a mapping */
    EXPECT(cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE);           /* still mapped */
    EXPECT(cuMemFree(va), CUDA_ERROR_INVALID_VALUE);                         /* not cuMemAlloc's */
    EXPECT(cuMemRelease(0x7777), CUDA_ERROR_INVALID_VALUE);

    /* Copies across the two pieces, both ways, and a memset and a device copy across too. */
    size_t n = 4 * g;
    unsigned char *host = malloc(n), *back = malloc(n);
    CHECK(host && back, "host buffers");
    if (!host || !back) {
        section_end();
        return;
    }
    fill_pattern(host, n, 29);
    OK(cuMemcpyHtoD(va, host, n));
    memset(back, 0, n);
    OK(cuMemcpyDtoH(back, va, n));
    CHECK(pattern_mismatch(back, n, 29) == n, "a copy across two mappings came back changed");
    OK(cuMemsetD8(va + 2 * g - 8, 0xab, 16));
    OK(cuMemcpyDtoH(back, va + 2 * g - 8, 16));
    CHECK(back[0] == 0xab && back[15] == 0xab, "a memset across the seam: %#x %#x", back[0],
          back[15]);
    OK(cuMemcpyHtoD(va, host, n));
    unsigned type = 0;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 3 * g + 5));
    CHECK(type == CU_MEMORYTYPE_DEVICE, "memory type %u", type);

    /* The handle behind an address, with a reference of its own; the properties it has. */
    CUmemGenericAllocationHandle got = 0;
    OK(cuMemRetainAllocationHandle(&got, (void *)(size_t)(va + 2 * g + 100)));
    CHECK(got == h2, "retained %llu, want %llu", got, h2);
    OK(cuMemRelease(got));
    CUmemAllocationProp back_prop;
    memset(&back_prop, 0xff, sizeof back_prop);
    OK(cuMemGetAllocationPropertiesFromHandle(&back_prop, h1));
    CHECK(back_prop.type == 1 && back_prop.location.type == 1 && back_prop.location.id == device &&
              back_prop.requestedHandleTypes == 1,
          "properties %d %d %d %d", back_prop.type, back_prop.location.type,
          back_prop.location.id, back_prop.requestedHandleTypes);

    /* Grown: the same memory mapped into a bigger reservation, then a third piece. */
    CUdeviceptr big = 0;
    OK(cuMemAddressReserve(&big, 8 * g, 0, 0, 0));
    OK(cuMemUnmap(va, 4 * g));
    OK(cuMemAddressFree(va, 4 * g));
    OK(cuMemMap(big, 2 * g, 0, h1, 0));
    OK(cuMemMap(big + 2 * g, 2 * g, 0, h2, 0));
    OK(cuMemCreate(&h3, 4 * g, &prop, 0));
    OK(cuMemMap(big + 4 * g, 4 * g, 0, h3, 0));
    OK(cuMemSetAccess(big, 8 * g, &rw, 1));
    memset(back, 0, n);
    OK(cuMemcpyDtoH(back, big, n));
    CHECK(pattern_mismatch(back, n, 29) == n, "memory mapped again lost its contents");
    OK(cuMemcpyDtoD(big + 4 * g, big, n));
    memset(back, 0, n);
    OK(cuMemcpyDtoH(back, big + 4 * g, n));
    CHECK(pattern_mismatch(back, n, 29) == n, "a device copy into the third piece");

    /* Released while mapped: the memory stays (and counts) until it is unmapped. */
    OK(cuMemRelease(h1));
    OK(cuMemRelease(h2));
    OK(cuMemRelease(h3));
    CHECK(free_now() == start - 8 * g, "free %zu with 8 granules mapped", free_now());
    OK(cuMemcpyDtoH(back, big, 16));
    CHECK(pattern_mismatch(back, 16, 29) == 16, "released memory still mapped");
    OK(cuMemUnmap(big, 8 * g));
    OK(cuMemAddressFree(big, 8 * g));
    EXPECT(cuMemAddressFree(big, 8 * g), CUDA_ERROR_INVALID_VALUE);
    CHECK(free_now() == start, "free %zu at the end, %zu at the start", free_now(), start);
    free(host);
    free(back);
    section_end();
}

/* Holds memory of the virtual memory API across whatever the test does meanwhile (a fault in
 * another process, and the device worker's replacement): two pieces mapped in a reservation
 * and a third made and filled, then unmapped but kept by its handle. Prints `holding`, waits
 * for a line on stdin, then checks all three, mapping the third again. */
void run_vmm_holding(unsigned seed) {
    section_begin("vmm holding");
    CUmemAllocationProp prop = device_prop();
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, 0));
    size_t n = 3 * g;
    unsigned char *host = malloc(n), *back = malloc(n);
    CHECK(host && back && g, "host buffers, granularity %zu", g);
    if (!host || !back || !g) return;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h[3] = {0, 0, 0};
    CUmemAccessDesc rw = {{1, device}, 3};
    OK(cuMemAddressReserve(&va, n, 0, 0, 0));
    for (int i = 0; i < 3; i++) {
        OK(cuMemCreate(&h[i], g, &prop, 0));
        OK(cuMemMap(va + i * g, g, 0, h[i], 0));
    }
    OK(cuMemSetAccess(va, n, &rw, 1));
    fill_pattern(host, n, seed);
    OK(cuMemcpyHtoD(va, host, n));
    OK(cuMemUnmap(va + 2 * g, g));
    go_ahead("holding %zu", n);
    OK(cuMemMap(va + 2 * g, g, 0, h[2], 0));
    OK(cuMemSetAccess(va + 2 * g, g, &rw, 1));
    memset(back, 0, n);
    OK(cuMemcpyDtoH(back, va, n));
    size_t at = pattern_mismatch(back, n, seed);
    CHECK(at == n, "held memory changed at byte %zu", at);
    OK(cuMemUnmap(va, n));
    for (int i = 0; i < 3; i++) OK(cuMemRelease(h[i]));
    OK(cuMemAddressFree(va, n));
    free(host);
    free(back);
    section_end();
}

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Memory one process made, taken by another through the descriptor
 * cuMemExportToShareableHandle gives: this process makes a granule, fills it with pattern
 * SEED, exports it, and starts itself in `vmm-import` mode with the descriptor (as Unix user
 * UID when not -1, which needs root), which checks the pattern and writes pattern SEED + 1,
 * or (EXPECT "refused") checks that the import is refused. */
void run_vmm_export(const char *self, unsigned seed, long uid, const char *expect) {
    section_begin("vmm export");
    int bus = -1;
    OK(cuDeviceGetAttribute(&bus, 33 /* PCI_BUS_ID */, device));
    printf("vmm export on bus %d\n", bus);
    CUmemAllocationProp prop = device_prop();
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, 0));
    unsigned char *host = malloc(g);
    CHECK(host && g, "host buffer, granularity %zu", g);
    if (!host || !g) return;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CUmemAccessDesc rw = {{1, device}, 3};
    OK(cuMemAddressReserve(&va, g, 0, 0, 0));
    OK(cuMemCreate(&h, g, &prop, 0));
    OK(cuMemMap(va, g, 0, h, 0));
    OK(cuMemSetAccess(va, g, &rw, 1));
    fill_pattern(host, g, seed);
    OK(cuMemcpyHtoD(va, host, g));
    OK(cuCtxSynchronize(NULL));
    int fd = -1;
    OK(cuMemExportToShareableHandle(&fd, h, 1, 0));
    CHECK(fd >= 0, "a descriptor: %d", fd);
    /* Not asked for at creation: CUDA refuses to export it. */
    CUmemAllocationProp plain = device_prop();
    plain.requestedHandleTypes = 0;
    CUmemGenericAllocationHandle h2 = 0;
    int fd2 = -1;
    OK(cuMemCreate(&h2, g, &plain, 0));
    EXPECT(cuMemExportToShareableHandle(&fd2, h2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemRelease(h2));
    if (fd >= 0) fcntl(fd, F_SETFD, 0);
    char fds[16], seeds[16];
    snprintf(fds, sizeof fds, "%d", fd);
    snprintf(seeds, sizeof seeds, "%u", seed);
    pid_t child = fork();
    if (child == 0) {
        if (uid >= 0 && (setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0)) _exit(9);
        /* The importer on another GPU of gpushared's, as a job's second process would be. */
        const char *gpu = getenv("STANDIN_IMPORTER_GPU");
        if (gpu) setenv("GPUSHARE_GPU", gpu, 1);
        execl(self, self, "vmm-import", fds, seeds, expect, (char *)NULL);
        _exit(8);
    }
    int status = -1;
    CHECK(child > 0 && waitpid(child, &status, 0) == child, "the importing process ran");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importing process failed: %#x",
          status);
    memset(host, 0, g);
    OK(cuMemcpyDtoH(host, va, g));
    unsigned want = strcmp(expect, "refused") ? seed + 1 : seed;
    size_t at = pattern_mismatch(host, g, want);
    CHECK(at == g, "after the other process: byte %zu is not pattern %u's", at, want);
    if (fd >= 0) close(fd);
    OK(cuMemUnmap(va, g));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, g));
    free(host);
    section_end();
}

void run_vmm_import(int fd, unsigned seed, const char *expect) {
    section_begin("vmm import");
    CUmemGenericAllocationHandle h = 0;
    if (!strcmp(expect, "refused")) {
        EXPECT(cuMemImportFromShareableHandle(&h, (void *)(size_t)fd, 1), 800 /* NOT_PERMITTED */);
        section_end();
        return;
    }
    int bus = -1;
    OK(cuDeviceGetAttribute(&bus, 33 /* PCI_BUS_ID */, device));
    printf("vmm import on bus %d\n", bus);
    OK(cuMemImportFromShareableHandle(&h, (void *)(size_t)fd, 1));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    OK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, 0));
    unsigned char *host = malloc(g);
    CHECK(host && g, "host buffer, granularity %zu", g);
    if (!host || !g) return;
    CUdeviceptr va = 0;
    CUmemAccessDesc rw = {{1, device}, 3};
    OK(cuMemAddressReserve(&va, g, 0, 0, 0));
    OK(cuMemMap(va, g, 0, h, 0));
    OK(cuMemSetAccess(va, g, &rw, 1));
    OK(cuMemcpyDtoH(host, va, g));
    size_t at = pattern_mismatch(host, g, seed);
    CHECK(at == g, "the exported memory differs at byte %zu", at);
    fill_pattern(host, g, seed + 1);
    OK(cuMemcpyHtoD(va, host, g));
    OK(cuCtxSynchronize(NULL));
    OK(cuMemUnmap(va, g));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, g));
    free(host);
    section_end();
}

/* A TMA tensor map over a device allocation: the GPU's driver makes it (in gpushared), so
 * on a GPU it is 128 bytes that are not all zero, and on the sim, which has no tensor maps,
 * the call fails cleanly with CUDA_ERROR_NOT_SUPPORTED. */
void check_tensor_maps(void) {
    section_begin("tensor maps");
    char name[256] = {0};
    OK(cuDeviceGetName(name, sizeof name, device));
    int sim = strstr(name, "sim") != NULL;
    CUdeviceptr d = 0;
    OK(cuMemAlloc(&d, 1 << 20));
    unsigned long long map[16];
    memset(map, 0, sizeof map);
    unsigned long long dim[2] = {256, 256}, strides[1] = {256 * 4};
    unsigned box[2] = {32, 32}, elem[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(map, 7 /* FLOAT32 */, 2, (void *)(size_t)d, dim, strides,
                                        box, elem, 0, 0, 0, 0);
    if (sim) {
        EXPECT(r, CUDA_ERROR_NOT_SUPPORTED);
    } else {
        EXPECT(r, CUDA_SUCCESS);
        int nonzero = 0;
        for (int i = 0; i < 16; i++) nonzero |= map[i] != 0;
        CHECK(nonzero, "a tensor map of zeros");
        OK(cuTensorMapReplaceAddress(map, (void *)(size_t)(d + 4096)));
    }
    EXPECT(cuTensorMapEncodeTiled(map, 99, 2, (void *)(size_t)d, dim, strides, box, elem, 0, 0,
                                  0, 0),
           sim ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuTensorMapEncodeTiled(map, 7, 9, (void *)(size_t)d, dim, strides, box, elem, 0, 0, 0,
                                  0),
           CUDA_ERROR_INVALID_VALUE);
    OK(cuMemFree(d));
    section_end();
}

/* Memory pools as cudaMallocAsync allocators use them: the default pool is the current one,
 * a pool made and made current serves cuMemAllocAsync, its attributes count what it holds. */
void check_memory_pools(void) {
    section_begin("memory pools");
    CUmemoryPool def = NULL, cur = NULL, mine = NULL;
    OK(cuDeviceGetDefaultMemPool(&def, device));
    OK(cuDeviceGetMemPool(&cur, device));
    CHECK(def && def == cur, "the default pool %p is the current one %p", def, cur);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = device;
    OK(cuMemPoolCreate(&mine, &props));
    unsigned long long threshold = ~0ull, got = 0;
    OK(cuMemPoolSetAttribute(mine, 4 /* RELEASE_THRESHOLD */, &threshold));
    OK(cuMemPoolGetAttribute(mine, 4, &got));
    CHECK(got == threshold, "release threshold %llu", got);
    CUstream s = NULL;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a = 0, b = 0;
    OK(cuMemAllocFromPoolAsync(&a, 1 << 20, mine, s));
    OK(cuDeviceSetMemPool(device, mine));
    OK(cuMemAllocAsync(&b, 4096, s));
    OK(cuMemsetD8Async(b, 3, 4096, s));
    unsigned long long used = 0, high = 0;
    OK(cuMemPoolGetAttribute(mine, 7 /* USED_MEM_CURRENT */, &used));
    CHECK(used == (1 << 20) + 4096, "used %llu", used);
    OK(cuMemFreeAsync(a, s));
    OK(cuMemPoolGetAttribute(mine, 7, &used));
    OK(cuMemPoolGetAttribute(mine, 8 /* USED_MEM_HIGH */, &high));
    CHECK(used == 4096 && high == (1 << 20) + 4096, "used %llu, high %llu", used, high);
    unsigned long long zero = 0, one = 1;
    EXPECT(cuMemPoolSetAttribute(mine, 8, &one), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemPoolSetAttribute(mine, 8, &zero));
    OK(cuMemPoolTrimTo(mine, 0));
    CUmemAccessDesc rw = {{1, device}, 3};
    OK(cuMemPoolSetAccess(mine, &rw, 1));
    unsigned long long flags = 0;
    CUmemLocation here = {1, device};
    OK(cuMemPoolGetAccess(&flags, mine, &here));
    CHECK(flags == 3, "pool access %llu", flags);
    OK(cuMemFreeAsync(b, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemPoolDestroy(mine));
    OK(cuDeviceGetMemPool(&cur, device));
    CHECK(cur == def, "the default pool is current again");
    EXPECT(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAllocFromPoolAsync(&a, 64, mine, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolCreate(&mine, NULL), CUDA_ERROR_INVALID_VALUE);
    OK(cuStreamDestroy(s));
    section_end();
}
