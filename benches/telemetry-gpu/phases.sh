#!/usr/bin/env bash
# alloc_phases.py runs once; telemetry is attached and detached every PHASE seconds around it.
set -u
cd "$(dirname "$0")"
PHASE=${PHASE:-3}; N=${N:-8}; MODE=${MODE:---no-uprobes}
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
python3 alloc_phases.py $(( PHASE * N * 2 + 4 )) 100 blocks.txt &
py=$!
sleep 3
: > phases.txt
for i in $(seq 1 "$N"); do
  t0=$(date +%s.%N); sleep "$PHASE"; t1=$(date +%s.%N); echo "off $t0 $t1" >> phases.txt
  ./gpushare-telemetry-watch $MODE -- sleep "$PHASE" > /dev/null 2>watch.err &
  w=$!; sleep 0.3; t0=$(date +%s.%N); wait $w; t1=$(date +%s.%N); echo "on $t0 $t1" >> phases.txt
done
wait $py
python3 - <<'PY'
import statistics as st
ph = [l.split() for l in open("phases.txt")]
bl = [tuple(map(float, l.split())) for l in open("blocks.txt")]
res = {"on": [], "off": []}
for kind, a, b in ph:
    a, b = float(a), float(b)
    for t0, t1 in bl:
        if t0 >= a and t1 <= b:
            res[kind].append((t1 - t0) / 100 * 1e6)
for k, v in res.items():
    print(f"{k:>3}: {len(v)} blocks of 100, median {st.median(v):.2f} us, mean {st.mean(v):.2f} us per alloc+free")
on, off = st.median(res["on"]), st.median(res["off"])
print(f"telemetry adds {100 * (on / off - 1):.1f}% (median)")
PY
