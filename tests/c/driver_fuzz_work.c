/* The driver fuzzer's work (see driver_fuzz.c): streams, events, modules (sim modules,
 * images cut short, made-up fat binaries and ELF headers), launches with hostile shapes and
 * arguments, capture and graphs.
 *
 * Stream and event ids are never reused, and modules never freed, so a handle destroyed once
 * must stay refused; graph handles are heap addresses a later graph may take, so only the
 * driver's survival is checked for them. */
#define _GNU_SOURCE
#include "driver_fuzz.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int stream_live[N_STREAMS], event_live[N_EVENTS], module_live[N_MODULES];

/* ---- streams and events ------------------------------------------------------------------ */

static void op_stream_create(void) {
    unsigned flags = in_below(4) ? in_below(2) : in_u32();
    unsigned slot = in_below(N_STREAMS);
    CUstream s = NULL, *out = in_below(16) ? &s : NULL;
    CUresult r = in_below(2) ? R(cuStreamCreate(out, flags))
                             : R(cuStreamCreateWithPriority(out, flags, (int)in_hostile()));
    if (r != CUDA_SUCCESS || !out) return;
    if (flags > 1) fail("cuStreamCreate with flags %#x succeeded", flags);
    if (stream_live[slot]) R(cuStreamDestroy(streams[slot])); /* every live one is known */
    streams[slot] = s, stream_live[slot] = 1;
}

static void op_stream_destroy(void) {
    CUstream s = pick_stream();
    int slot = slot_of((void *const *)streams, N_STREAMS, s);
    if (R(cuStreamDestroy(s)) != CUDA_SUCCESS) return;
    if (slot < 0 || !stream_live[slot])
        fail("cuStreamDestroy(%p), no live stream, succeeded", (void *)s);
    else
        stream_live[slot] = 0;
}

static void op_stream_use(void) {
    CUstream s = pick_stream();
    unsigned flags = 0;
    int priority = 0;
    unsigned long long id = 0;
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    switch (in_below(8)) {
    case 0: R(cuStreamSynchronize(s)); break;
    case 1: R(cuStreamQuery(s)); break;
    case 2: R(cuStreamWaitEvent(s, pick_event(), in_below(4) ? 0 : in_u32())); break;
    case 3: R(cuStreamGetFlags(s, in_below(8) ? &flags : NULL)); break;
    case 4: R(cuStreamGetPriority(s, in_below(8) ? &priority : NULL)); break;
    case 5: R(cuStreamGetId(s, in_below(8) ? &id : NULL)); break;
    case 6: R(cuStreamGetCtx(s, in_below(8) ? &ctx : NULL)); break;
    default: R(cuStreamGetDevice(s, in_below(8) ? &dev : NULL));
    }
}

static void op_event_create(void) {
    unsigned flags = in_below(2) ? in_below(8) : in_u32();
    unsigned slot = in_below(N_EVENTS);
    CUevent e = NULL, *out = in_below(16) ? &e : NULL;
    if (R(cuEventCreate(out, flags)) != CUDA_SUCCESS || !out) return;
    if (event_live[slot]) R(cuEventDestroy(events[slot]));
    events[slot] = e, event_live[slot] = 1;
}

static void op_event_destroy(void) {
    CUevent e = pick_event();
    int slot = slot_of((void *const *)events, N_EVENTS, e);
    if (R(cuEventDestroy(e)) != CUDA_SUCCESS) return;
    if (slot < 0 || !event_live[slot])
        fail("cuEventDestroy(%p), no live event, succeeded", (void *)e);
    else
        event_live[slot] = 0;
}

static void op_event_use(void) {
    CUevent e = pick_event();
    float ms = 0;
    switch (in_below(6)) {
    case 0: R(cuEventRecord(e, pick_stream())); break;
    case 1: R(cuEventRecordWithFlags(e, pick_stream(), in_below(4) ? 0 : in_u32())); break;
    case 2: R(pt_cuEventRecord(e, pick_stream())); break;
    case 3: R(cuEventQuery(e)); break;
    case 4: R(cuEventSynchronize(e)); break;
    default: R(cuEventElapsedTime(in_below(8) ? &ms : NULL, e, pick_event()));
    }
}

/* ---- modules ------------------------------------------------------------------------------ */

