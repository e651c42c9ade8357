"""Median table of scripts/gpu-pytorch-colocate.sh's results.

summarize.py FILE.jsonl... : one or more colocate.jsonl files (from one or several runs of the
harness) rebuilt into one markdown table: per users mode, pair and trainer count, per setup,
the medians across rounds of HP p50 and p99 (ms), of HP p50 and p99 as ratios to HP alone and of BE
iterations/s (summed over the trainers) as a fraction of one BE trainer alone. A ratio is
taken against the alone cell of the same run and round, then medianed; where a run has no
alone cell for that round, against the median of every alone cell of that pair on the same
GPU model (marked *).
"""
import json
import statistics
import sys
from collections import defaultdict

PAIRS = ["mlp", "bert"]
SETUPS = ["alone", "plain", "mps", "governed", "cons", "cons-lowsm", "cons-domain",
          "cons-domain-beside"]


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    print(f"{path}:{n}: not JSON, skipped", file=sys.stderr)
    return rows


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def fmt(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def gpu(r):
    first = r.get("hp") or (r.get("be") or [{}])[0]
    return first.get("gpu", r.get("device"))


def be_sum(r):
    return sum(b.get("it_per_s") or 0.0 for b in r["be"]) if r.get("be") else None


def main(paths):
    rows = load(paths)
    if not rows:
        print("no results")
        return 1
    # Baselines: the HP alone and one BE trainer alone, per (run, round, pair).
    hp_alone, hp50_alone, be_alone = {}, {}, {}
    hp_alone_all, hp50_alone_all, be_alone_all = defaultdict(list), defaultdict(list), defaultdict(list)
    for r in rows:
        if r.get("setup") != "alone" or r.get("status") != "ok":
            continue
        key = (r.get("run"), r.get("round"), r.get("pair"))
        if r.get("hp_on") and r.get("hp") and r["hp"].get("p99_ms") is not None:
            hp_alone[key] = r["hp"]["p99_ms"]
            hp_alone_all[(r["pair"], gpu(r))].append(r["hp"]["p99_ms"])
            hp50_alone[key] = r["hp"]["p50_ms"]
            hp50_alone_all[(r["pair"], gpu(r))].append(r["hp"]["p50_ms"])
        elif not r.get("hp_on") and r.get("be"):
            be_alone[key] = be_sum(r)
            be_alone_all[(r["pair"], gpu(r))].append(be_alone[key])

    def baseline(table, table_all, r):
        key = (r.get("run"), r.get("round"), r.get("pair"))
        if key in table:
            return table[key], False
        m = med(table_all.get((r.get("pair"), gpu(r)), []))
        return m, m is not None

    groups = defaultdict(list)
    for r in rows:
        users = r.get("users", "same")
        if r.get("setup") == "alone":
            trainers = "–"
        else:
            trainers = r.get("trainers", 0)
        groups[(users, r.get("pair"), trainers, r.get("setup"))].append(r)

    out = []
    out.append("| users | pair | BE trainers | setup | HP p50 ms | HP p99 ms | HP p99 pooled ms "
               "| HP p50 / alone | HP p99 / alone | BE it/s (sum) | BE / one alone | cells ok "
               "| notes |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def order(k):
        users, pair, trainers, setup = k
        return (users != "same", PAIRS.index(pair) if pair in PAIRS else 9, str(pair),
                -1 if trainers == "–" else trainers,
                SETUPS.index(setup) if setup in SETUPS else 99, str(setup))

    for key in sorted(groups, key=order):
        users, pair, trainers, setup = key
        cells = groups[key]
        p50s, p99s, ratios, ratios50, fracs, sums, lats = [], [], [], [], [], [], []
        notes, fallback = defaultdict(int), False
        ok = 0
        for r in cells:
            status = r.get("status", "?")
            if status != "ok":
                notes[status] += 1
            else:
                ok += 1
            if r.get("warnings"):
                notes["warnings (see jsonl)"] += 1
            if r.get("partition"):
                notes[f"partition: {r['partition']}"] += 1
            hp = r.get("hp")
            if hp and hp.get("p99_ms") is not None:
                p50s.append(hp["p50_ms"])
                p99s.append(hp["p99_ms"])
                lats.extend(hp.get("lat_us") or [])
                base, fb = baseline(hp_alone, hp_alone_all, r)
                if base:
                    ratios.append(hp["p99_ms"] / base)
                    fallback |= fb
                base, fb = baseline(hp50_alone, hp50_alone_all, r)
                if base:
                    ratios50.append(hp["p50_ms"] / base)
                    fallback |= fb
            s = be_sum(r)
            if s is not None:
                sums.append(s)
                base, fb = baseline(be_alone, be_alone_all, r)
                if base:
                    fracs.append(s / base)
                    fallback |= fb
        star = "*" if fallback else ""
        ratio, ratio50, frac = med(ratios), med(ratios50), med(fracs)
        note = "; ".join(f"{k}" + (f" (×{v})" if v > 1 else "") for k, v in notes.items())
        pooled = pct(lats, 0.99) / 1e3 if lats else None
        out.append(
            f"| {users} | {pair} | {trainers} | {setup} | {fmt(med(p50s))} | {fmt(med(p99s))} "
            f"| {fmt(pooled)} | {fmt(ratio50, '.2f')}{star if ratio50 is not None else ''} "
            f"| {fmt(ratio, '.2f')}{star if ratio is not None else ''} "
            f"| {fmt(med(sums), '.2f')} | {fmt(frac, '.2f')}{star if frac is not None else ''} "
            f"| {ok}/{len(cells)} | {note} |")
    print("\n".join(out))
    runs = sorted({r.get("run") for r in rows})
    gpus = sorted({str(gpu(r)) for r in rows if r.get("hp") or r.get("be")})
    print(f"\nmedians across rounds; runs: {', '.join(map(str, runs))}; device: {', '.join(gpus) or '?'}")
    print("HP pairs: mlp = MLP inference (6 x Linear 2048, batch 8) beside MLP trainers "
          "(batch 512); bert = one BERT-base encoder layer (seq 128) beside transformer "
          "trainers (4 layers, d 512, seq 256, batch 16). BE / one alone: the trainers' "
          "summed it/s over one trainer's alone.")
    if any("*" in line for line in out[2:]):
        print("* against the median of every alone cell of that pair on the same GPU model (no "
              "alone cell in that run and round)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
