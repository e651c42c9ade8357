"""A training loop that runs until told to stop, for scripts/gpu-fair-many.sh: many of these
run consolidated at once while gpushared's policy is switched under them (SIGHUP), and the
harness counts each one's iterations per window from its --progress file.

--model mlp: 6 x (Linear --width + GELU) at batch --batch, MSE loss, SGD: at batch 8 and
width 1024 a step is many tiny kernels. --model transformer: the transformer of be.py (d 512,
4 layers, sequence 256, bf16 autocast), long kernels. Each iteration ends with loss.item().

--on S --off S: active S seconds, then idle (connected, no GPU work) S seconds, on the
program's own clock: a program that comes and goes.

--progress FILE gets "ITERATIONS TIME" (cumulative, wall time) about every 50 ms, replaced
atomically; the program stops when --stop FILE exists or after --seconds.
"""
import argparse
import os
import time

from be import build


def publish(path, done):
    with open(path + ".tmp", "w") as f:
        f.write(f"{done} {time.time():.6f}\n")
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "transformer"], required=True)
    ap.add_argument("--batch", type=int, default=0, help="default 8 for mlp, 16 for transformer")
    ap.add_argument("--width", type=int, default=1024, help="mlp width")
    ap.add_argument("--on", type=float, default=0.0, help="seconds active per cycle (0: always)")
    ap.add_argument("--off", type=float, default=0.0, help="seconds idle per cycle")
    ap.add_argument("--progress", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--seconds", type=float, default=900.0)
    args = ap.parse_args()
    batch = args.batch or (8 if args.model == "mlp" else 16)
    step = build(args.model, batch, width=args.width)
    for _ in range(5):
        step()
    done, loss = 0, 0.0
    publish(args.progress, done)
    start = last = time.time()
    while not os.path.exists(args.stop) and time.time() - start < args.seconds:
        now = time.time()
        cycle = args.on + args.off
        if args.on > 0 and args.off > 0 and (now - start) % cycle >= args.on:
            time.sleep(min(0.05, cycle - (now - start) % cycle))
        else:
            loss = step()
            done += 1
        if now - last >= 0.05:
            publish(args.progress, done)
            last = now
    publish(args.progress, done)
    if loss != loss:
        raise SystemExit("the loss is not finite")


if __name__ == "__main__":
    main()
