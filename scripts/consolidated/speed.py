"""Speed workloads for consolidated clients; each prints one JSON object.

train: transformer training steps (bf16 autocast), steps/s over --seconds after warm-up.
infer: MLP inference requests at batch 8 back to back, each synchronized; p50/p99 ms.
think: the same requests with --think-ms of idle time between them; p50/p99 ms.
launch: tiny elementwise kernels launched asynchronously, synchronized at the end; kernels/s.
first: seconds from process start (--t0-ns, the launcher's clock) to the first finished
CUDA op, and from `import torch` to it.
hold: initializes CUDA, runs a bf16 linear layer forward and backward (cuBLAS), prints the
bytes PyTorch reserved, touches --ready and stays alive --seconds (for measuring what the
process costs on the GPU from outside).
"""
import argparse
import json
import time

T_START = time.time_ns()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models import Transformer, mlp, tokens  # noqa: E402


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def timed(args, step):
    """Runs step() for warm-up then --seconds; returns the measured calls' durations (s)."""
    end_warm = time.perf_counter() + args.warmup
    while time.perf_counter() < end_warm:
        step()
    out, end = [], time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
        if args.think_ms:
            time.sleep(args.think_ms / 1e3)
    return out


def train(args):
    torch.manual_seed(0)
    model = Transformer(d=512, heads=8, layers=4, seq=256).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    idx, tgt = (t.cuda() for t in tokens(16, 256, 1024, gen))

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(idx).float().view(-1, 1024), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    d = timed(args, step)
    return {"steps_per_s": len(d) / sum(d), "p50_ms": pct(d, 0.5) * 1e3}


def infer(args):
    torch.manual_seed(0)
    model = mlp(width=2048, layers=6).cuda().eval()
    x = torch.randn(8, 512, device="cuda")

    def step():
        with torch.no_grad():
            model(x).sum().item()

    d = timed(args, step)
    return {"requests": len(d), "p50_ms": pct(d, 0.5) * 1e3, "p99_ms": pct(d, 0.99) * 1e3,
            "mean_ms": sum(d) / len(d) * 1e3, "lat_us": [round(x * 1e6) for x in d]}


def launch(args):
    x = torch.zeros(1, device="cuda")
    n = 20000

    def step():
        for _ in range(n):
            x.add_(1)
        torch.cuda.synchronize()

    d = timed(args, step)
    return {"kernels_per_s": n * len(d) / sum(d)}


def first(args):
    torch.ones(1, device="cuda").sum().item()
    now = time.time_ns()
    return {"from_start_s": (now - args.t0_ns) / 1e9 if args.t0_ns else None,
            "from_import_s": (now - T_START) / 1e9}


def hold(args):
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    layer = torch.nn.Linear(1024, 1024).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer(x).float().sum().backward()
    # Streams of its own beyond PyTorch's pools, kept alive: what a stream costs on the GPU.
    extra = [torch.cuda.Stream() for _ in range(args.streams)]
    torch.cuda.synchronize()
    print(json.dumps({"reserved": torch.cuda.memory_reserved(), "streams": len(extra)}),
          flush=True)
    open(args.ready, "w").close()
    time.sleep(args.seconds)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "infer", "think", "launch", "first", "hold"])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--think-ms", type=float, default=0.0)
    ap.add_argument("--t0-ns", type=int, default=0)
    ap.add_argument("--ready", default="/dev/null")
    ap.add_argument("--streams", type=int, default=0)
    args = ap.parse_args()
    if args.what == "think" and not args.think_ms:
        args.think_ms = 5.0
    fn = {"train": train, "infer": infer, "think": infer, "launch": launch, "first": first,
          "hold": hold}
    r = fn[args.what](args)
    if r is not None:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
