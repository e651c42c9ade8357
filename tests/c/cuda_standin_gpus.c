/* One process working on two devices (`gpushare run --gpus 2`, STANDIN_DEVICES=2): memory,
 * streams, events and kernels on each, a module loaded once and launched on both, copies
 * between the devices every way CUDA offers, and calls that name memory or a stream of the
 * other device than the current one. */
#include "cuda_standin.h"

#include <stdlib.h>
#include <string.h>

/* More than one piece of a copy between devices: 64 MiB through device memory, 16 MiB
 * through host memory. */
enum { BYTES = 72 << 20 };

static int ordinal_of(CUdeviceptr p) {
    int dev = -1;
    OK(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    return dev;
}

/* Physical memory made on device 0, mapped twice: in a range device 0 reserved and, with
 * device 1 current, in one device 1 reserved (as NCCL maps a peer's buffer within one
 * process). Each device's session numbers its handles alike, so a handle must name its
 * device: what is written through one mapping is read through the other. */
static void check_mapped_across(void) {
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.requestedHandleTypes = 0; /* not made to be exported: mapped across all the same */
    prop.location.type = 1;
    prop.location.id = 0;
    size_t g = 0;
    OK(cuMemGetAllocationGranularity(&g, &prop, 0));
    CUmemGenericAllocationHandle h = 0, made_on_1 = 0;
    CUdeviceptr va[2] = {0, 0};
    OK(cuMemCreate(&h, g, &prop, 0));
    prop.location.id = 1;
    OK(cuMemCreate(&made_on_1, g, &prop, 0)); /* device 1's first handle: a number like h's */
    for (int d = 0; d < 2; d++) {
        CUcontext c = NULL;
        OK(cuDevicePrimaryCtxRetain(&c, d));
        OK(cuCtxSetCurrent(c));
        OK(cuMemAddressReserve(&va[d], g, 0, 0, 0));
        OK(cuMemMap(va[d], g, 0, h, 0));
        CUmemAccessDesc rw = {{1, d}, 3};
        OK(cuMemSetAccess(va[d], g, &rw, 1));
    }
    static unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 13 + 7);
    CUcontext c0 = NULL, c1 = NULL;
    OK(cuDevicePrimaryCtxRetain(&c0, 0));
    OK(cuDevicePrimaryCtxRetain(&c1, 1));
    OK(cuCtxSetCurrent(c0));
    OK(cuMemcpyHtoD(va[0], in, sizeof in));
    OK(cuCtxSynchronize(NULL)); /* device 0's copy has landed */
    OK(cuCtxSetCurrent(c1));
    OK(cuMemcpyDtoH(out, va[1], sizeof out));
    CHECK(!memcmp(in, out, sizeof in), "device 0's memory read through device 1's mapping");
    /* Unmapped and freed with device 0 current, whichever device's range: one address space. */
    OK(cuCtxSetCurrent(c0));
    for (int d = 1; d >= 0; d--) {
        OK(cuMemUnmap(va[d], g));
        OK(cuMemAddressFree(va[d], g));
    }
    OK(cuMemRelease(h));
    OK(cuMemRelease(made_on_1));
}

