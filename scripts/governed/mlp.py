"""One side of the governed-clients check (scripts/gpu-pytorch-governed.sh).

--role hp: an inference loop, 6 x (Linear 2048 + GELU) at batch 8, one request every 2 ms of
think time; reports request latency p50/p99 (ms) over the measured window.
--role be: a training loop on the same MLP at batch 512 (forward, loss, backward, SGD step);
reports iterations per second over the measured window.

Both warm up, then run for --seconds, synchronizing every request / iteration so that the
figures are what the program sees. Prints one JSON object on stdout.
"""
import argparse
import json
import time

import torch


def mlp(width=2048, layers=6):
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods).cuda()


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["hp", "be"], required=True)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--think-ms", type=float, default=2.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = mlp()
    if args.role == "hp":
        model.eval()
        x = torch.randn(8, 2048, device="cuda")
        lat = []
        start = time.perf_counter()
        with torch.no_grad():
            while True:
                now = time.perf_counter()
                if now - start > args.warmup + args.seconds:
                    break
                t0 = time.perf_counter()
                y = model(x)
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                if t0 - start >= args.warmup:
                    lat.append((t1 - t0) * 1e3)
                time.sleep(args.think_ms / 1e3)
                assert torch.isfinite(y).all().item()
        print(json.dumps({"role": "hp", "requests": len(lat), "p50_ms": percentile(lat, 0.5),
                          "p99_ms": percentile(lat, 0.99), "mean_ms": sum(lat) / max(1, len(lat))}))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(512, 2048, device="cuda")
        target = torch.randn(512, 2048, device="cuda")
        iters = 0
        start = time.perf_counter()
        measured_from = None
        while True:
            now = time.perf_counter()
            if now - start > args.warmup + args.seconds:
                break
            if measured_from is None and now - start >= args.warmup:
                measured_from, iters = now, 0
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            loss_value = loss.item()  # synchronizes: one honest iteration
            assert loss_value == loss_value
            iters += 1
        elapsed = time.perf_counter() - (measured_from or start)
        print(json.dumps({"role": "be", "iterations": iters, "it_per_s": iters / elapsed}))


if __name__ == "__main__":
    main()
