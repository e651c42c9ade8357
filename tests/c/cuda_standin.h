/* The stand-in CUDA program of tests/consolidated.rs: the few driver types it needs (CI has no
 * CUDA headers), the entry points it obtains through cuGetProcAddress, and its checks. */
#ifndef CONSOLIDATED_APP_H
#define CONSOLIDATED_APP_H

#include <stddef.h>
#include <stdio.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* CUipcMemHandle and CUipcEventHandle: 64 opaque bytes, passed by value. */
typedef struct {
    char reserved[64];
} CUipcHandle;

/* The virtual memory API's types, as cuda.h lays them out. */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int id;
} CUmemLocation;
typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* CUDA graphs' types, as cuda.h lays them out. */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct {
    CUfunction func;
    unsigned gridDimX, gridDimY, gridDimZ;
    unsigned blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned value;
    unsigned elementSize;
    size_t width;
    size_t height;
} CUDA_MEMSET_NODE_PARAMS;
typedef struct {
    int result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;
typedef struct {
    void (*fn)(void *);
    void *userData;
} CUDA_HOST_NODE_PARAMS;
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_GRAPH_NODE_TYPE_KERNEL 0
#define CU_GRAPH_NODE_TYPE_MEMCPY 1
#define CU_GRAPH_NODE_TYPE_MEMSET 2
#define CU_GRAPH_NODE_TYPE_EMPTY 5
#define CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE 910

#define CUDA_CB
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 0x1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY 83
#define CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS 89

/* Every entry point the program uses, as CUDA 13 programs get them (version 13000). */
#define ENTRY_POINTS(X)                                                                       \
    X(cuInit, (unsigned))                                                                     \
    X(cuDriverGetVersion, (int *))                                                            \
    X(cuDeviceGet, (CUdevice *, int))                                                         \
    X(cuDeviceGetCount, (int *))                                                              \
    X(cuDeviceGetName, (char *, int, CUdevice))                                               \
    X(cuDeviceGetAttribute, (int *, int, CUdevice))                                           \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                      \
    X(cuCtxSetCurrent, (CUcontext))                                                           \
    X(cuCtxGetCurrent, (CUcontext *))                                                         \
    X(cuCtxGetDevice, (CUdevice *, CUcontext))                                                \
    X(cuCtxCreate, (CUcontext *, void *, unsigned, CUdevice))                                 \
    X(cuCtxDestroy, (CUcontext))                                                              \
    X(cuCtxSynchronize, (CUcontext))                                                          \
    X(cuCtxGetStreamPriorityRange, (int *, int *))                                            \
    X(cuCtxEnablePeerAccess, (CUcontext, unsigned))                                           \
    X(cuDeviceCanAccessPeer, (int *, CUdevice, CUdevice))                                     \
    X(cuCtxDisablePeerAccess, (CUcontext))                                                    \
    X(cuGetErrorName, (CUresult, const char **))                                              \
    X(cuGetExportTable, (const void **, const CUuuid *))                                      \
    X(cuMemAlloc, (CUdeviceptr *, size_t))                                                    \
    X(cuMemFree, (CUdeviceptr))                                                               \
    X(cuMemGetInfo, (size_t *, size_t *))                                                     \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned))                                   \
    X(cuMemHostAlloc, (void **, size_t, unsigned))                                            \
    X(cuMemFreeHost, (void *))                                                                \
    X(cuMemHostRegister, (void *, size_t, unsigned))                                          \
    X(cuMemHostUnregister, (void *))                                                          \
    X(cuMemHostGetDevicePointer, (CUdeviceptr *, void *, unsigned))                           \
    X(cuPointerGetAttribute, (void *, int, CUdeviceptr))                                      \
    X(cuMemcpyHtoD, (CUdeviceptr, const void *, size_t))                                      \
    X(cuMemcpyDtoH, (void *, CUdeviceptr, size_t))                                            \
    X(cuMemcpyDtoD, (CUdeviceptr, CUdeviceptr, size_t))                                       \
    X(cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream))                       \
    X(cuMemcpyDtoHAsync, (void *, CUdeviceptr, size_t, CUstream))                             \
    X(cuMemcpyDtoDAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                        \
    X(cuMemcpy, (CUdeviceptr, CUdeviceptr, size_t))                                           \
    X(cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                            \
    X(cuMemcpyPeer, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t))                 \
    X(cuMemsetD8, (CUdeviceptr, unsigned char, size_t))                                       \
    X(cuMemsetD16, (CUdeviceptr, unsigned short, size_t))                                     \
    X(cuMemsetD32, (CUdeviceptr, unsigned, size_t))                                           \
    X(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))                        \
    X(cuMemsetD16Async, (CUdeviceptr, unsigned short, size_t, CUstream))                      \
    X(cuMemsetD32Async, (CUdeviceptr, unsigned, size_t, CUstream))                            \
    X(cuStreamCreate, (CUstream *, unsigned))                                                 \
    X(cuStreamCreateWithPriority, (CUstream *, unsigned, int))                                \
    X(cuStreamGetFlags, (CUstream, unsigned *))                                               \
    X(cuStreamGetPriority, (CUstream, int *))                                                 \
    X(cuStreamGetId, (CUstream, unsigned long long *))                                        \
    X(cuStreamQuery, (CUstream))                                                              \
    X(cuStreamSynchronize, (CUstream))                                                        \
    X(cuStreamDestroy, (CUstream))                                                            \
    X(cuStreamWaitEvent, (CUstream, CUevent, unsigned))                                       \
    X(cuEventCreate, (CUevent *, unsigned))                                                   \
    X(cuEventRecord, (CUevent, CUstream))                                                     \
    X(cuEventQuery, (CUevent))                                                                \
    X(cuEventSynchronize, (CUevent))                                                          \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                        \
    X(cuEventDestroy, (CUevent))                                                              \
    X(cuModuleLoadData, (CUmodule *, const void *))                                           \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                            \
    X(cuModuleUnload, (CUmodule))                                                             \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
                       unsigned, CUstream, void **, void **))                                  \
    X(cuMemGetAllocationGranularity, (size_t *, const CUmemAllocationProp *, int))            \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))  \
    X(cuMemAddressFree, (CUdeviceptr, size_t))                                                \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,      \
                    unsigned long long))                                                      \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                           \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                                      \
    X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                 \
    X(cuMemGetAccess, (unsigned long long *, const CUmemLocation *, CUdeviceptr))             \
    X(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *, void *))                  \
    X(cuMemGetAllocationPropertiesFromHandle, (CUmemAllocationProp *,                         \
                                               CUmemGenericAllocationHandle))                 \
    X(cuMemExportToShareableHandle, (void *, CUmemGenericAllocationHandle, int,               \
                                     unsigned long long))                                     \
    X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, int))          \
    X(cuLaunchHostFunc, (CUstream, void (*)(void *), void *))                                 \
    X(cuStreamAddCallback, (CUstream, void (*)(CUstream, CUresult, void *), void *, unsigned)) \
    X(cuTensorMapEncodeTiled, (void *, int, unsigned, void *, const unsigned long long *,      \
                               const unsigned long long *, const unsigned *, const unsigned *, \
                               int, int, int, int))                                           \
    X(cuTensorMapReplaceAddress, (void *, void *))                                         \
    X(cuIpcGetMemHandle, (CUipcHandle *, CUdeviceptr))                                        \
    X(cuIpcOpenMemHandle, (CUdeviceptr *, CUipcHandle, unsigned))                             \
    X(cuIpcCloseMemHandle, (CUdeviceptr))                                                     \
    X(cuIpcGetEventHandle, (CUipcHandle *, CUevent))                                          \
    X(cuIpcOpenEventHandle, (CUevent *, CUipcHandle))                                         \
    X(cuModuleGetFunctionCount, (unsigned *, CUmodule))                                       \
    X(cuModuleEnumerateFunctions, (CUfunction *, unsigned, CUmodule))                         \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice))                                  \
    X(cuDeviceGetMemPool, (CUmemoryPool *, CUdevice))                                         \
    X(cuDeviceSetMemPool, (CUdevice, CUmemoryPool))                                           \
    X(cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *))                              \
    X(cuMemPoolDestroy, (CUmemoryPool))                                                       \
    X(cuMemPoolSetAttribute, (CUmemoryPool, int, void *))                                     \
    X(cuMemPoolGetAttribute, (CUmemoryPool, int, void *))                                     \
    X(cuMemPoolTrimTo, (CUmemoryPool, size_t))                                                \
    X(cuMemPoolSetAccess, (CUmemoryPool, const CUmemAccessDesc *, size_t))                    \
    X(cuMemPoolGetAccess, (unsigned long long *, CUmemoryPool, CUmemLocation *))              \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))               \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                     \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                \
    X(cuStreamBeginCapture, (CUstream, int))                                                  \
    X(cuStreamBeginCaptureToGraph, (CUstream, CUgraph, const CUgraphNode *, const void *,     \
                                    size_t, int))                                             \
    X(cuStreamEndCapture, (CUstream, CUgraph *))                                              \
    X(cuGraphCreate, (CUgraph *, unsigned))                                                   \
    X(cuGraphDestroy, (CUgraph))                                                              \
    X(cuGraphAddKernelNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t,             \
                             const CUDA_KERNEL_NODE_PARAMS *))                                \
    X(cuGraphAddMemcpyNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t,             \
                             const CUDA_MEMCPY3D *, CUcontext))                               \
    X(cuGraphAddMemsetNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t,             \
                             const CUDA_MEMSET_NODE_PARAMS *, CUcontext))                     \
    X(cuGraphAddEmptyNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t))             \
    X(cuGraphAddHostNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t,               \
                           const CUDA_HOST_NODE_PARAMS *))                                    \
    X(cuGraphAddChildGraphNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t,         \
                                 CUgraph))                                                    \
    X(cuGraphAddDependencies, (CUgraph, const CUgraphNode *, const CUgraphNode *,             \
                               const void *, size_t))                                         \
    X(cuGraphGetNodes, (CUgraph, CUgraphNode *, size_t *))                                    \
    X(cuGraphGetRootNodes, (CUgraph, CUgraphNode *, size_t *))                                \
    X(cuGraphGetEdges, (CUgraph, CUgraphNode *, CUgraphNode *, void *, size_t *))             \
    X(cuGraphNodeGetDependentNodes, (CUgraphNode, CUgraphNode *, void *, size_t *))           \
    X(cuGraphNodeGetType, (CUgraphNode, int *))                                               \
    X(cuGraphNodeGetDependencies, (CUgraphNode, CUgraphNode *, void *, size_t *))             \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long))              \
    X(cuGraphLaunch, (CUgraphExec, CUstream))                                                 \
    X(cuGraphExecDestroy, (CUgraphExec))                                                      \
    X(cuGraphExecMemsetNodeSetParams, (CUgraphExec, CUgraphNode,                              \
                                       const CUDA_MEMSET_NODE_PARAMS *, CUcontext))           \
    X(cuGraphExecUpdate, (CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *))               \
    X(cuGraphExecChildGraphNodeSetParams, (CUgraphExec, CUgraphNode, CUgraph))                \
    X(cuGraphNodeSetEnabled, (CUgraphExec, CUgraphNode, unsigned))

