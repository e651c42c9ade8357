"""A training loop that runs until told to stop, for scripts/gpu-fair-many.sh: many of these
run consolidated at once while gpushared's policy is switched under them (SIGHUP), and the
harness counts each one's iterations per window from its --progress file.

--model mlp: 6 x (Linear --width + GELU) at batch --batch, MSE loss, SGD: at batch 8 and
width 1024 a step is many tiny kernels. --model transformer: the transformer of be.py (d 512,
4 layers, sequence 256, bf16 autocast), long kernels. Each iteration ends with loss.item().

--model infer: the high-priority side, hp.py's MLP inference request (forward under no_grad,
then a synchronization) every --think-ms; with --latencies FILE each request's end (Unix time)
and duration (µs) go there, one line each, so the harness can take percentiles per window.

--on S --off S: active S seconds, then idle (connected, no GPU work) S seconds, on the
program's own clock: a program that comes and goes.

--progress FILE gets "ITERATIONS TIME ACTIVE" (cumulative; wall time; seconds spent in the
active part of the cycle) about every 50 ms, replaced atomically; the program stops when
--stop FILE exists or after --seconds.
"""
import argparse
import os
import time

import torch

from be import build
from common import sync
from hp import build as build_inference


def publish(path, done, active):
    with open(path + ".tmp", "w") as f:
        f.write(f"{done} {time.time():.6f} {active:.6f}\n")
    os.replace(path + ".tmp", path)


def active_s(elapsed, on, off):
    """Seconds of the first `elapsed` spent in the active part of the --on/--off cycle (all of
    them without one): a harness divides iterations by this, so that a window's place in the
    cycle does not count as speed."""
    if on <= 0 or off <= 0:
        return elapsed
    cycle = on + off
    return (elapsed // cycle) * on + min(elapsed % cycle, on)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "transformer", "infer"], required=True)
    ap.add_argument("--batch", type=int, default=0, help="default 8 for mlp, 16 for transformer")
    ap.add_argument("--width", type=int, default=1024, help="mlp width")
    ap.add_argument("--on", type=float, default=0.0, help="seconds active per cycle (0: always)")
    ap.add_argument("--off", type=float, default=0.0, help="seconds idle per cycle")
    ap.add_argument("--progress", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--seconds", type=float, default=900.0)
    ap.add_argument("--think-ms", type=float, default=2.0, help="infer: pause between requests")
    ap.add_argument("--latencies", help="infer: file for each request's end and duration")
    args = ap.parse_args()
    batch = args.batch or (16 if args.model == "transformer" else 8)
    if args.model == "infer":
        net, x = build_inference("mlp", batch, torch.float32)

        def step():
            with torch.no_grad():
                net(x)
            sync()
            return 0.0
    else:
        step = build(args.model, batch, width=args.width)
    log = open(args.latencies, "a", buffering=1 << 16) if args.latencies else None
    for _ in range(5):
        step()
    done, loss = 0, 0.0
    start = last = time.time()
    publish(args.progress, done, 0.0)
    while not os.path.exists(args.stop) and time.time() - start < args.seconds:
        now = time.time()
        cycle = args.on + args.off
        if args.on > 0 and args.off > 0 and (now - start) % cycle >= args.on:
            time.sleep(min(0.05, cycle - (now - start) % cycle))
        else:
            t0 = time.perf_counter()
            loss = step()
            done += 1
            if log:
                log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e6:.1f}\n")
            if args.model == "infer" and args.think_ms:
                time.sleep(args.think_ms / 1e3)
        if now - last >= 0.05:
            publish(args.progress, done, active_s(now - start, args.on, args.off))
            if log:
                log.flush()
            last = now
    publish(args.progress, done, active_s(time.time() - start, args.on, args.off))
    if log:
        log.close()
    if loss != loss:
        raise SystemExit("the loss is not finite")


if __name__ == "__main__":
    main()
