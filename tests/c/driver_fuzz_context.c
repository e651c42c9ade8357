/* The driver fuzzer's contexts and queries (see driver_fuzz.c): contexts made, destroyed,
 * pushed and popped, the primary context, device queries with hostile ordinals, attributes
 * and buffer lengths, cuGetProcAddress of names real, unimplemented and made up, and
 * cuGetExportTable of tables known and unknown.
 *
 * Contexts are never freed by the driver, so one destroyed must stay refused. */
#define _GNU_SOURCE
#include "driver_fuzz.h"

#include <string.h>

static int ctx_live[N_CTXS];

/* ---- contexts --------------------------------------------------------------------------- */

static void op_ctx(void) {
    CUcontext c = pick_ctx(), got = NULL, before = NULL;
    CUdevice dev = in_below(4) ? 0 : (CUdevice)in_u32();
    unsigned flags = in_below(2) ? in_below(8) : in_u32(), u = 0;
    int v = 0, v2 = 0, slot = slot_of((void *const *)ctxs, N_CTXS, c);
    unsigned long long id = 0;
    size_t limit = 0;
    switch (in_below(14)) {
    case 0: {
        int null_out = in_below(8) == 0;
        cuCtxGetCurrent(&before);
        CUresult r = R(cuCtxCreate(null_out ? NULL : &got, in_below(8) ? NULL : junk_handle(),
                                   flags, dev));
        if (null_out) {
            cuCtxGetCurrent(&got);
            if (r == CUDA_SUCCESS || got != before)
                fail("cuCtxCreate(NULL) gave %s and made %p current (was %p)", error_name(r),
                     (void *)got, (void *)before);
        } else if (r == CUDA_SUCCESS) {
            unsigned i = in_below(N_CTXS);
            ctxs[i] = got, ctx_live[i] = 1;
        }
        break;
    }
    case 1:
        if (R(cuCtxDestroy(c)) != CUDA_SUCCESS) break;
        if (slot < 0 || !ctx_live[slot])
            fail("cuCtxDestroy(%p), no live context made here, succeeded", (void *)c);
        else
            ctx_live[slot] = 0;
        break;
    case 2: R(cuCtxPushCurrent(c)); break;
    case 3: R(cuCtxPopCurrent(in_below(4) ? &got : NULL)); break;
    case 4: R(cuCtxSetCurrent(c)); break;
    case 5: R(cuCtxGetCurrent(in_below(8) ? &got : NULL)); break;
    case 6: R(cuCtxSynchronize(c)); break;
    case 7: R(cuCtxGetDevice(in_below(8) ? &dev : NULL, c)); break;
    case 8:
        R(cuCtxGetFlags(in_below(8) ? &u : NULL));
        R(cuCtxSetFlags(flags));
        R(cuCtxGetId(c, in_below(8) ? &id : NULL));
        R(cuCtxGetApiVersion(c, in_below(8) ? &u : NULL));
        break;
    case 9: {
        int which = in_below(4) ? (int)in_below(12) - 1 : (int)in_u32();
        R(cuCtxSetLimit(which, in_hostile()));
        R(cuCtxGetLimit(in_below(8) ? &limit : NULL, which));
        break;
    }
    case 10:
        R(cuCtxSetCacheConfig((int)in_u32()));
        R(cuCtxGetCacheConfig(in_below(8) ? &v : NULL));
        R(cuCtxGetStreamPriorityRange(in_below(2) ? &v : NULL, in_below(2) ? &v2 : NULL));
        break;
    case 11: R(cuDevicePrimaryCtxRetain(in_below(8) ? &got : NULL, dev)); break;
    case 12: R(cuDevicePrimaryCtxRelease(dev)); break;
    default:
        R(cuDevicePrimaryCtxGetState(dev, in_below(4) ? &u : NULL, in_below(4) ? &v : NULL));
        R(cuDevicePrimaryCtxSetFlags(dev, flags));
        if (in_below(4) == 0) R(cuDevicePrimaryCtxReset(dev));
    }
}

/* ---- queries, lookups and export tables ------------------------------------------------- */