/* Where images are made; every extent an image's header claims lies inside it. */
static unsigned char img[128 << 10];

static const char *kernel_name(void) {
    static const char *const names[] = {"spin", "k1", "k_2", "nope", "", "a\xff\xfe"};
    static char name[6000];
    if (in_below(2)) return "spin";
    unsigned i = in_below(sizeof names / sizeof names[0] + 2);
    if (i < sizeof names / sizeof names[0]) return names[i];
    size_t n = i == sizeof names / sizeof names[0] ? 1 + in_below(40) : sizeof name - 1;
    for (size_t k = 0; k < n; k++) name[k] = "abcdefghijklmnopqrstuvwxyz_0123456789"[in_below(37)];
    name[n] = 0;
    return name;
}

static void put_u16(size_t at, uint16_t v) { memcpy(img + at, &v, 2); }
static void put_u32(size_t at, uint32_t v) { memcpy(img + at, &v, 4); }
static void put_u64(size_t at, uint64_t v) { memcpy(img + at, &v, 8); }

/* A sim module (gpushare's test format), maybe with a bad line, maybe cut short. */
static void sim_module(void) {
    size_t n = (size_t)snprintf((char *)img, 64, "gpushare-sim-module 1\nkernel spin\n");
    for (unsigned k = 0, count = in_below(4); k < count && n < 40000; k++)
        n += (size_t)snprintf((char *)img + n, 7000, "kernel %s\n", kernel_name());
    if (in_below(6) == 0) n += (size_t)snprintf((char *)img + n, 64, "kernel a b;rm\n");
    if (in_below(4) == 0) img[in_below((unsigned)n)] = 0;
}

/* An offset or size past anything an image may be (the driver's limit is 4 GiB). */
static uint64_t far(void) { return in_hostile() | (1ull << 33); }

/* An ELF64 header whose section and program tables, and sections, lie inside `img`, or
 * whose offsets are past anything an image may be. */
static void elf_image(void) {
    memcpy(img, "\x7f" "ELF", 4);
    img[4] = in_below(4) ? 2 : in_u8();
    uint64_t shoff = in_below(8) ? 0x40 * (1 + in_below(500)) : far(); /* past the header */
    uint16_t shentsize = (uint16_t[]){0x40, 0x40, 0x10, 0}[in_below(4)];
    uint16_t shnum = (uint16_t)in_below(64);
    put_u64(0x20, in_below(8) ? in_below(32 << 10) : far()); /* phoff */
    put_u64(0x28, shoff);
    put_u16(0x36, (uint16_t)in_below(64));                         /* phentsize */
    put_u16(0x38, (uint16_t)in_below(64));                         /* phnum */
    put_u16(0x3a, shentsize);
    put_u16(0x3c, shnum);
    if (shoff > (32 << 10)) return;
    for (unsigned i = 0; i < shnum; i++) {
        size_t sh = shoff + i * (size_t)(shentsize ? shentsize : 0x40);
        put_u32(sh + 4, in_below(4) ? 1 : 8); /* PROGBITS or NOBITS */
        put_u64(sh + 0x18, in_below(8) ? in_below(32 << 10) : far());
        put_u64(sh + 0x20, in_below(8) ? in_below(32 << 10) : far());
    }
}

/* A fat binary's header, body in `img`, or claiming one no image may have. */
static void fatbin_image(size_t at) {
    put_u32(at, 0xba55ed50);
    put_u16(at + 4, 1);
    put_u16(at + 6, (uint16_t)(in_below(4) ? 16 : in_below(4096)));
    put_u64(at + 8, in_below(6) ? in_below(32 << 10) : far());
    for (unsigned i = 0, n = in_below(64); i < n; i++) img[at + 16 + i] = in_u8();
}

/* Builds an image of a kind the input picks; returns it (NULL for the NULL image). */
static const void *make_image(void) {
    memset(img, 0, sizeof img);
    switch (in_below(14)) {
    case 0: return NULL;
    case 1: elf_image(); break;
    case 2: fatbin_image(0); break;
    case 3: /* the CUDA runtime's wrapper around a fat binary (or around NULL) */
        put_u32(0, 0x466243b1);
        put_u32(4, 1);
        fatbin_image(64 << 10);
        put_u64(8, in_below(4) ? (uint64_t)(uintptr_t)(img + (64 << 10)) : 0);
        break;
    case 4: snprintf((char *)img, 256, ".version 8.0\n.target sm_90\n.entry spin()\n{ ret; }\n");
            break;
    case 5: /* random bytes, never a magic the driver reads a length from */
        for (unsigned i = 0, n = 1 + in_below(4096); i < n; i++) img[i] = in_u8();
        img[0] = img[0] == 0x7f || img[0] == 0x50 || img[0] == 0xb1 ? 'x' : img[0];
        break;
    case 6: break; /* the empty string */
    default: sim_module();
    }
    return img;
}

