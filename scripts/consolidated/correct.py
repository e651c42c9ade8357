"""Correctness workloads for consolidated clients; each prints one JSON object.

train --model mlp|transformer: trains from a fixed seed with deterministic algorithms and
prints every step's loss (as float hex, so a comparison is exact) and a parameter checksum.
infer: a trained-from-seed transformer's logits on fixed input, as float hex of a few values
and a sha256 of the bytes. graphs: torch.cuda.graph capture and replay against eager.
compile: torch.compile against eager. quota: allocates until the quota refuses.
"""
import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models import Transformer, mlp, tokens  # noqa: E402


def setup(seed=0):
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False


def train(args):
    setup(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    dev = "cuda"
    losses = []
    if args.model == "mlp":
        model = mlp().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(4096, 512, generator=gen)
        w = torch.randn(512, 10, generator=gen)
        y = (x @ w).argmax(dim=1)
        x, y = x.to(dev), y.to(dev)
        for step in range(args.steps):
            i = (step * 256) % 4096
            loss = F.cross_entropy(model(x[i:i + 256]), y[i:i + 256])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    else:
        model = Transformer().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        for step in range(args.steps):
            idx, tgt = tokens(16, 64, 1024, gen)
            idx, tgt = idx.to(dev, non_blocking=True), tgt.to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(idx)
                loss = F.cross_entropy(logits.float().view(-1, 1024), tgt.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return {"losses": [float.hex(v) for v in losses], "first": losses[0], "last": losses[-1],
            "checksum": float.hex(checksum)}


def infer(args):
    setup(args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    model = Transformer().cuda().eval()
    idx, _ = tokens(8, 64, 1024, gen)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(idx.cuda()).float().cpu()
    return {"sha256": hashlib.sha256(out.numpy().tobytes()).hexdigest(),
            "sample": [float.hex(v) for v in out.flatten()[:4].tolist()]}


def graphs(args):
    setup(args.seed)
    model = mlp().cuda().eval()
    static = torch.randn(64, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        out = model(static)
    worst = 0.0
    for i in range(5):
        static.copy_(torch.randn(64, 512, device="cuda"))
        g.replay()
        with torch.no_grad():
            eager = model(static)
        worst = max(worst, (out - eager).abs().max().item())
    return {"replays": 5, "max_abs_diff": worst, "equal": worst == 0.0}


def compiled(args):
    setup(args.seed)
    torch.use_deterministic_algorithms(False)
    model = Transformer().cuda().eval()
    idx, _ = tokens(8, 64, 1024, torch.Generator().manual_seed(3))
    idx = idx.cuda()
    t0 = time.perf_counter()
    fast = torch.compile(model)
    with torch.no_grad():
        eager = model(idx)
        out = fast(idx)
        out2 = fast(idx)
    return {"compile_s": time.perf_counter() - t0,
            "max_abs_diff": (out - eager).abs().max().item(),
            "repeat_equal": bool(torch.equal(out, out2))}


def quota(args):
    held, gib = [], 0
    try:
        while gib < 1024:
            held.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
            gib += 1
        oom = False
    except torch.OutOfMemoryError:
        oom = True
    free, total = torch.cuda.mem_get_info()
    del held
    torch.cuda.empty_cache()
    x = torch.ones(1 << 20, device="cuda")
    return {"oom": oom, "allocated_gib": gib, "mem_total_gib": total / 2**30,
            "carried_on": x.sum().item() == float(1 << 20)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "infer", "graphs", "compile", "quota"])
    ap.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    fn = {"train": train, "infer": infer, "graphs": graphs, "compile": compiled,
          "quota": quota}[args.what]
    try:
        r = fn(args)
        r["ok"] = True
    except Exception as e:  # a clean failure is a result too: report it
        r = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    r["seconds"] = time.perf_counter() - t0
    print(json.dumps(r))
    sys.exit(0 if r["ok"] else 1)


if __name__ == "__main__":
    main()
