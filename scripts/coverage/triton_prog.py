"""Triton programs for the coverage matrix (scripts/gpu-coverage.sh), Triton on its own (not
through torch.compile), its kernels launched on PyTorch's tensors: each prints one JSON line,
{"ok": true, "values": [...]}, that the run directly and the run through gpushare must agree on.

    python3 triton_prog.py kernel   a @triton.jit vector add, and a row-wise softmax (one
                                    program a row, masked loads, max and sum reductions)
"""
import json
import sys


def kernels():
    """The kernels, defined once Triton is imported (a missing Triton surfaces as the case's
    error). `triton` and `tl` are made module globals, where Triton looks names up."""
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + y, mask=mask)

    @triton.jit
    def softmax(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(out_ptr + row * out_stride + cols, e / tl.sum(e, axis=0), mask=mask)

    return add, softmax


def head(t, n=16):
    return [float(v) for v in t.flatten()[:n].tolist()] + [float(t.double().sum())]


def main(case):
    import torch

    add, softmax = kernels()
    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA GPU")
    torch.manual_seed(0)
    if case == "kernel":
        dev = torch.device("cuda")
        n = (1 << 20) + 123  # not a multiple of the block: the mask matters
        x = torch.randn(n, device=dev)
        y = torch.randn(n, device=dev)
        out = torch.empty_like(x)
        add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        rows = torch.randn(256, 781, device=dev) * 3
        sm = torch.empty_like(rows)
        softmax[(rows.shape[0],)](sm, rows, rows.stride(0), sm.stride(0), rows.shape[1],
                                  BLOCK=triton.next_power_of_2(rows.shape[1]))
        torch.cuda.synchronize()
        if not torch.equal(out, x + y):
            raise RuntimeError("the add differs from PyTorch's")
        if not torch.allclose(sm, torch.softmax(rows, dim=1), rtol=1e-5, atol=1e-6):
            raise RuntimeError("the softmax differs from PyTorch's")
        return head(out) + head(sm[:, :5]) + [float(v) for v in sm.max(dim=1).values[:8].tolist()]
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    try:
        values = main(sys.argv[1])
        print(json.dumps({"ok": True, "values": values}))
    except Exception as e:  # the matrix records it; the run's stderr says more
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