/* The per-thread-default-stream forms it uses (asked for with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), under a `pt_` prefix. */
#define PER_THREAD_ENTRY_POINTS(X)                                                            \
    X(cuMemsetD32Async, (CUdeviceptr, unsigned, size_t, CUstream))                            \
    X(cuMemcpyDtoH, (void *, CUdeviceptr, size_t))                                            \
    X(cuEventRecord, (CUevent, CUstream))                                                     \
    X(cuStreamSynchronize, (CUstream))                                                        \
    X(cuStreamGetId, (CUstream, unsigned long long *))

#define DECLARE(name, args) extern CUresult (*name) args;
#define DECLARE_PT(name, args) extern CUresult (*pt_##name) args;
ENTRY_POINTS(DECLARE)
PER_THREAD_ENTRY_POINTS(DECLARE_PT)
#undef DECLARE
#undef DECLARE_PT

/* ---- checks ---------------------------------------------------------------------------- */

extern int failures;
const char *error_name(CUresult r);

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            failures++;                                                                       \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                            \
            printf(__VA_ARGS__);                                                              \
            printf("\n");                                                                     \
            fflush(stdout);                                                                   \
        }                                                                                     \
    } while (0)

/* A call that must give `want`. */
#define EXPECT(call, want)                                                                    \
    do {                                                                                      \
        CUresult r_ = (call), w_ = (want);                                                    \
        if (r_ != w_) {                                                                       \
            failures++;                                                                       \
            printf("FAIL %s:%d: %s gave %d (%s), want %d (%s)\n", __FILE__, __LINE__, #call,  \
                   r_, error_name(r_), w_, error_name(w_));                                   \
            fflush(stdout);                                                                   \
        }                                                                                     \
    } while (0)