void run_several_devices(unsigned seed) {
    static const char image[] = "gpushare-sim-module 1\nkernel spin\n";
    section_begin("several devices");
    CHECK(devices == 2, "%d devices, want 2", devices);
    if (devices != 2) return section_end();
    CUcontext ctx[2] = {NULL, NULL};
    CUdeviceptr mem[2] = {0, 0}, copy[2] = {0, 0};
    CUstream s[2] = {NULL, NULL};
    CUevent done[2] = {NULL, NULL};
    unsigned char *host = malloc(BYTES), *back = malloc(BYTES);
    CHECK(host && back, "host memory");
    if (!host || !back) return section_end();
    CUmodule module = NULL;
    CUfunction spin = NULL;
    for (int d = 0; d < 2; d++) OK(cuDevicePrimaryCtxRetain(&ctx[d], d));
    /* Loaded once, with device 0 current; launched on both. */
    OK(cuCtxSetCurrent(ctx[0]));
    OK(cuModuleLoadData(&module, image));
    OK(cuModuleGetFunction(&spin, module, "spin"));
    for (int d = 0; d < 2; d++) {
        OK(cuCtxSetCurrent(ctx[d]));
        CUdevice cur = -1;
        OK(cuCtxGetDevice(&cur, NULL));
        CHECK(cur == d, "current device %d, want %d", cur, d);
        OK(cuMemAlloc(&mem[d], BYTES));
        OK(cuMemAlloc(&copy[d], BYTES));
        OK(cuStreamCreate(&s[d], CU_STREAM_NON_BLOCKING));
        OK(cuEventCreate(&done[d], CU_EVENT_DISABLE_TIMING));
        fill_pattern(host, BYTES, seed + d);
        OK(cuMemcpyHtoDAsync(mem[d], host, BYTES, s[d]));
        unsigned long long micros = 20;
        void *args[] = {&micros};
        OK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s[d], args, NULL));
        OK(cuEventRecord(done[d], s[d]));
    }
    CHECK(mem[0] != mem[1], "two devices' memory at one address");
    CHECK(ordinal_of(mem[0]) == 0 && ordinal_of(mem[1]) == 1,
          "pointers name their own device whatever is current");

    /* Peer access between the GPUs (the sim's reach each other): gpushared maps device 0's
     * memory into device 1's context at its own addresses, made before and after. */
    int can = -1;
    OK(cuDeviceCanAccessPeer(&can, 1, 0));
    CHECK(can == 1, "device 1 reaches device 0: %d", can);
    OK(cuCtxEnablePeerAccess(ctx[0], 0));
    EXPECT(cuCtxEnablePeerAccess(ctx[0], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    check_mapped_across();

    /* Device 1 current: an event of device 0's, then a stream of device 0's. */
    OK(cuStreamWaitEvent(s[1], done[0], 0));
    OK(cuEventSynchronize(done[0]));
    OK(cuStreamSynchronize(s[0]));
    EXPECT(cuEventRecord(done[0], s[1]), CUDA_ERROR_INVALID_HANDLE);

    /* Copies between the devices: on device 1's stream from device 0's memory, peer, by
     * unified addressing, and device 1's memory read back with device 0 current. */
    OK(cuMemcpyDtoDAsync(copy[1], mem[0], BYTES, s[1]));
    OK(cuMemcpyPeer(copy[0], ctx[0], mem[1], ctx[1], BYTES));
    OK(cuCtxSetCurrent(ctx[0]));
    memset(back, 0, BYTES);
    OK(cuMemcpyDtoHAsync(back, copy[1], BYTES, s[1]));
    OK(cuStreamSynchronize(s[1]));
    size_t at = pattern_mismatch(back, BYTES, seed);
    CHECK(at == BYTES, "device 0's bytes copied to device 1 differ at %zu", at);
    memset(back, 0, BYTES);
    OK(cuMemcpy((CUdeviceptr)back, copy[0], BYTES));
    at = pattern_mismatch(back, BYTES, seed + 1);
    CHECK(at == BYTES, "device 1's bytes copied to device 0 differ at %zu", at);
    /* A memset of device 1's memory and a copy within it, device 0 current. */
    OK(cuMemsetD32(copy[1], seed, BYTES / 4));
    OK(cuMemcpyDtoD(copy[1], mem[1], BYTES / 2));
    memset(back, 0, BYTES);
    OK(cuMemcpyDtoH(back, copy[1], BYTES));
    at = pattern_mismatch(back, BYTES / 2, seed + 1);
    CHECK(at == BYTES / 2, "device 1's copy within itself differs at %zu", at);
    for (at = BYTES / 2; at < BYTES && !memcmp(back + at, &seed, 4); at += 4) {}
    CHECK(at == BYTES, "device 1's memset differs at %zu", at);

    /* Page-locked memory made with device 0 current serves device 1's stream both ways. */
    unsigned char *pinned = NULL;
    OK(cuMemHostAlloc((void **)&pinned, BYTES, 0));
    if (pinned) {
        fill_pattern(pinned, BYTES, seed + 5);
        OK(cuMemcpyHtoDAsync(copy[1], pinned, BYTES, s[1]));
        OK(cuMemsetD8Async(mem[1], 0, BYTES, s[1]));
        OK(cuMemcpyDtoDAsync(mem[1], copy[1], BYTES, s[1]));
        OK(cuStreamSynchronize(s[1])); /* the copy out of `pinned` is done */
        memset(pinned, 0, BYTES);
        OK(cuMemcpyDtoHAsync(pinned, mem[1], BYTES, s[1]));
        OK(cuStreamSynchronize(s[1]));
        at = pattern_mismatch(pinned, BYTES, seed + 5);
        CHECK(at == BYTES, "device 1's copy through page-locked memory differs at %zu", at);
        OK(cuCtxSetCurrent(ctx[1]));
        OK(cuMemFreeHost(pinned));
        OK(cuCtxSetCurrent(ctx[0]));
    }

    /* Each device's memory counts on its own GPU. */
    size_t free0 = 0, total0 = 0, free1 = 0, total1 = 0;
    OK(cuMemGetInfo(&free0, &total0));
    OK(cuCtxSetCurrent(ctx[1]));
    OK(cuMemGetInfo(&free1, &total1));
    CHECK(total0 - free0 >= 2 * BYTES && total1 - free1 >= 2 * BYTES,
          "in use: %zu on device 0, %zu on device 1", total0 - free0, total1 - free1);

    /* Freed with the other device current. */
    OK(cuCtxSetCurrent(ctx[0]));
    for (int d = 0; d < 2; d++) {
        OK(cuStreamDestroy(s[d]));
        OK(cuEventDestroy(done[d]));
        OK(cuMemFree(mem[d]));
        OK(cuMemFree(copy[d]));
    }
    OK(cuCtxSynchronize(NULL));
    OK(cuModuleUnload(module));
    free(host);
    free(back);
    section_end();
}

/* Memory of pattern SEED on each of two devices; prints `holding`, waits for a line on stdin
 * (the test faults one GPU meanwhile), then for each device prints `device D: NAME`, NAME the
 * first failed call's error name or `ok` after it checked the held memory, filled a fresh
 * buffer with a kernel and a memset and read it back. Exits 0 however the devices fared. */
void run_gpus_holding(unsigned seed) {
    enum { HELD = 1 << 20 };
    static unsigned char host[HELD], back[HELD];
    CUcontext ctx[2] = {NULL, NULL};
    CUdeviceptr held[2] = {0, 0};
    section_begin("holding on two devices");
    for (int d = 0; d < 2; d++) {
        OK(cuDevicePrimaryCtxRetain(&ctx[d], d));
        OK(cuCtxSetCurrent(ctx[d]));
        fill_pattern(host, HELD, seed + d);
        OK(cuMemAlloc(&held[d], HELD));
        OK(cuMemcpyHtoD(held[d], host, HELD));
    }
    section_end();
    printf("holding\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return;
    for (int d = 0; d < 2; d++) {
        const char *name = "ok";
        CUresult r = cuCtxSetCurrent(ctx[d]);
        CUdeviceptr fresh = 0;
        if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(back, held[d], HELD);
        if (r == CUDA_SUCCESS && pattern_mismatch(back, HELD, seed + d) != HELD) name = "CHANGED";
        if (r == CUDA_SUCCESS) r = cuMemAlloc(&fresh, HELD);
        if (r == CUDA_SUCCESS) r = cuMemsetD32(fresh, seed, HELD / 4);
        if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(back, fresh, HELD);
        if (r == CUDA_SUCCESS && memcmp(back, &seed, 4) != 0) name = "WRONG";
        if (r != CUDA_SUCCESS) cuGetErrorName(r, &name);
        printf("device %d: %s\n", d, name);
    }
}
