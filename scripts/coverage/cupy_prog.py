"""CuPy programs for the coverage matrix (scripts/gpu-coverage.sh): each prints one JSON line,
{"ok": true, "values": [...]}, that the run directly and the run through gpushare must agree on.

    python3 cupy_prog.py elementwise|rawkernel|asyncpool|cublas|cufft|cusolver|cusparse|random
"""
import json
import sys

from timing import median_ms

TIMING = {}


def head(a, n=16):
    import cupy as cp

    a = cp.asnumpy(a).ravel()
    return [float(v) for v in a[:n]] + [float(a.astype("float64").sum())]


def main(case):
    import cupy as cp

    rng = cp.random.default_rng(0)
    if case == "elementwise":
        a = cp.arange(1 << 20, dtype=cp.float32)
        return head(cp.sin(a) * 2 + cp.sqrt(a))
    if case == "rawkernel":
        k = cp.RawKernel(r'''
        extern "C" __global__ void scale(const float* x, float* y, int n) {
            int i = blockDim.x * blockIdx.x + threadIdx.x;
            if (i < n) y[i] = x[i] * 3.0f + 1.0f;
        }''', "scale")
        x = cp.arange(4096, dtype=cp.float32)
        y = cp.empty_like(x)
        k((16,), (256,), (x, y, cp.int32(4096)))
        return head(y)
    if case == "asyncpool":
        # Stream-ordered allocations from CUDA's memory pools (cudaMallocAsync).
        cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
        a = rng.standard_normal((256, 256), dtype=cp.float32)
        b = cp.tanh(a @ a.T) + a
        return head(b)
    if case == "cublas":
        a = rng.standard_normal((512, 512), dtype=cp.float32)
        b = rng.standard_normal((512, 512), dtype=cp.float32)
        c = a @ b
        TIMING["ms"] = median_ms(lambda: (a @ b).sum().item())
        return head(c)
    if case == "cufft":
        x = rng.standard_normal(4096, dtype=cp.float32)
        f = cp.fft.fft(x)
        return head(cp.abs(f))
    if case == "cusolver":
        a = rng.standard_normal((256, 256), dtype=cp.float64)
        spd = a @ a.T + 256 * cp.eye(256)
        b = rng.standard_normal(256, dtype=cp.float64)
        return head(cp.linalg.solve(spd, b)) + head(cp.linalg.cholesky(spd))
    if case == "cusparse":
        import cupyx.scipy.sparse as sp

        m = sp.random(2048, 2048, density=0.01, format="csr", dtype=cp.float32,
                      random_state=1)
        v = cp.arange(2048, dtype=cp.float32)
        return head(m @ v)
    if case == "random":
        return head(rng.standard_normal(4096, dtype=cp.float32))
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    try:
        values = main(sys.argv[1])
        print(json.dumps({"ok": True, "values": values, **TIMING}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
