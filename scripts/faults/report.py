"""Reads what scripts/gpu-pytorch-faults.sh's programs wrote and prints its tables (markdown).

  python3 report.py LOGS
LOGS holds infer.jsonl, train.jsonl and faults.jsonl (phase "storm"), and hold-<GiB>.jsonl
with faults-hold-<GiB>.jsonl (phase "held memory").
"""
import json
import os
import statistics
import sys


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def requests(path):
    return [r for r in rows(path) if "ms" in r]


def summary(path):
    done = [r for r in rows(path) if r.get("done")]
    return done[-1] if done else {}


def next_correct_ms(reqs, faults):
    """For each fault, ms from the faulting launch to the victim's next correct result."""
    out = []
    for f in faults:
        after = [r["t"] for r in reqs if r["t"] > f["t_fault"] and r.get("correct")]
        if after:
            out.append((min(after) - f["t_fault"]) * 1e3)
    return out


def fmt(xs):
    if not xs:
        return "–"
    return f"{statistics.median(xs):.1f} / {max(xs):.1f}"


def errors_near(reqs, faults, window=2.0):
    """Failed requests within `window` s after each fault, per fault."""
    return [sum(1 for r in reqs if not r["ok"] and 0 <= r["t"] - f["t_fault"] < window)
            for f in faults]


def main():
    logs = sys.argv[1]
    faults = rows(os.path.join(logs, "faults.jsonl"))
    infer = requests(os.path.join(logs, "infer.jsonl"))
    train = requests(os.path.join(logs, "train.jsonl"))
    si, st = summary(os.path.join(logs, "infer.jsonl")), summary(os.path.join(logs, "train.jsonl"))
    print("| fault | faults | inference: requests / failed / wrong | inference: fault → next correct result, ms (median / max) | trainer: steps / lost | trainer: fault → next good step, ms (median / max) |")
    print("|---|---|---|---|---|---|")
    for kind in ("assert", "illegal"):
        fs = [f for f in faults if f["kind"] == kind]
        if not fs:
            continue
        lo, hi = min(f["t_fault"] for f in fs) - 0.5, max(f["t_fault"] for f in fs) + 2.0
        ir = [r for r in infer if lo <= r["t"] <= hi]
        tr = [r for r in train if lo <= r["t"] <= hi]
        print(f"| {kind} | {len(fs)} | {len(ir)} / {sum(not r['ok'] for r in ir)} / "
              f"{sum(r['ok'] and not r['correct'] for r in ir)} | {fmt(next_correct_ms(infer, fs))} | "
              f"{len(tr)} / {sum(not r['ok'] for r in tr)} | {fmt(next_correct_ms(train, fs))} |")
    print()
    print(f"inference over the whole run: {si}")
    print(f"trainer over the whole run: {st}")
    culprit_errors = sorted({f['error'][:80] for f in faults})
    print(f"what the culprits saw: {culprit_errors}")
    lost = [r.get("error", "") for r in train if not r["ok"]]
    if lost:
        print(f"what the trainer caught ({len(lost)}): {sorted(set(e[:160] for e in lost))}")
    lost = [r.get("error", "") for r in infer if not r["ok"]]
    if lost:
        print(f"what the inference loop caught ({len(lost)}): {sorted(set(e[:160] for e in lost))}")
    def key(name):
        stem = name[len("hold-"):-len(".jsonl")]
        gib, _, how = stem.partition("-")
        return (how, float(gib), name)

    held = sorted(key(n) for n in os.listdir(logs)
                  if n.startswith("hold-") and n.endswith(".jsonl"))
    if held:
        print()
        print("| memory held by the inference program | the spare maps it | faults | fault → next correct result, ms (median / max) | failed requests | memory intact after |")
        print("|---|---|---|---|---|---|")
        for how, gib, name in held:
            reqs = requests(os.path.join(logs, name))
            fs = rows(os.path.join(logs, f"faults-{name}"))
            s = summary(os.path.join(logs, name))
            when = "at takeover" if how else "ahead"
            print(f"| {gib:g} GiB | {when} | {len(fs)} | {fmt(next_correct_ms(reqs, fs))} | "
                  f"{sum(not r['ok'] for r in reqs)} | {s.get('held_intact')} |")


if __name__ == "__main__":
    main()
