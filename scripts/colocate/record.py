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
            text = tail(f"{prefix}.{name}.err", 2) if prefix else ""
            if text:
                errors[name] = text
            continue
        if name == "hp":
            rec["hp"] = r
        else:
            rec["be"].append(r)
    # The broker's view mid-window (gpushare status --json), when there was a broker.
    try:
        with open(os.path.join(cell, "status.json")) as f:
            st = json.load(f)
        rec["broker_clients"] = [
            {k: c.get(k) for k in ("name", "class", "governed", "kernels", "throttled_ns")}
            for c in st.get("clients", [])]
    except (OSError, ValueError):
        pass
    # Each program ran the way its setup says (what `gpushare run` or MPS put in its
    # environment), and the broker saw the classes asked for.
    warnings = []
    setup = rec.get("setup")
    for r in ([rec["hp"]] if rec["hp"] else []) + rec["be"]:
        u = r.get("run_under", {})
        want_class = "high" if r.get("role") == "hp" else "best-effort"
        expect = {
            "governed": u.get("governed") and u.get("class") == want_class,
            "cons": u.get("consolidated") and u.get("class") == want_class,
            "cons-lowsm": u.get("consolidated") and u.get("class") == want_class,
            "cons-domain": u.get("consolidated") and u.get("class") == want_class,
            "cons-domain-beside": u.get("consolidated") and u.get("class") == want_class,
            "mps": u.get("mps") and not u.get("governed") and not u.get("consolidated"),
        }.get(setup, not (u.get("governed") or u.get("consolidated") or u.get("mps")))
        if not expect:
            warnings.append(f"{r.get('name')} ran as {u} under setup {setup}")
    for c in rec.get("broker_clients", []):
        want_class = "high" if c.get("name") == "hp" else "best-effort"
        if c.get("class") != want_class:
            warnings.append(f"broker: {c.get('name')} in class {c.get('class')}, not {want_class}")
    # (On the CPU, COLO_DEVICE=cpu, programs need not open a session at all.)
    if "broker_clients" in rec and rec.get("device") != "cpu" and len(rec["broker_clients"]) != len(names):
        warnings.append(f"broker saw {len(rec['broker_clients'])} clients mid-window, "
                        f"not {len(names)}")
    if warnings:
        rec["warnings"] = warnings
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
        if hp.get("slowest"):
            parts.append("slowest " + ", ".join(f"{ms:.2f} ms at {at} ms" for ms, at in hp["slowest"][:3]))
    if rec["be"]:
        total = sum(b.get("it_per_s", 0) for b in rec["be"])
        parts.append(f"BE {total:.2f} it/s over {len(rec['be'])}")
    if rec.get("partition"):
        parts.append(f"partition: {rec['partition']}")
    line = status + (": " + ", ".join(parts) if parts else "")
    if warnings:
        line += " — WARNING: " + "; ".join(warnings)
    if errors:
        line += " — " + "; ".join(f"{k}: {v}" for k, v in errors.items())
    print(line)


if __name__ == "__main__":
    main()