/* The module each function was looked up in. */
static CUmodule func_module[N_FUNCS];

static int loaded(CUmodule m) {
    int slot = slot_of((void *const *)modules, N_MODULES, m);
    return slot >= 0 && module_live[slot];
}

static char module_path[64];

/* A module file: a sim module (in the working directory, the test's own), or a path that is
 * no module. */
static const char *module_file(void) {
    static const char *const others[] = {"/nonexistent/gpushare.ptx", "/", "/dev/null", ""};
    unsigned i = in_below(6);
    if (i < 4) return others[i];
    if (i == 4) return NULL;
    if (!module_path[0]) {
        snprintf(module_path, sizeof module_path, "driver-fuzz-%d.mod", (int)getpid());
        FILE *f = fopen(module_path, "w");
        if (!f) return NULL;
        fputs("gpushare-sim-module 1\nkernel spin\nkernel k1\n", f);
        fclose(f);
    }
    return module_path;
}

static void op_module_load(void) {
    unsigned slot = in_below(N_MODULES);
    CUmodule m = NULL, *out = in_below(16) ? &m : NULL;
    CUresult r;
    switch (in_below(5)) {
    case 0: r = R(cuModuleLoad(out, module_file())); break;
    case 1: r = R(cuModuleLoadDataEx(out, make_image(), in_below(4), NULL, NULL)); break;
    case 2: { /* a library whose bytes the program keeps: they must stay there */
        const void *image = make_image();
        void *kept = NULL;
        if (image) {
            kept = malloc(sizeof img);
            if (!kept) return;
            memcpy(kept, img, sizeof img);
        }
        int option = 1; /* CU_LIBRARY_BINARY_IS_PRESERVED */
        void *value = (void *)1;
        r = R(cuLibraryLoadData((CUlibrary *)out, kept, NULL, NULL, 0, &option, &value,
                                in_below(2)));
        break;
    }
    default: r = R(cuModuleLoadData(out, make_image()));
    }
    if (r != CUDA_SUCCESS || !out) return;
    modules[slot] = m, module_live[slot] = 1;
    /* As programs do, mostly: a function of it at once. */
    CUfunction f = NULL;
    if (in_below(4) && R(cuModuleGetFunction(&f, m, kernel_name())) == CUDA_SUCCESS) {
        unsigned i = in_below(N_FUNCS);
        funcs[i] = f, func_module[i] = m;
    }
}

CUfunction pick_func(void) {
    unsigned from = in_below(N_FUNCS);
    switch (in_below(8)) {
    case 0: return NULL;
    case 1: return (CUfunction)junk_handle();
    case 2: return (CUfunction)modules[in_below(N_MODULES)]; /* a module is no function */
    case 3: return funcs[from];                              /* maybe its module is gone */
    default:                                                 /* mostly one of a loaded module */
        for (unsigned k = 0; k < N_FUNCS; k++)
            if (funcs[(from + k) % N_FUNCS] && loaded(func_module[(from + k) % N_FUNCS]))
                return funcs[(from + k) % N_FUNCS];
        return funcs[from];
    }
}

static CUmodule pick_module(void) {
    unsigned from = in_below(N_MODULES);
    for (unsigned k = 0; k < N_MODULES && in_below(4); k++) /* mostly a loaded one */
        if (module_live[(from + k) % N_MODULES]) return modules[(from + k) % N_MODULES];
    switch (in_below(6)) {
    case 0: return NULL;
    case 1: return (CUmodule)junk_handle();
    case 2: return (CUmodule)funcs[in_below(N_FUNCS)]; /* a function is no module */
    default: return modules[in_below(N_MODULES)];
    }
}

