"""The high-priority side of scripts/gpu-pytorch-colocate.sh: an inference request loop.

--model mlp: 6 x (Linear 2048 + GELU), batch --batch (8 by default).
--model bert: one BERT-base-sized encoder layer (hidden 768, 12 heads, FFN 3072, GELU,
sequence 128), batch --batch (4 by default).

A request is a forward pass under torch.no_grad followed by torch.cuda.synchronize; between
requests the program sleeps --think-ms. Requests that start inside the window are measured;
the result (one JSON line in --out) has p50/p99/mean/max latency in ms, every latency in µs
(lat_us, for pooling across rounds) and the five slowest requests with when each began in the
window (slowest: [latency ms, offset ms]).
"""
import argparse
import itertools
import time

import torch

from common import CPU, DEVICE, add_common_args, percentile, sync, wait_for_go, write_result


def build(model, batch, dtype):
    torch.manual_seed(0)
    if model == "mlp":
        width = 256 if CPU else 2048
        mods = []
        for _ in range(6):
            mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
        net = torch.nn.Sequential(*mods)
        x = torch.randn(batch, width)
    else:
        d, heads, ffn, seq = (128, 4, 512, 32) if CPU else (768, 12, 3072, 128)
        net = torch.nn.TransformerEncoderLayer(d_model=d, nhead=heads, dim_feedforward=ffn,
                                               activation="gelu", batch_first=True)
        x = torch.randn(batch, seq, d)
    net = net.to(DEVICE, dtype).eval()
    return net, x.to(DEVICE, dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "bert"], required=True)
    ap.add_argument("--batch", type=int, default=0, help="default 8 for mlp, 4 for bert")
    ap.add_argument("--think-ms", type=float, default=2.0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--warmup-iters", type=int, default=50)
    ap.add_argument("--warmup-s", type=float, default=1.0, help="and at least this long")
    add_common_args(ap)
    args = ap.parse_args()
    batch = args.batch or (8 if args.model == "mlp" else 4)
    net, x = build(args.model, batch, getattr(torch, args.dtype))

    def request():
        with torch.no_grad():
            y = net(x)
        sync()
        return y

    warm_until = time.time() + args.warmup_s
    for i in itertools.count():
        if i >= args.warmup_iters and time.time() >= warm_until:
            break
        request()
        time.sleep(args.think_ms / 1e3)

    start = wait_for_go(args)
    end = start + args.seconds
    lat = []
    began = []
    y = None
    while True:
        t0 = time.time()
        if t0 >= end:
            break
        p0 = time.perf_counter()
        y = request()
        lat.append(time.perf_counter() - p0)
        began.append(t0 - start)
        if args.think_ms:
            time.sleep(args.think_ms / 1e3)
    finite = bool(torch.isfinite(y).all().item()) if y is not None else None
    ms = [v * 1e3 for v in lat]
    write_result(args, {
        "role": "hp", "model": args.model, "batch": batch, "dtype": args.dtype,
        "think_ms": args.think_ms, "window_s": args.seconds, "requests": len(ms),
        "p50_ms": percentile(ms, 0.5), "p99_ms": percentile(ms, 0.99),
        "mean_ms": sum(ms) / len(ms) if ms else None, "max_ms": max(ms) if ms else None,
        "finite": finite, "lat_us": [round(v * 1e6) for v in lat],
        "slowest": [[round(v * 1e3, 3), round(b * 1e3)]
                    for v, b in sorted(zip(lat, began), reverse=True)[:5]],
    })


if __name__ == "__main__":
    main()
