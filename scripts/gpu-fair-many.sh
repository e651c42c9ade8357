#!/usr/bin/env bash
# FAIR, SRTF and PACK against FIFO for many consolidated PyTorch programs (issue 31, point 1),
# from the folder scripts/gpu-bundle.sh makes; needs python3 with a CUDA build of torch, and
# root (it adds Unix users gsfair1..3).
#
# For each N in NPROGS: one gpushared, N programs (colocate/loop.py) of USERS users started
# once and left running; each user's first program trains the transformer (long kernels), the
# others an MLP at batch 8 (many tiny kernels), and where a user has three or more programs
# its last one comes and goes (3 s active, 2 s idle). Then, ROUNDS times, for each policy of
# POLICIES in turn: the policy file is rewritten and gpushared told (SIGHUP), SETTLE seconds
# pass, and a WINDOW-second window is measured: each program's iterations (from its progress
# file) and each user's GPU time (gpushared's, from `status --json`). Rounds interleave the
# policies, so each is set against the FIFO window of its own round.
#
# Prints, per N and policy: throughput against FIFO (the mean over programs of iterations over
# FIFO's, and per kind; iterations per second of each program's active time, so that where a
# window falls in a coming-and-going program's cycle does not count), and each user's share
# of the GPU time against its weight's share.
# Settings: NPROGS ("4 16"), USERS (4; 2 when N < 8), WEIGHTS ("2 1 3 2", user i gets the
# i-th), POLICIES ("fifo fair fair-sms fair-turns fair-side srtf pack"; fair-turns is
# `quantum_us = 1000`, fair-side adds `side_by_side = true`, fair-sideQ with quantum_us = Q
# (every fair name says its quantum: fair is 0, and the broker's own default side by side,
# 5 ms, is fair-side5000);
# any name ending in -aN sets `[fair] anticipate_us = N`, e.g. fair-side-a0, and then in
# -user `[fair] per_user = true`, e.g. fair-side-user, and then in -lN `[fair] lag_us = N`,
# e.g. fair-side50000-l200000, and then in -hN `[fair] hungry_us = N`, e.g. fair-side5000-h300,
# and then in -wN `[fair] waited_us = N`, e.g. fair-side5000-h1000-w1000, and then in -level
# `[fair] bank_unused = false`, e.g. fair-side5000-h1000-level, and last of all -fN
# `[fair] free_lead_us = N`, e.g. fair-side500000-user-l2000000-f1000000),
# ROUNDS (2), WINDOW (10),
# HP (set: a high-priority inference loop, colocate/loop.py --model infer, runs as user gsfairhp
# beside them, every other user best-effort; it runs alone for one window first, and the summary
# gives its p50/p99 per window against that; use with POLICIES such as "fifo priority
# priority-weight", priority-weight being `[priority] lower_by_weight = true`, issue 31 point 2,
# and priority-weight-side the same with `[fair] side_by_side = true`; a priority policy's
# name ending in -qN sets `[priority] lower_queue_us = N`),
# SETTLE (2), LOGS (default $work/logs), PYTHON (python3), ON_WINDOW (a command started at each
# window's start with its log prefix and length in seconds, e.g. a profiler; waited for).
# Each window also records the machine's CPU counters and the CPU time of gpushared, its
# device workers and the programs; the summary gives them in cores for round 1.
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
nprogs=${NPROGS:-4 16}
read -r -a weights <<< "${WEIGHTS:-2 1 3 2}"
policies=${POLICIES:-fifo fair fair-sms fair-turns fair-side srtf pack}
rounds=${ROUNDS:-2}
window=${WINDOW:-10}
settle=${SETTLE:-2}
[[ $(id -u) == 0 ]] || { echo "needs root (to run programs as other users)" >&2; exit 2; }
names=(root gsfair1 gsfair2 gsfair3)
hp=${HP:+gsfairhp}
for u in "${names[@]:1}" $hp; do
    id -u "$u" > /dev/null 2>&1 || useradd -M -s /usr/sbin/nologin "$u" || exit 2
done