static void op_device_query(void) {
    static char text[300];
    static unsigned char props[512];
    CUdevice dev = in_below(4) ? 0 : (CUdevice)in_u32(), got = 0;
    int v = 0, minor = 0, len = (int[]){-1, 0, 1, 5, 256, 300}[in_below(6)];
    size_t bytes = 0;
    CUuuid uuid;
    const char *s = NULL;
    switch (in_below(10)) {
    case 0: R(cuDeviceGet(in_below(8) ? &got : NULL, (int)in_hostile())); break;
    case 1: R(cuDeviceGetCount(in_below(8) ? &v : NULL)); break;
    case 2: R(cuDeviceGetName(in_below(8) ? text : NULL, len, dev)); break;
    case 3: R(cuDeviceGetAttribute(in_below(8) ? &v : NULL,
                                   in_below(4) ? (int)in_below(160) - 2 : (int)in_u32(), dev));
            break;
    case 4:
        R(cuDeviceGetUuid(in_below(8) ? &uuid : NULL, dev));
        R(cuDeviceTotalMem(in_below(8) ? &bytes : NULL, dev));
        R(cuDeviceComputeCapability(in_below(8) ? &v : NULL, in_below(8) ? &minor : NULL, dev));
        break;
    case 5: R(cuDeviceGetPCIBusId(in_below(8) ? text : NULL, len, dev)); break;
    case 6:
        for (unsigned i = 0, n = in_below(20); i < n; i++) text[i] = (char)(in_u8() | 1);
        text[in_below(20)] = 0;
        R(cuDeviceGetByPCIBusId(in_below(8) ? &got : NULL, in_below(8) ? text : NULL));
        break;
    case 7: R(cuDeviceGetProperties(in_below(8) ? props : NULL, dev)); break;
    case 8: R(cuDriverGetVersion(in_below(8) ? &v : NULL)); break;
    default: {
        CUresult code = in_below(2) ? (CUresult)in_below(1000) : (CUresult)in_u32();
        /* Unknown codes are the caller's to ask about: not a result to check. */
        cuGetErrorName(code, in_below(8) ? &s : NULL);
        cuGetErrorString(code, in_below(8) ? &s : NULL);
    }
    }
}

static void op_proc_address(void) {
    static const char *const names[] = {
        "cuMemAlloc",  "cuLaunchKernel",   "cuStreamCreate", "cuGetProcAddress", "cuCtxCreate",
        "cuMemCreate", "cuTexObjectCreate", "cuArrayCreate", "cuMemPrefetchAsync", "",
        "cuNoSuch",    "cuMemcpyHtoD_v2",  "cuMemMap",
    };
    /* Entries that are stubs in every form: safe to call without arguments. */
    static const int stub_from = 5, stub_to = 8;
    static char junk[80];
    unsigned i = in_below(sizeof names / sizeof names[0] + 2);
    const char *name = i < sizeof names / sizeof names[0] ? names[i] : junk;
    if (i == sizeof names / sizeof names[0]) {
        for (unsigned k = 0, n = in_below(79); k < n; k++) junk[k] = (char)(in_u8() | 1);
        junk[in_below(79)] = 0;
    } else if (i > sizeof names / sizeof names[0]) {
        name = NULL;
    }
    void *fn = NULL;
    int status = -1;
    int version = (int[]){13000, 12080, 0, -1, 1000, 99999}[in_below(6)];
    CUresult r = R(get_proc_address(name, in_below(16) ? &fn : NULL, version,
                                    in_below(4) ? in_below(4) : in_u64(),
                                    in_below(8) ? &status : NULL));
    if (r == CUDA_SUCCESS && fn && (int)i >= stub_from && (int)i <= stub_to) {
        CUresult (*stub)(void);
        memcpy(&stub, &fn, sizeof fn);
        R(stub());
    }
}

static void op_export_table(void) {
    static const char *const ids[] = {
        "6bd5fb6c5bf4e74a8987d93912fd9df9", "42d85a8123f6cb478298f6e78a3aecdc",
        "d4082055bde6704b8d34ba123c66e1f2", "69a28e9f0000000000000000000000",
    };
    CUuuid id;
    unsigned i = in_below(sizeof ids / sizeof ids[0] + 1);
    for (int k = 0; k < 16; k++) {
        unsigned v = in_u8();
        if (i < sizeof ids / sizeof ids[0] && ids[i][2 * k]) sscanf(ids[i] + 2 * k, "%2x", &v);
        id.bytes[k] = (unsigned char)v;
    }
    const void *table = NULL;
    R(cuGetExportTable(in_below(8) ? &table : NULL, in_below(8) ? &id : NULL));
}

const struct op query_ops[] = {
    {"context", op_ctx},
    {"context", op_ctx},
    {"device query", op_device_query},
    {"cuGetProcAddress", op_proc_address},
    {"cuGetExportTable", op_export_table},
};
const unsigned n_query_ops = sizeof query_ops / sizeof query_ops[0];
