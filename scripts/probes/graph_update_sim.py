"""A graph of 12 kernels of the sim device's test module, every node given new parameters
before each launch (as XLA's command buffers are), N launches (argv[1], default 2000) each
synchronized; prints the median and 90th percentile µs of a step. For a machine without a
GPU: `gpushare run -- python3 graph_update_sim.py` against `gpushared --backend sim` (with
GPUSHARE_TIMELINE=1 on gpushared, the timeline shows where each update's time goes).
scripts/probes/graph_update.c is the same on a GPU."""
import ctypes as C, sys, time
cu = C.CDLL("libcuda.so.1")
def ck(r, w):
    if r != 0: raise SystemExit(f"{w}: {r}")
class P(C.Structure):
    _fields_ = [("func", C.c_void_p), ("gx", C.c_uint), ("gy", C.c_uint), ("gz", C.c_uint),
                ("bx", C.c_uint), ("by", C.c_uint), ("bz", C.c_uint), ("smem", C.c_uint),
                ("params", C.c_void_p), ("extra", C.c_void_p), ("kern", C.c_void_p), ("ctx", C.c_void_p)]
ck(cu.cuInit(0), "init")
dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "dev")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "cur")
mod = C.c_void_p(); ck(cu.cuModuleLoadData(C.byref(mod), b"gpushare-sim-module 1\nkernel spin\n\0"), "mod")
f = C.c_void_p(); ck(cu.cuModuleGetFunction(C.byref(f), mod, b"spin"), "fn")
g = C.c_void_p(); ck(cu.cuGraphCreate(C.byref(g), 0), "graph")
us = [C.c_uint64(1) for _ in range(12)]
argv = [(C.c_void_p * 1)(C.cast(C.byref(u), C.c_void_p)) for u in us]
nodes = []
prev = None
for i in range(12):
    p = P(f, 1, 1, 1, 32, 1, 1, 0, C.cast(argv[i], C.c_void_p), None, None, None)
    n = C.c_void_p()
    deps = (C.c_void_p * 1)(prev) if prev else None
    ck(cu.cuGraphAddKernelNode_v2(C.byref(n), g, deps, 1 if prev else 0, C.byref(p)), "add")
    nodes.append(n); prev = n
ex = C.c_void_p(); ck(cu.cuGraphInstantiateWithFlags(C.byref(ex), g, C.c_ulonglong(0)), "inst")
s = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(s), 1), "stream")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
t = []
for k in range(N + 100):
    a = time.perf_counter()
    for i in range(12):
        us[i].value = 1 + (k & 1)
        p = P(f, 1, 1, 1, 32, 1, 1, 0, C.cast(argv[i], C.c_void_p), None, None, None)
        ck(cu.cuGraphExecKernelNodeSetParams_v2(ex, nodes[i], C.byref(p)), "set")
    ck(cu.cuGraphLaunch(ex, s), "launch")
    ck(cu.cuStreamSynchronize(s), "sync")
    if k >= 100: t.append((time.perf_counter() - a) * 1e6)
t.sort(); print(f"step median {t[len(t)//2]:.1f} us, p90 {t[len(t)*9//10]:.1f} us")
