"""One cell's record for scripts/gpu-pytorch-colocate.sh: reads the programs' result files
from the cell's folder, appends one JSON line to the results file and prints a short summary.

record.py CELL_DIR RESULTS_JSONL META_JSON STATUS [LOG_PREFIX]
  META_JSON: the cell's description (run, round, setup, pair, trainers, ...) as a JSON object.
  STATUS: ok, or what went wrong (blocked: ..., not ready: ..., ...); a program that was
  expected and left no result turns an ok into "missing: NAME".
  LOG_PREFIX: the programs' stderr is in LOG_PREFIX.NAME.err; the last line of a failed
  program's is kept in the record.
"""
import json
import os
import sys


def tail(path, n=1):
    try:
        with open(path, errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip()]
        return " | ".join(lines[-n:])[-400:]
    except OSError:
        return ""


def main():
    cell, results, meta, status = sys.argv[1:5]
    prefix = sys.argv[5] if len(sys.argv) > 5 else None
    rec = json.loads(meta)
    rec["hp"], rec["be"] = None, []
    missing, errors = [], {}
    names = (["hp"] if rec.get("hp_on") else []) + [f"be{i}" for i in range(rec.get("trainers", 0))]
    for name in names:
        path = os.path.join(cell, name + ".json")
        try:
            with open(path) as f:
                r = json.loads(f.readline())
        except (OSError, ValueError):
            missing.append(name)
            if prefix:
                errors[name] = tail(f"{prefix}.{name}.err", 2)
            continue
        if name == "hp":
            rec["hp"] = r
        else:
            rec["be"].append(r)
    if missing and status == "ok":
        status = "missing: " + " ".join(missing)
    rec["status"] = status
    if errors:
        rec["errors"] = errors
    with open(results, "a") as f:
        f.write(json.dumps(rec) + "\n")

    parts = []
    hp = rec["hp"]
    if hp and hp.get("p99_ms") is not None:
        parts.append(f"HP p50 {hp['p50_ms']:.3f} p99 {hp['p99_ms']:.3f} ms ({hp['requests']} req)")
    if rec["be"]:
        total = sum(b.get("it_per_s", 0) for b in rec["be"])
        parts.append(f"BE {total:.2f} it/s over {len(rec['be'])}")
    if rec.get("partition"):
        parts.append(f"partition: {rec['partition']}")
    line = status + (": " + ", ".join(parts) if parts else "")
    if errors:
        line += " — " + "; ".join(f"{k}: {v}" for k, v in errors.items() if v)
    print(line)


if __name__ == "__main__":
    main()