#define OK(call) EXPECT(call, CUDA_SUCCESS)

/* Sections print `section NAME: ok` when none of their checks failed. */
void section_begin(const char *name);
void section_end(void);
/* Says a line (printf's format) and waits for one on stdin: the test's go-ahead. */
void go_ahead(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* ---- the sections (cuda_standin_memory.c, cuda_standin_streams.c) ---------------------- */

extern CUdevice device;
/* How many devices the program sees (a job's several with STANDIN_DEVICES). */
extern int devices;
extern CUcontext primary;

void check_export_tables(void);
void check_allocation(size_t quota);
void check_copies(size_t bytes);
void check_fork(void);
void check_memsets(size_t bytes);
void check_streams(void);
void check_events(void);
void check_default_streams(void);
void check_deferred_errors(void);
void check_unsupported(void);
void check_host_functions(void);
void run_host_hang(void);
void run_timer_records(unsigned long long micros);
void run_timer_held(unsigned long long micros);
void check_tensor_maps(void);
void check_memory_pools(void);
void run_ipc_export(const char *self, unsigned seed, long uid, const char *expect);
void run_ipc_import(const char *mhex, const char *ehex, unsigned seed, const char *expect);
void check_virtual_memory(size_t quota);
void run_vmm_holding(unsigned seed);
void run_vmm_export(const char *self, unsigned seed, long uid, const char *expect);
void run_vmm_import(int fd, unsigned seed, const char *expect);
void check_graphs(void);
void run_graph_holding(void);
void run_graph_spin(unsigned long count, unsigned long long micros, unsigned blocks);
void run_free_busy(const char *self);
void run_reuse_check(int in, int out);
void run_several_devices(unsigned seed);
void run_gpus_holding(unsigned seed);

/* Test data: byte `i` of pattern `seed`. */
unsigned char pattern_byte(size_t i, unsigned seed);
void fill_pattern(unsigned char *p, size_t n, unsigned seed);
/* The first index where `p` differs from pattern `seed`, or `n`. */
size_t pattern_mismatch(const unsigned char *p, size_t n, unsigned seed);

#endif
