"""Numba programs for the coverage matrix (scripts/gpu-coverage.sh): each prints one JSON line,
{"ok": true, "values": [...]}, that the run directly and the run through gpushare must agree on.

    python3 numba_prog.py kernel    @cuda.jit kernels on device arrays: a saxpy, then a sum
                                    reduced in shared memory per block, twice (the blocks'
                                    sums of the saxpy, then the sums of those)
"""
import json
import sys

THREADS = 256  # threads per block; the reduction's shared array has one slot a thread


def kernels():
    """The kernels, compiled once numba is imported (a missing numba surfaces as the case's
    error). `cuda` and `float32` are made module globals, which numba freezes into the kernels."""
    global cuda, float32
    import numpy as np

    # The numba on the GPU machine still calls `numpy.row_stack`, an alias of `vstack` that
    # NumPy 2.x removed: without it numba fails there directly too.
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    from numba import cuda, float32

    @cuda.jit
    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def block_sums(x, out):
        buf = cuda.shared.array(THREADS, float32)
        t = cuda.threadIdx.x
        i = cuda.grid(1)
        buf[t] = x[i] if i < x.shape[0] else float32(0)
        cuda.syncthreads()
        s = THREADS // 2
        while s > 0:
            if t < s:
                buf[t] += buf[t + s]
            cuda.syncthreads()
            s //= 2
        if t == 0:
            out[cuda.blockIdx.x] = buf[0]

    return saxpy, block_sums


def main(case):
    saxpy, block_sums = kernels()
    import numpy as np

    if not cuda.is_available():
        raise RuntimeError("numba sees no CUDA GPU")
    if case == "kernel":
        n = 1 << 20
        rng = np.random.default_rng(0)
        x = cuda.to_device(rng.standard_normal(n).astype(np.float32))
        y = cuda.to_device(rng.standard_normal(n).astype(np.float32))
        out = cuda.device_array(n, dtype=np.float32)
        blocks = (n + THREADS - 1) // THREADS
        saxpy[blocks, THREADS](np.float32(2.5), x, y, out)
        partial = cuda.device_array(blocks, dtype=np.float32)
        block_sums[blocks, THREADS](out, partial)
        blocks2 = (blocks + THREADS - 1) // THREADS
        partial2 = cuda.device_array(blocks2, dtype=np.float32)
        block_sums[blocks2, THREADS](partial, partial2)
        cuda.synchronize()
        r = out.copy_to_host()
        p = partial.copy_to_host()
        p2 = partial2.copy_to_host()
        want = np.float32(2.5) * x.copy_to_host() + y.copy_to_host()
        if not np.allclose(r, want, rtol=1e-6, atol=1e-6):
            raise RuntimeError("saxpy differs from numpy's")
        if abs(float(p2.astype(np.float64).sum()) - float(r.astype(np.float64).sum())) > 1.0:
            raise RuntimeError("the blocks' sums do not add up to the saxpy's sum")
        return ([float(v) for v in r[:16]] + [float(r.astype(np.float64).sum())]
                + [float(v) for v in p[:8]] + [float(v) for v in p2]
                + [float(p2.astype(np.float64).sum())])
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    try:
        values = main(sys.argv[1])
        print(json.dumps({"ok": True, "values": values}))
    except Exception as e:  # the matrix records it; the run's stderr says more
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
