"""The culprit of scripts/gpu-pytorch-faults.sh: one PyTorch program that faults the GPU once
and exits, the way programs really do.

  python3 culprit.py assert    # cross_entropy with a label out of range: a device-side assert
  python3 culprit.py illegal   # a kernel that stores to address 16: an illegal address

Prints one JSON line: {"kind", "t_fault": wall time just before the faulting launch,
"t_error": when the program saw the error, "error": its first line}.
"""
import ctypes
import json
import sys
import time

import torch

# Stores to a null-page address: CUDA_ERROR_ILLEGAL_ADDRESS.
PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry poke() {
    .reg .b64 %a;
    .reg .b32 %v;
    mov.u64 %a, 16;
    mov.u32 %v, 1;
    st.global.u32 [%a], %v;
    ret;
}
"""


def illegal():
    cu = ctypes.CDLL("libcuda.so.1")
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    assert cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX + b"\0")) == 0
    assert cu.cuModuleGetFunction(ctypes.byref(function), module, b"poke") == 0
    t = time.time()
    rc = cu.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    rc = rc or cu.cuCtxSynchronize()
    return t, f"CUresult {rc}"


def device_assert():
    logits = torch.randn(8, 10, device="cuda")
    labels = torch.full((8,), 20, device="cuda", dtype=torch.long)
    t = time.time()
    try:
        torch.nn.functional.cross_entropy(logits, labels)
        torch.cuda.synchronize()
        return t, "no error"
    except RuntimeError as e:
        return t, str(e).splitlines()[0][:200]


def main():
    kind = sys.argv[1]
    torch.zeros(1, device="cuda")  # the context exists before the clock starts
    t, error = illegal() if kind == "illegal" else device_assert()
    print(json.dumps({"kind": kind, "t_fault": t, "t_error": time.time(), "error": error}),
          flush=True)


if __name__ == "__main__":
    main()