static void op_module_get(void) {
    CUmodule m = pick_module();
    const char *name = in_below(16) ? kernel_name() : NULL;
    unsigned slot = in_below(N_FUNCS);
    CUfunction f = NULL;
    CUdeviceptr global = 0;
    size_t bytes = 0;
    switch (in_below(4)) {
    case 0: R(cuModuleGetGlobal(in_below(4) ? &global : NULL, in_below(4) ? &bytes : NULL, m,
                                name));
            return;
    case 1: {
        CUkernel k = NULL;
        if (R(cuLibraryGetKernel(in_below(16) ? &k : NULL, (CUlibrary)m, name)) ||
            R(cuKernelGetFunction(in_below(16) ? &f : NULL, k)))
            return;
        break;
    }
    default:
        if (R(cuModuleGetFunction(in_below(16) ? &f : NULL, m, name))) return;
    }
    if (f) funcs[slot] = f, func_module[slot] = m;
}

static void op_module_unload(void) {
    CUmodule m = pick_module();
    int slot = slot_of((void *const *)modules, N_MODULES, m);
    CUresult r = in_below(4) ? R(cuModuleUnload(m)) : R(cuLibraryUnload((CUlibrary)m));
    if (r != CUDA_SUCCESS) return;
    if (slot < 0 || !module_live[slot])
        fail("unloading %p, no loaded module, succeeded", (void *)m);
    for (int i = 0; i < N_MODULES; i++)
        if (modules[i] == m) module_live[i] = 0;
}

/* ---- launches and functions ------------------------------------------------------------ */

static unsigned dim(void) { return in_below(16) ? 1 + in_below(4) : (unsigned)in_hostile(); }

static void op_launch(void) {
    static uint64_t args[4][8];
    static unsigned char packed[40 << 10]; /* more than the most parameters a launch takes */
    static size_t packed_size;
    static CUlaunchAttribute attrs[4];
    CUfunction f = pick_func();
    unsigned grid[3] = {dim(), dim(), dim()}, block[3] = {dim(), dim(), dim()};
    unsigned shared = in_below(4) ? 0 : (unsigned)in_hostile();
    CUstream s = pick_stream();
    args[0][0] = in_below(4) ? in_below(50) : in_hostile(); /* a spin's microseconds */
    memcpy(packed, args[0], 8);
    packed_size = in_below(2) ? 8 : in_len(32 << 10);
    void *params[4] = {args[0], args[1], args[2], args[3]};
    void *extra[8] = {(void *)1, packed, (void *)2, &packed_size, NULL, NULL, NULL, NULL};
    switch (in_below(5)) {
    case 0: extra[1] = NULL; break;                      /* no buffer */
    case 1: extra[0] = (void *)(uintptr_t)(3 + in_below(8)); break; /* an unknown key */
    case 2: extra[0] = NULL; break;                      /* empty */
    default: break;
    }
    unsigned which = in_below(4);
    void **p = which & 1 ? params : NULL, **e = which & 2 ? extra : NULL;
    switch (in_below(4)) {
    case 0:
        R(cuLaunchCooperativeKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                    shared, s, p));
        break;
    case 1: {
        for (int i = 0; i < 4; i++) {
            attrs[i].id = in_below(4) ? in_below(16) : in_u32();
            for (int k = 0; k < 16; k++) attrs[i].value[k] = in_below(4) ? in_below(3) : in_u32();
        }
        CUlaunchConfig c = {{grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]},
                            shared, s, in_below(8) ? attrs : NULL, in_below(5)};
        R(cuLaunchKernelEx(in_below(16) ? &c : NULL, f, p, e));
        break;
    }
    default:
        R(cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, s,
                         p, e));
    }
}

static void op_func_query(void) {
    CUfunction f = pick_func();
    int v = 0, attr = in_below(4) ? (int)in_below(20) - 1 : (int)in_u32();
    size_t offset = 0, size = 0;
    const char *name = NULL;
    switch (in_below(5)) {
    case 0: R(cuFuncGetAttribute(in_below(8) ? &v : NULL, attr, f)); break;
    case 1: R(cuFuncSetAttribute(f, attr, (int)in_hostile())); break;
    case 2: R(cuFuncGetParamInfo(f, in_below(2) ? in_below(3) : in_hostile(),
                                 in_below(4) ? &offset : NULL, in_below(4) ? &size : NULL));
            break;
    case 3: R(cuFuncGetName(in_below(8) ? &name : NULL, f)); break;
    default: R(cuOccupancyMaxActiveBlocksPerMultiprocessor(in_below(8) ? &v : NULL, f,
                                                           (int)dim(), in_len(1 << 16)));
    }
}

