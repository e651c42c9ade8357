/* The driver fuzzer of tests/driver_fuzz.rs: a stand-in CUDA program that calls gpushare's
 * libcuda.so.1 in the order, and with the arguments, an input byte string dictates. This
 * header: the entry points it uses beyond the stand-in's (cuda_standin.h), the input, the
 * handles it keeps, and the checks every call's result goes through. */
#ifndef DRIVER_FUZZ_H
#define DRIVER_FUZZ_H

#include "cuda_standin.h"

#include <pthread.h>
#include <stdint.h>

typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;

typedef struct {
    unsigned id;
    unsigned char pad[4];
    unsigned value[16];
} CUlaunchAttribute;

typedef struct {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_mem_bytes;
    CUstream stream;
    CUlaunchAttribute *attrs;
    unsigned num_attrs;
} CUlaunchConfig;

#define CUDA_ERROR_UNKNOWN 999
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* Entry points beyond the stand-in's, as CUDA 13 programs get them (version 13000). */
#define FUZZ_ENTRY_POINTS(X)                                                                  \
    X(cuGetErrorString, (CUresult, const char **))                                            \
    X(cuDeviceGetUuid, (CUuuid *, CUdevice))                                                  \
    X(cuDeviceTotalMem, (size_t *, CUdevice))                                                 \
    X(cuDeviceComputeCapability, (int *, int *, CUdevice))                                    \
    X(cuDeviceGetPCIBusId, (char *, int, CUdevice))                                           \
    X(cuDeviceGetByPCIBusId, (CUdevice *, const char *))                                      \
    X(cuDeviceGetProperties, (void *, CUdevice))                                              \
    X(cuDevicePrimaryCtxRelease, (CUdevice))                                                  \
    X(cuDevicePrimaryCtxReset, (CUdevice))                                                    \
    X(cuDevicePrimaryCtxGetState, (CUdevice, unsigned *, int *))                              \
    X(cuDevicePrimaryCtxSetFlags, (CUdevice, unsigned))                                       \
    X(cuCtxPushCurrent, (CUcontext))                                                          \
    X(cuCtxPopCurrent, (CUcontext *))                                                         \
    X(cuCtxGetDevice, (CUdevice *, CUcontext))                                                \
    X(cuCtxGetFlags, (unsigned *))                                                            \
    X(cuCtxSetFlags, (unsigned))                                                              \
    X(cuCtxGetId, (CUcontext, unsigned long long *))                                          \
    X(cuCtxGetApiVersion, (CUcontext, unsigned *))                                            \
    X(cuCtxGetLimit, (size_t *, int))                                                         \
    X(cuCtxSetLimit, (int, size_t))                                                           \
    X(cuCtxGetCacheConfig, (int *))                                                           \
    X(cuCtxSetCacheConfig, (int))                                                             \
    X(cuMemGetAddressRange, (CUdeviceptr *, size_t *, CUdeviceptr))                           \
    X(cuMemAllocHost, (void **, size_t))                                                      \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                     \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                \
    X(cuMemHostGetFlags, (unsigned *, void *))                                                \
    X(cuPointerGetAttributes, (unsigned, int *, void **, CUdeviceptr))                        \
    X(cuMemcpyPeer, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t))                 \
    X(cuEventRecordWithFlags, (CUevent, CUstream, unsigned))                                  \
    X(cuStreamGetCtx, (CUstream, CUcontext *))                                                \
    X(cuStreamGetDevice, (CUstream, CUdevice *))                                              \
    X(cuStreamIsCapturing, (CUstream, int *))                                                 \
    X(cuGraphAddNode, (CUgraphNode *, CUgraph, const CUgraphNode *, const void *, size_t,     \
                       void *))                                                               \
    X(cuModuleLoad, (CUmodule *, const char *))                                               \
    X(cuModuleLoadDataEx, (CUmodule *, const void *, unsigned, int *, void **))               \
    X(cuModuleGetGlobal, (CUdeviceptr *, size_t *, CUmodule, const char *))                   \
    X(cuLibraryLoadData, (CUlibrary *, const void *, int *, void **, unsigned, int *, void **, \
                          unsigned))                                                          \
    X(cuLibraryGetKernel, (CUkernel *, CUlibrary, const char *))                              \
    X(cuLibraryUnload, (CUlibrary))                                                           \
    X(cuKernelGetFunction, (CUfunction *, CUkernel))                                          \
    X(cuFuncGetAttribute, (int *, int, CUfunction))                                           \
    X(cuFuncSetAttribute, (CUfunction, int, int))                                             \
    X(cuFuncGetParamInfo, (CUfunction, size_t, size_t *, size_t *))                           \
    X(cuFuncGetName, (const char **, CUfunction))                                             \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, (int *, CUfunction, int, size_t))          \
    X(cuLaunchKernelEx, (const CUlaunchConfig *, CUfunction, void **, void **))               \
    X(cuLaunchCooperativeKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned,          \
                                  unsigned, unsigned, unsigned, CUstream, void **))