work=$(mktemp -d /tmp/gpufairmany.XXXXXX)
chmod 1777 "$work"
logs=${LOGS:-$work/logs}
mkdir -p "$logs"
broker_pid=
pids=()
cleanup() {
    touch "$work/stop" 2> /dev/null
    for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
    if [[ -n $broker_pid ]]; then kill "$broker_pid" 2> /dev/null; wait "$broker_pid" 2> /dev/null; fi
}
trap cleanup EXIT
mkdir -p "$work/bin/cuda" "$work/py"
cp "$dir"/colocate/*.py "$work/py/"
for f in gpushare libcuda.so libgpushare_audit.so; do cp "$dir/$f" "$work/bin/"; done
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so.1"
ln -s ../libcuda.so "$work/bin/cuda/libcuda.so"
chmod -R a+rX "$work/py" "$work/bin"
sock=$work/gpushare.sock
gs() { timeout 20 "$work/bin/gpushare" --socket "$sock" "$@"; }

policy_file() { # POLICY USERS
    local anticipate= per_user=false lag= hungry= waited= bank= free=
    if [[ $1 =~ ^(.*)-f([0-9]+)$ ]]; then # -fN: [fair] free_lead_us = N
        free=${BASH_REMATCH[2]}
        set -- "${BASH_REMATCH[1]}" "$2"
    fi
    if [[ $1 == *-level ]]; then # -level: [fair] bank_unused = false
        bank=false
        set -- "${1%-level}" "$2"
    fi
    if [[ $1 =~ ^(.*)-w([0-9]+)$ ]]; then # -wN: [fair] waited_us = N
        waited=${BASH_REMATCH[2]}
        set -- "${BASH_REMATCH[1]}" "$2"
    fi
    if [[ $1 =~ ^(.*)-h([0-9]+)$ ]]; then # -hN: [fair] hungry_us = N
        hungry=${BASH_REMATCH[2]}
        set -- "${BASH_REMATCH[1]}" "$2"
    fi
    if [[ $1 =~ ^(.*)-l([0-9]+)$ ]]; then # -lN: [fair] lag_us = N
        lag=${BASH_REMATCH[2]}
        set -- "${BASH_REMATCH[1]}" "$2"
    fi
    if [[ $1 == *-user ]]; then # -user: [fair] per_user = true
        per_user=true
        set -- "${1%-user}" "$2"
    fi
    if [[ $1 =~ ^(.*)-a([0-9]+)$ ]]; then # -aN: [fair] anticipate_us = N
        anticipate=${BASH_REMATCH[2]}
        set -- "${BASH_REMATCH[1]}" "$2"
    fi
    local scheduler=${1%%-*} sms=false quantum=0 side=false by_weight=false
    local queue=
    [[ $1 == priority-weight* ]] && by_weight=true
    [[ $1 == priority-weight-side* ]] && side=true
    [[ $1 =~ ^priority.*-q([0-9]+)$ ]] && queue=${BASH_REMATCH[1]}
    [[ $1 == fair-sms ]] && sms=true
    [[ $1 == fair-turns ]] && quantum=1000
    [[ $1 == fair-side* ]] && quantum=${1#fair-side} side=true && quantum=${quantum:-1000}
    printf 'scheduler = "%s"\n[fair]\nshare_sms = %s\nside_by_side = %s\n' "$scheduler" "$sms" "$side"
    # FAIR's policies say their quantum; priority's lower classes get the broker's default.
    [[ $scheduler == fair ]] && printf 'quantum_us = %s\n' "$quantum"
    [[ -n $anticipate ]] && printf 'anticipate_us = %s\n' "$anticipate"
    [[ -n $lag ]] && printf 'lag_us = %s\n' "$lag"
    [[ -n $hungry ]] && printf 'hungry_us = %s\n' "$hungry"
    [[ -n $waited ]] && printf 'waited_us = %s\n' "$waited"
    [[ -n $bank ]] && printf 'bank_unused = %s\n' "$bank"
    [[ -n $free ]] && printf 'free_lead_us = %s\n' "$free"
    printf 'per_user = %s\n' "$per_user"
    printf '[priority]\nlower_by_weight = %s\n' "$by_weight"
    [[ -n $queue ]] && printf 'lower_queue_us = %s\n' "$queue"
    if [[ -n $hp ]]; then
        printf '[defaults]\nclass = "best-effort"\n[[users]]\nname = "%s"\nclass = "high"\n' "$hp"
    fi
    for ((u = 0; u < $2; u++)); do
        printf '[[users]]\nname = "%s"\nweight = %s\n' "${names[$u]}" "${weights[$u]}"
    done
}

start_loop() { # USER NAME [loop.py ARGS...]: a consolidated colocate/loop.py as USER, logs NAME.*
    local user=$1 name=$2
    shift 2
    (cd "$work" && setpriv --reuid "$user" --regid "$user" --init-groups \
        env HOME=/tmp GPUSHARE_SOCKET="$sock" "$work/bin/gpushare" run --name "$name" -- \
        "$py" "$work/py/loop.py" --progress "$work/$name.progress" --stop "$work/stop" "$@" \
        > "$out/$name.out" 2> "$out/$name.err") &
    pids+=($!)
}

all_alive() { # WHEN: stops the run if a program has exited
    for p in "${pids[@]}"; do
        kill -0 "$p" 2> /dev/null && continue
        echo "a program exited $1:" >&2
        tail -n 5 "$out"/p*.err >&2
        exit 1
    done
}

for n in $nprogs; do
    users=${USERS:-4}
    ((n < 8)) && users=${USERS:-2}
    out=$logs/n$n
    mkdir -p "$out"
    rm -f "$work/stop"
    policy_file fifo "$users" > "$work/policy.toml"
    timeout 1800 "$dir/gpushared" --socket "$sock" --socket-mode 666 --backend "${BACKEND:-cuda}" \
        --config "$work/policy.toml" --no-telemetry --log info 2> "$out/broker.log" &
    broker_pid=$!
    for _ in $(seq 100); do gs status > /dev/null 2>&1 && break; sleep 0.1; done
    # The reload signal goes to gpushared itself: `timeout` would pass it to its whole group.
    gpushared_pid=$(pgrep -P "$broker_pid" -x gpushared)
    gs status > /dev/null || { echo "gpushared did not start" >&2; tail "$out/broker.log" >&2; exit 1; }
    : > "$out/programs.txt"
    snap() { # FILE: progress of every program, the status, the time and the CPU counters
        date +%s.%N > "$1.time"
        local c t p u s
        {
            head -n 1 /proc/stat
            for c in gpushared gpushare-worker python3; do
                t=0
                for p in $(pgrep -x "$c"); do
                    read -r u s < <(awk '{print $14, $15}' "/proc/$p/stat" 2> /dev/null) && t=$((t + u + s))
                done
                echo "$c $t"
            done
        } > "$1.cpu"
        for ((p = 0; p < n; p++)); do echo "p$p $(cat "$work/p$p.progress" 2> /dev/null)"; done > "$1.progress"
        gs status --json > "$1.json"
    }
    if [[ -n $hp ]]; then
        start_loop "$hp" hp --model infer --latencies "$work/hp.lat"
        for _ in $(seq 1200); do [[ -e $work/hp.progress ]] && break; all_alive "before it was ready"; sleep 0.1; done
        [[ -e $work/hp.progress ]] || { echo "the high-priority loop did not get ready" >&2; tail "$out/hp.err" >&2; exit 1; }
        sleep "$settle"
        snap "$out/alone-a"
        sleep "$window"
        snap "$out/alone-b"
        echo "N=$n high-priority loop alone measured" >&2
    fi
    for ((p = 0; p < n; p++)); do
        u=$((p % users)) k=$((p / users))
        per_user=$(((n - u + users - 1) / users))
        model=mlp duty=()
        ((k == 0)) && model=transformer
        ((per_user >= 3 && k == per_user - 1)) && duty=(--on 3 --off 2)
        echo "p$p ${names[$u]} $model ${duty[*]:+comes-and-goes}" >> "$out/programs.txt"
        start_loop "${names[$u]}" "p$p" --model "$model" "${duty[@]}"
    done
    ready=0
    for _ in $(seq 3000); do
        ready=$(ls "$work"/p*.progress 2> /dev/null | wc -l)
        ((ready >= n)) && break
        all_alive "before it was ready"
        sleep 0.1
    done
    ((ready >= n)) || { echo "only $ready of $n programs got ready" >&2; tail -n 3 "$out"/p*.err >&2; exit 1; }
    for r in $(seq "$rounds"); do
        for pol in $policies; do
            policy_file "$pol" "$users" > "$work/policy.toml"
            kill -HUP "$gpushared_pid"
            sleep "$settle"
            snap "$out/$r-$pol-a"
            hook=
            [[ -n ${ON_WINDOW:-} ]] && { $ON_WINDOW "$out/$r-$pol" "$window" & hook=$!; }
            sleep "$window"
            snap "$out/$r-$pol-b"
            [[ -n $hook ]] && wait "$hook"
            echo "N=$n round $r $pol measured" >&2
            all_alive "during round $r's $pol window"
        done
    done
    touch "$work/stop"
    for p in "${pids[@]}"; do wait "$p"; done
    pids=()
    [[ -n $hp ]] && mv "$work/hp.lat" "$out/hp.lat"
    kill "$broker_pid" 2> /dev/null
    wait "$broker_pid" 2> /dev/null
    broker_pid=
    rm -f "$work"/p*.progress "$work/hp.progress"
done

"$py" - "$logs" "$rounds" "$policies" "${weights[*]}" << 'EOF' | tee "$logs/summary.md"
import glob, json, os, statistics, sys
logs, rounds, policies, weights = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), [int(w) for w in sys.argv[4].split()]
for out in sorted(glob.glob(f"{logs}/n*"), key=lambda d: int(d.rsplit("n", 1)[1])):
    progs = {}
    for line in open(f"{out}/programs.txt"):
        f = line.split()
        progs[f[0]] = (f[1], f[2] + ("*" if len(f) > 3 else ""))
    users = sorted({u for u, _ in progs.values()}, key=["root", "gsfair1", "gsfair2", "gsfair3"].index)
    wsum = sum(weights[["root", "gsfair1", "gsfair2", "gsfair3"].index(u)] for u in users)
    want = {u: weights[["root", "gsfair1", "gsfair2", "gsfair3"].index(u)] / wsum for u in users}

    def its(path):
        d = {}
        for line in open(path):
            f = line.split()
            if len(f) == 4:
                d[f[0]] = (int(f[1]), float(f[3]))
        return d

    def gpu(path):
        by = {}
        for c in json.load(open(path))["clients"]:
            by[c["user"]] = by.get(c["user"], 0) + c["gpu_time_ns"]
        return by

    res = {}
    for r in range(1, rounds + 1):
        for pol in policies:
            a, b = f"{out}/{r}-{pol}-a", f"{out}/{r}-{pol}-b"
            try:
                ia, ib, ga, gb = its(a + ".progress"), its(b + ".progress"), gpu(a + ".json"), gpu(b + ".json")
            except (OSError, ValueError):
                continue
            # Iterations, and iterations per second of the program's active time: a program
            # that comes and goes is active for 4-6 s of an 8 s window depending on where the
            # window falls in its cycle, so its speed is counted over its active time.
            d = {p: [b - a for a, b in zip(ia.get(p, (0, 0.0)), ib.get(p, (0, 0.0)))] for p in progs}
            res[(r, pol)] = ({p: v[0] for p, v in d.items()},
                             {u: (gb.get(u, 0) - ga.get(u, 0)) / 1e9 for u in users},
                             {p: v[0] / v[1] for p, v in d.items() if v[1] > 0})
    n = len(progs)
    print(f"\n### {n} programs, {len(users)} users (weights {', '.join(f'{u} {want[u]:.3f}' for u in users)}); * comes and goes\n")
    print("| policy | round | throughput / FIFO | transformer | mlp | GPU-time shares (" + ", ".join(users) + ") | worst share / weight's | transformer iterations' shares |")
    print("|---|---|---|---|---|---|---|---|")
    for pol in policies:
        for r in range(1, rounds + 1):
            if (r, pol) not in res or (r, "fifo") not in res:
                print(f"| {pol} | {r} | (missing) | | | | | |")
                continue
            it, g, rate = res[(r, pol)]
            base = res[(r, "fifo")][2]
            norm = {p: rate[p] / base[p] for p in progs if base.get(p) and p in rate}
            if not norm:
                print(f"| {pol} | {r} | (no program progressed in FIFO's window) | | | | | |")
                continue
            kinds = {}
            for p, v in norm.items():
                kinds.setdefault(progs[p][1].rstrip("*"), []).append(v)
            tot = sum(g.values()) or 1
            shares = {u: g[u] / tot for u in users}
            worst = max(abs(shares[u] / want[u] - 1) for u in users)
            # Every user runs the same programs, so the long-kernel trainers' iterations split
            # by user is a second reading of the shares, one that does not rest on events.
            tr = {u: sum(it[p] for p in progs if progs[p] == (u, "transformer")) for u in users}
            trsum = sum(tr.values()) or 1
            print(f"| {pol} | {r} | {statistics.mean(norm.values()):.3f} | "
                  f"{statistics.mean(kinds.get('transformer') or [float('nan')]):.3f} | "
                  f"{statistics.mean(kinds.get('mlp') or [float('nan')]):.3f} | "
                  + ", ".join(f"{shares[u]:.3f}" for u in users) + f" | {worst * 100:.1f} % | "
                  + ", ".join(f"{tr[u] / trsum:.3f}" for u in users) + " |")
    print("\niterations per window, FIFO round 1: " + ", ".join(f"{p} {v}" for p, v in res.get((1, "fifo"), ({}, {}, {}))[0].items()))

    # Where each program's time went in round 1: iterations against FIFO's, its kernels
    # launched per iteration against FIFO's (the same program: 1.00 unless it launched
    # differently), the share of the window its work was on the GPU (device time) and the
    # share the policy held it (THROTTLED: a launch waiting with none of its kernels on the GPU).
    def per_client(path):
        return {c["name"]: (c["gpu_time_ns"], c.get("throttled_ns", 0), c.get("kernels", 0)) for c in json.load(open(path))["clients"]}

    def kernels_per_iteration(pol, p):
        try:
            ka, kb = per_client(f"{out}/1-{pol}-a.json"), per_client(f"{out}/1-{pol}-b.json")
            n = res[(1, pol)][0].get(p, 0)
            return (kb[p][2] - ka[p][2]) / n if n else float("nan")
        except (OSError, ValueError, KeyError):
            return float("nan")

    cells = {}
    for pol in policies:
        a, b = f"{out}/1-{pol}-a", f"{out}/1-{pol}-b"
        try:
            ca, cb = per_client(a + ".json"), per_client(b + ".json")
            wall = (float(open(b + ".time").read()) - float(open(a + ".time").read())) * 1e9
        except (OSError, ValueError):
            continue
        rate, base = res.get((1, pol), ({}, {}, {}))[2], res.get((1, "fifo"), ({}, {}, {}))[2]
        for p in progs:
            if p not in ca or p not in cb:
                continue
            busy = (cb[p][0] - ca[p][0]) / wall
            held = (cb[p][1] - ca[p][1]) / wall
            ratio = rate.get(p, 0) / base[p] if base.get(p) else float("nan")
            kpi = kernels_per_iteration(pol, p) / kernels_per_iteration("fifo", p)
            cells[(p, pol)] = f"{ratio:.2f} / {kpi:.2f} / {busy * 100:.0f} / {held * 100:.0f}"
    # CPU in round 1's windows, in cores: the whole machine's busy time, gpushared's, its
    # device workers' and the programs'.
    def cpu(path):
        v = {}
        for line in open(path):
            f = line.split()
            if f[0] == "cpu":
                v["busy"] = sum(int(x) for x in f[1:9]) - int(f[4]) - int(f[5])
            elif len(f) == 2:
                v[f[0]] = int(f[1])
        return v

    rows = []
    for pol in policies:
        try:
            ca, cb = cpu(f"{out}/1-{pol}-a.cpu"), cpu(f"{out}/1-{pol}-b.cpu")
            wall = float(open(f"{out}/1-{pol}-b.time").read()) - float(open(f"{out}/1-{pol}-a.time").read())
        except (OSError, ValueError, IndexError):
            continue
        hz = os.sysconf("SC_CLK_TCK")
        d = {k: (cb.get(k, 0) - ca.get(k, 0)) / hz / wall for k in ("busy", "gpushared", "gpushare-worker", "python3")}
        rows.append(f"| {pol} | {os.cpu_count()} | {d['busy']:.2f} | {d['gpushared']:.2f} | {d['gpushare-worker']:.2f} | {d['python3']:.2f} |")
    if rows:
        print("\nround 1, CPU in cores\n")
        print("| policy | cores | machine busy | gpushared | workers | programs |")
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
    if cells:
        print("\nround 1, each program: iterations per active second / FIFO's, kernels per iteration / FIFO's, % of the window on the GPU, % held by the policy\n")
        print("| program | " + " | ".join(policies) + " |")
        print("|---|" + "---|" * len(policies))
        for p in progs:
            print(f"| {p} ({progs[p][0]}, {progs[p][1]}) | " + " | ".join(cells.get((p, pol), "–") for pol in policies) + " |")
    if os.path.exists(f"{out}/hp.lat"):
        lat = []
        for line in open(f"{out}/hp.lat"):
            f = line.split()
            if len(f) == 2:
                lat.append((float(f[0]), float(f[1]) / 1e3))

        def window_ms(name):
            try:
                a, b = (float(open(f"{out}/{name}-{e}.time").read()) for e in "ab")
            except (OSError, ValueError):
                return []
            return sorted(ms for t, ms in lat if a <= t < b)

        def pct(v, q):
            return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")

        alone = window_ms("alone")
        print(f"\nhigh-priority loop (MLP inference, batch 8, 2 ms think): alone p50 {pct(alone, 0.5):.3f} ms, p99 {pct(alone, 0.99):.3f} ms ({len(alone)} requests)\n")
        print("| policy | round | p50 ms | p99 ms | p99 / alone's | requests |")
        print("|---|---|---|---|---|---|")
        for pol in policies:
            for r in range(1, rounds + 1):
                v = window_ms(f"{r}-{pol}")
                print(f"| {pol} | {r} | {pct(v, 0.5):.3f} | {pct(v, 0.99):.3f} | {pct(v, 0.99) / pct(alone, 0.99):.2f} | {len(v)} |")
EOF