/* Thousands of commands without a wait: more than the submission ring holds. */
static void op_flood(void) {
    unsigned n = 1 + in_u32() % 3000; /* events: two commands each */
    CUstream s = pick_stream();
    CUfunction f = pick_func();
    uint64_t micros = 0;
    void *params[] = {&micros};
    CUevent *made = calloc(n, sizeof *made);
    if (!made) return;
    unsigned kind = in_below(3);
    for (unsigned i = 0; i < n; i++) switch (kind) {
        case 0: /* events made, recorded, and destroyed after */
            if (cuEventCreate(&made[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS)
                cuEventRecord(made[i], s);
            break;
        case 1: cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL); break;
        default: cuStreamWaitEvent(s, events[i % N_EVENTS], 0);
        }
    for (unsigned i = 0; i < n; i++)
        if (made[i] && R(cuEventDestroy(made[i])) != CUDA_SUCCESS)
            fail("destroying event %u of a flood failed", i);
    free(made);
    R(cuStreamSynchronize(s));
}

/* ---- capture and graphs -------------------------------------------------------------- */

void end_captures(void) {
    CUstream special[] = {NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
    for (int i = 0; i < N_STREAMS + 3; i++) {
        CUgraph g = NULL;
        CUstream s = i < N_STREAMS ? streams[i] : special[i - N_STREAMS];
        if (cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g) cuGraphDestroy(g);
    }
}

static CUgraph pick_graph(void) {
    return in_below(6) ? graphs[in_below(N_GRAPHS)] : (CUgraph)junk_handle();
}

static void op_graph(void) {
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    int status = 0;
    CUgraphNode nodes[8];
    size_t count = in_below(9);
    switch (in_below(9)) {
    case 0: R(cuStreamBeginCapture(pick_stream(), in_below(4) ? (int)in_below(3) : (int)in_u32()));
            return;
    case 1:
        if (R(cuStreamEndCapture(pick_stream(), in_below(8) ? &g : NULL)) == CUDA_SUCCESS && g)
            graphs[in_below(N_GRAPHS)] = g;
        return;
    case 2: R(cuStreamIsCapturing(pick_stream(), in_below(8) ? &status : NULL)); return;
    case 3:
        if (R(cuGraphCreate(&g, in_below(4) ? 0 : in_u32())) == CUDA_SUCCESS)
            graphs[in_below(N_GRAPHS)] = g;
        return;
    case 4:
        if (R(cuGraphInstantiateWithFlags(in_below(8) ? &x : NULL, pick_graph(), in_u8())) ==
                CUDA_SUCCESS && x)
            execs[in_below(N_EXECS)] = x;
        return;
    case 5: R(cuGraphLaunch(in_below(6) ? execs[in_below(N_EXECS)] : junk_handle(),
                            pick_stream()));
            return;
    case 6: R(cuGraphExecDestroy(execs[in_below(N_EXECS)])); return;
    case 7: R(cuGraphDestroy(pick_graph())); return;
    default: R(cuGraphGetNodes(pick_graph(), in_below(2) ? nodes : NULL, in_below(8) ? &count : NULL));
    }
}

/* Graphs built node by node, their nodes' parameters and updates, with hostile arguments:
 * node handles are the driver's numbers or junk; only the driver's survival is checked. */
static CUgraphNode gnodes[8];

static CUgraphNode pick_gnode(void) {
    return in_below(6) ? gnodes[in_below(8)] : (CUgraphNode)junk_handle();
}

static void keep_gnode(CUresult r, CUgraphNode n) {
    if (r == CUDA_SUCCESS) gnodes[in_below(8)] = n;
}

static void op_graph_node(void) {
    CUgraphNode n = NULL, deps[3] = {pick_gnode(), pick_gnode(), pick_gnode()};
    size_t nd = in_below(4);
    CUgraph g = pick_graph();
    CUgraphExec x = in_below(6) ? execs[in_below(N_EXECS)] : (CUgraphExec)junk_handle();
    unsigned long long micros = in_below(4) ? in_below(50) : in_hostile();
    void *args[] = {&micros, &micros};
    CUDA_KERNEL_NODE_PARAMS k;
    memset(&k, 0, sizeof k);
    k.func = pick_func();
    k.gridDimX = in_below(4) ? 1 : in_u32();
    k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = in_below(4) ? 32 : in_u32();
    k.blockDimY = k.blockDimZ = 1;
    k.sharedMemBytes = in_below(4) ? 0 : in_u32();
    k.kernelParams = in_below(8) ? args : NULL;
    CUDA_MEMSET_NODE_PARAMS m;
    memset(&m, 0, sizeof m);
    m.dst = pick_dptr();
    m.value = in_u32();
    m.elementSize = in_below(4) ? 4 : in_below(9);
    m.width = in_below(4) ? in_below(4096) : in_hostile();
    m.height = in_below(6) ? 1 : in_below(4);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = in_below(6) ? CU_MEMORYTYPE_DEVICE : (int)in_below(5);
    c.srcDevice = pick_dptr();
    c.dstDevice = pick_dptr();
    c.WidthInBytes = in_below(4) ? in_below(4096) : in_hostile();
    c.Height = c.Depth = in_below(6) ? 1 : in_below(3);
    CUgraphExecUpdateResultInfo info;
    unsigned char generic[256];
    int type = -1;
    switch (in_below(12)) {
    case 0: keep_gnode(R(cuGraphAddEmptyNode(&n, g, deps, nd)), n); return;
    case 10: R(cuGraphExecChildGraphNodeSetParams(x, pick_gnode(), pick_graph())); return;
    case 1: keep_gnode(R(cuGraphAddKernelNode(in_below(8) ? &n : NULL, g, deps, nd, &k)), n); return;
    case 2: keep_gnode(R(cuGraphAddMemsetNode(&n, g, deps, nd, in_below(8) ? &m : NULL, NULL)), n);
            return;
    case 3: keep_gnode(R(cuGraphAddMemcpyNode(&n, g, deps, nd, &c, NULL)), n); return;
    case 4: keep_gnode(R(cuGraphAddChildGraphNode(&n, g, deps, nd, pick_graph())), n); return;
    case 5: R(cuGraphAddDependencies(g, &deps[0], &deps[1], NULL, in_below(2))); return;
    case 6: R(cuGraphExecMemsetNodeSetParams(x, pick_gnode(), &m, NULL)); return;
    case 7: R(cuGraphExecUpdate(x, g, in_below(4) ? &info : NULL)); return;
    case 8: R(cuGraphNodeSetEnabled(x, pick_gnode(), in_below(2))); return;
    case 9: R(cuGraphNodeGetType(pick_gnode(), in_below(4) ? &type : NULL)); return;
    default: /* 11 */
        /* The generic form, its type and body as the input says. */
        for (size_t i = 0; i < sizeof generic; i++) generic[i] = in_u8();
        generic[0] = in_below(4) ? (unsigned char)in_below(6) : generic[0];
        /* Not a host node: its function would be whatever the bytes say, and calling that is
         * the program's own crash, not the driver's. */
        if (generic[0] == 3) generic[0] = 5;
        generic[1] = generic[2] = generic[3] = 0;
        keep_gnode(R(cuGraphAddNode(&n, g, deps, NULL, nd, generic)), n);
    }
}

const struct op work_ops[] = {
    {"stream create", op_stream_create},
    {"stream destroy", op_stream_destroy},
    {"stream use", op_stream_use},
    {"stream use", op_stream_use},
    {"event create", op_event_create},
    {"event destroy", op_event_destroy},
    {"event use", op_event_use},
    {"event use", op_event_use},
    {"module load", op_module_load},
    {"module load", op_module_load},
    {"module load", op_module_load},
    {"module get", op_module_get},
    {"module get", op_module_get},
    {"module get", op_module_get},
    {"module unload", op_module_unload},
    {"launch", op_launch},
    {"launch", op_launch},
    {"launch", op_launch},
    {"launch", op_launch},
    {"function query", op_func_query},
    {"graph", op_graph},
    {"graph", op_graph},
    {"graph node", op_graph_node},
    {"flood", op_flood},
};
const unsigned n_work_ops = sizeof work_ops / sizeof work_ops[0];