#define DECLARE_FUZZ(name, args) extern CUresult (*name) args;
FUZZ_ENTRY_POINTS(DECLARE_FUZZ)
#undef DECLARE_FUZZ

typedef CUresult (*GetProcAddress)(const char *, void **, int, unsigned long long, int *);
extern GetProcAddress get_proc_address;

/* ---- the input ------------------------------------------------------------------------- */

/* The next input bytes; zeros once it is used up (`in_done()` then says so). */
uint8_t in_u8(void);
uint32_t in_u32(void);
uint64_t in_u64(void);
int in_done(void);
/* A number below `n` (n > 0). */
unsigned in_below(unsigned n);
/* One of the values a boundary check cares about: 0, 1, all ones, the top bit, ... */
uint64_t in_hostile(void);
/* A length: mostly below `max`, sometimes 0, `max`, just past it, or hostile. */
uint64_t in_len(uint64_t max);

/* ---- what the program holds ------------------------------------------------------------ */

/* Largest device allocation and page-locked allocation the fuzzer makes (hostile sizes are
 * far larger, and fail); plain host buffers are this large, so a copy of any length a live
 * allocation admits has host memory to come from or go to. */
#define MAX_ALLOC (4u << 20)
#define HOST_BYTES MAX_ALLOC
#define N_ALLOCS 12
#define N_HOSTS 3
#define N_PINNED 6
#define N_REGISTERED 4
#define N_STREAMS 8
#define N_EVENTS 8
#define N_MODULES 8
#define N_FUNCS 8
#define N_CTXS 4
#define N_GRAPHS 4
#define N_EXECS 4

/* An allocation (live, or freed: its address then dangles). */
struct span {
    uint64_t ptr;
    uint64_t size;
    int live;
};

extern struct span allocs[N_ALLOCS];
extern unsigned char *hosts[N_HOSTS];
extern struct span pinned[N_PINNED];
extern struct span registered[N_REGISTERED];
extern CUstream streams[N_STREAMS];
extern CUevent events[N_EVENTS];
extern CUmodule modules[N_MODULES];
extern CUfunction funcs[N_FUNCS];
extern CUcontext ctxs[N_CTXS];
extern CUgraph graphs[N_GRAPHS];
extern CUgraphExec execs[N_EXECS];
extern int initialized;
/* Whether the busy thread works (allocating and freeing): memory totals move meanwhile. */
extern int busy_running;
/* The busy thread's allocation now, [busy_ptr, busy_ptr + busy_len) (0 when none), under
 * busy_lock: a hostile free of an address this thread once had must not take it (the
 * allocator hands freed addresses out again, and another thread's memory is the program's
 * own: no driver refuses to free it). */
extern pthread_mutex_t busy_lock;
extern uint64_t busy_ptr, busy_len;

/* Whether [p, p + len) lies inside one live allocation. */
int in_live_alloc(uint64_t p, uint64_t len);
/* A device address: a live allocation's (at an offset), a freed one, 0, or anything. */
uint64_t pick_dptr(void);
/* Host memory valid for `len` bytes (len <= HOST_BYTES): plain or page-locked. */
void *pick_host(uint64_t len);
/* A stream: one made here (live or destroyed), a special one, or garbage. */
CUstream pick_stream(void);
CUevent pick_event(void);
CUfunction pick_func(void);
CUcontext pick_ctx(void);
/* Garbage that looks like a handle; never dereferenced by a correct driver. */
void *junk_handle(void);
/* A handle's slot among `n` (live or not), or -1. */
int slot_of(void *const *slots, unsigned n, const void *h);
/* A slot of `n` spans to fill: one not live if any, else any (whose span the caller gives
 * back first, so that everything the program holds stays known). */
unsigned span_slot(const struct span *spans, unsigned n);

/* ---- results ----------------------------------------------------------------------------- */

/* Checks a call's result: a known CUresult, never CUDA_ERROR_UNKNOWN (the driver's answer to
 * its own panic); returns `r`. */
CUresult res(const char *call, CUresult r);
#define R(call) res(#call, (call))
/* A finding: prints `FAIL ...` and makes the program exit 1. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the operations (driver_fuzz_memory.c, _work.c, _context.c) ---------------------- */

typedef void (*Op)(void);
struct op {
    const char *name;
    Op run;
};
extern const struct op memory_ops[];
extern const unsigned n_memory_ops;
extern const struct op work_ops[];
extern const unsigned n_work_ops;
extern const struct op query_ops[];
extern const unsigned n_query_ops;

/* Ends every capture (so that a check can synchronize). */
void end_captures(void);

#endif
