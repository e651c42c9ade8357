"""The victims of scripts/gpu-pytorch-faults.sh: an inference loop and a trainer, each an
unmodified PyTorch program of its own Unix user, run under `gpushare run` while another user's
programs fault the GPU. Each writes one JSON line per request or step to --out:
  {"t": wall time at the end, "ok": bool, "correct": bool, "ms": duration, "error": str}
and a last line {"done": true, ...} with totals. Deterministic inputs, so a request's answer
is compared bit for bit with the answer to the same request before any fault.

  python3 victims.py infer --stop FILE --think-ms 2 --out infer.jsonl [--hold-gib 10]
  python3 victims.py train --stop FILE --out train.jsonl
Each runs until FILE exists (or --seconds pass).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn


def mlp(width, layers, d_in, d_out):
    mods, d = [], d_in
    for _ in range(layers):
        mods += [nn.Linear(d, width), nn.GELU()]
        d = width
    mods.append(nn.Linear(d, d_out))
    return nn.Sequential(*mods)


def checksum(t):
    """Row sums in float32, then their sum in float64: no copy of a large tensor."""
    return t.view(-1, 1 << 20).sum(dim=1).double().sum().item()


def emit(out, row):
    out.write(json.dumps(row) + "\n")
    out.flush()


def infer(args, out):
    torch.manual_seed(0)
    model = mlp(2048, 6, 2048, 2048).cuda().eval()
    inputs = [torch.randn(8, 2048, device="cuda") for _ in range(4)]
    held = None
    if args.hold_gib:
        # Memory held through the faults, with a pattern checked at the end.
        n = int(args.hold_gib * (1 << 30)) // 4 // (1 << 20) * (1 << 20)
        held = torch.empty(n, device="cuda", dtype=torch.float32)
        for row in held.view(-1, 1 << 20):  # a pattern, without a second copy of it
            row.copy_(torch.arange(1 << 20, device="cuda", dtype=torch.float32))
        held.view(-1, 1 << 20).mul_(torch.arange(n >> 20, device="cuda").remainder(7).add(1)[:, None])
        held_sum = checksum(held)
    with torch.no_grad():
        want = [model(x).cpu() for x in inputs]
    emit(out, {"ready": True, "t": time.time()})
    end = time.time() + args.seconds
    n = ok = correct = errors = 0
    i = 0
    while time.time() < end and not os.path.exists(args.stop):
        x = inputs[i % 4]
        start = time.perf_counter()
        row = {}
        try:
            with torch.no_grad():
                y = model(x).cpu()
            good = torch.equal(y, want[i % 4])
            row = {"ok": True, "correct": good}
            ok += 1
            correct += good
        except RuntimeError as e:
            row = {"ok": False, "correct": False, "error": str(e).splitlines()[0][:200]}
            errors += 1
        row["ms"] = (time.perf_counter() - start) * 1e3
        row["t"] = time.time()
        emit(out, row)
        n += 1
        i += 1
        time.sleep(args.think_ms / 1e3)
    summary = {"done": True, "requests": n, "ok": ok, "correct": correct, "errors": errors}
    if held is not None:
        summary["held_gib"] = args.hold_gib
        summary["held_intact"] = checksum(held) == held_sum
    emit(out, summary)


def train(args, out):
    torch.manual_seed(1)
    model = mlp(2048, 4, 1024, 10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(512, 1024, device="cuda", generator=gen)
    labels = torch.randint(0, 10, (512,), device="cuda", generator=gen)
    emit(out, {"ready": True, "t": time.time()})
    end = time.time() + args.seconds
    n = ok = errors = 0
    first = last = None
    while time.time() < end and not os.path.exists(args.stop):
        start = time.perf_counter()
        try:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), labels)
            loss.backward()
            opt.step()
            value = loss.item()
            finite = value == value and abs(value) != float("inf")
            row = {"ok": True, "correct": finite, "loss": value}
            first = value if first is None else first
            last = value
            ok += 1
        except RuntimeError as e:
            # The step that was on the GPU at the fault: lost, as an error the program catches.
            row = {"ok": False, "correct": False, "error": str(e).splitlines()[0][:200]}
            errors += 1
        row["ms"] = (time.perf_counter() - start) * 1e3
        row["t"] = time.time()
        emit(out, row)
        n += 1
    emit(out, {"done": True, "steps": n, "ok": ok, "errors": errors, "first_loss": first,
               "last_loss": last})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["infer", "train"])
    ap.add_argument("--seconds", type=float, default=900)
    ap.add_argument("--stop", default="/nonexistent")
    ap.add_argument("--think-ms", type=float, default=2.0)
    ap.add_argument("--hold-gib", type=float, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.out, "w") as out:
        (infer if args.what == "infer" else train)(args, out)


if __name__ == "__main__":
    sys.exit(main())
