"""The quota side of the governed-clients check (scripts/gpu-pytorch-governed.sh), run under
`gpushare run` with a memory quota of --quota-gib.

Allocates 256 MiB tensors until PyTorch raises torch.OutOfMemoryError (the interposer turns
the allocation past the quota into CUDA's out-of-memory error), checks that it came before the
quota was passed, frees everything, and checks that the program carries on: allocates again,
computes, and verifies a result. Prints one JSON object on stdout.
"""
import argparse
import json

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quota-gib", type=float, required=True)
    args = ap.parse_args()
    chunk = 256 << 20
    held = []
    error = None
    for _ in range(int(4 * args.quota_gib * 4) + 16):  # far past the quota
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as e:
            error = str(e).splitlines()[0]
            break
    allocated = len(held) * chunk
    del held
    torch.cuda.empty_cache()
    # Carries on: the same amount fits again, and the GPU computes right.
    again = [torch.ones(chunk // 4, dtype=torch.float32, device="cuda") for _ in range(2)]
    total = sum(t.sum().item() for t in again)
    a = torch.randn(1024, 1024, device="cuda")
    ok = torch.allclose(a @ torch.eye(1024, device="cuda"), a)
    print(json.dumps({
        "oom": error is not None,
        "error": error,
        "allocated_before_oom_gib": allocated / 2**30,
        "quota_gib": args.quota_gib,
        "within_quota": allocated <= args.quota_gib * 2**30,
        "carried_on": ok and total == 2 * (chunk // 4),
    }))


if __name__ == "__main__":
    main()
