"""What hp.py and be.py share (scripts/gpu-pytorch-colocate.sh).

The barrier: a program builds its model and warms up, then creates its --ready file and
waits for the --go file, which holds the window's start as a Unix time (seconds, float) that
the harness picks a little in the future, once every program of the cell is ready. Every
program of a cell then measures the same wall-clock window, [start, start + --seconds), and
Python and CUDA start-up never count.

COLO_DEVICE=cpu runs everything on the CPU at tiny sizes (testing the harness without a GPU).
"""
import json
import os
import sys
import time

import torch

DEVICE = os.environ.get("COLO_DEVICE", "cuda")
CPU = DEVICE == "cpu"

if CPU:
    torch.set_num_threads(1)


def sync():
    if not CPU:
        torch.cuda.synchronize()


def add_common_args(ap):
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the measured window")
    ap.add_argument("--ready", required=True, help="file to create once warmed up")
    ap.add_argument("--go", required=True, help="file whose content is the window's start time")
    ap.add_argument("--out", required=True, help="file for the one-line JSON result")
    ap.add_argument("--go-timeout", type=float, default=600.0,
                    help="seconds to wait for --go before giving up")
    ap.add_argument("--name", default="")


def wait_for_go(args):
    """Signals ready, waits for the go file; returns the window's start (time.time())."""
    with open(args.ready + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(args.ready + ".tmp", args.ready)
    deadline = time.time() + args.go_timeout
    while True:
        try:
            with open(args.go) as f:
                text = f.read().strip()
            if text:
                start = float(text)
                break
        except (FileNotFoundError, ValueError):
            pass
        if time.time() > deadline:
            print(f"{args.name}: no go within {args.go_timeout} s", file=sys.stderr)
            sys.exit(3)
        time.sleep(0.001)
    delay = start - time.time()
    if delay > 0:
        time.sleep(delay)
    return start


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def write_result(args, result):
    result.update(name=args.name, device=DEVICE, pid=os.getpid(), uid=os.getuid())
    # What `gpushare run` put in front of the program, if anything (a check of the harness).
    result["run_under"] = {
        "governed": "interpose" in os.environ.get("LD_PRELOAD", ""),
        "consolidated": bool(os.environ.get("GPUSHARE_CUDA_DRIVER")),
        "class": os.environ.get("GPUSHARE_CLASS"),
        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
    }
    if not CPU:
        result["gpu"] = torch.cuda.get_device_name(0)
        result["max_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(result) + "\n")
    os.replace(tmp, args.out)
