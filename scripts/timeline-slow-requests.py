#!/usr/bin/env python3
"""What else gpushared and its device workers did during a client's slowest requests.

Reads the stderr of a `gpushared` run with GPUSHARE_TIMELINE=1 (broker/src/timeline.rs). A
request of the client under study is its commands from the first one after a `StreamSync`
to the end of the next `StreamSync`; the client is the data thread with the most
`IterationEnd` commands (the colocate bench's high-priority client ends every request with
one; its best-effort clients never do), else the one with the most `StreamSync` commands, or
the one given with `--tid`. The timeline is cut where nothing happened for 200 ms (one
gpushared ending, the next starting) and the last part with a `StreamSync` is read, or the
one `--part` names (from 0). For each of its slowest requests it prints the request's own
commands and, for every other thread, what it did that overlapped the request: its
commands and calls counted by name, and each one longer than `--long` µs with its offset.

    GPUSHARE_TIMELINE=1 gpushare-bench --broker ./gpushared --scenarios colocate \\
        --modes broker --be-counts 4 --rounds 1 2> timeline.err
    scripts/timeline-slow-requests.py timeline.err [--top 5] [--long 200] [--tid N] [--part K] [--skip 20]

With `--durations` it prints instead, for each thread of the part, how long each kind of
command or call took (count, p50, p99, greatest, and how many took longer than `--long`).
From a `GPUSHARE_TIMELINE=2` run, long calls also say how long the thread was off its core
during them and how often it was preempted.
"""
import argparse
from collections import Counter, defaultdict

from timeline_lines import read


def requests(ev, tid):
    """(start, end, [events]) of each request of the data thread `tid`."""
    mine = [e for e in ev if e[4] == tid and e[1] == 'data' and e[3] > 0]
    out, cur = [], []
    for e in mine:
        if e[2] == 'IterationEnd' and not cur:
            continue
        cur.append(e)
        if e[2] == 'StreamSync':
            out.append((cur[0][0], e[0] + e[3], cur))
            cur = []
    return out


def on_cpu(e):
    """What GPUSHARE_TIMELINE=2 says of a call: its time on a core, and preemptions."""
    if not e[5]:
        return ''
    return f' ({e[5][0]} µs on a core, preempted {e[5][1]})'


def durations(ev, long):
    took = defaultdict(list)
    slow_cpu = defaultdict(list)
    for e in ev:
        if e[3] > 0:
            took[(e[4], e[1], e[2])].append(e[3])
            if e[3] > long and e[5]:
                slow_cpu[(e[4], e[1], e[2])].append((e[3] - e[5][0], e[5][1]))
    for (tid, who, name), xs in sorted(took.items()):
        if len(xs) < 20:
            continue
        xs.sort()
        q = lambda p: xs[min(len(xs) - 1, int(p / 100 * len(xs)))]
        slow = sum(x > long for x in xs)
        cpu = slow_cpu.get((tid, who, name))
        off = ''
        if cpu:
            off = (f'; of those, preempted: {sum(p > 0 for _, p in cpu)}, off a core: '
                   f'{sorted(o for o, _ in cpu)[len(cpu) // 2]:.0f} µs by median')
        print(f'{who} {tid} {name}: {len(xs)}, p50 {q(50):.1f} p99 {q(99):.1f} '
              f'max {xs[-1]:.0f} µs, {slow} over {long:.0f}{off}')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('path')
    ap.add_argument('--top', type=int, default=5)
    ap.add_argument('--long', type=float, default=200.0, help='µs')
    ap.add_argument('--tid', type=int)
    ap.add_argument('--part', type=int)
    ap.add_argument('--durations', action='store_true')
    ap.add_argument('--skip', type=int, default=0,
                    help="the client's first requests left out (the colocate bench warms up with 20)")
    a = ap.parse_args()
    ev = read(a.path)
    parts, last = [[]], None
    for e in ev:
        if last is not None and e[0] - last > 2e5:
            parts.append([])
        parts[-1].append(e)
        last = max(last or 0, e[0] + e[3])
    with_syncs = [i for i, p in enumerate(parts)
                  if any(e[1] == 'data' and e[2] == 'StreamSync' for e in p)]
    part = a.part if a.part is not None else (with_syncs or [len(parts) - 1])[-1]
    ev = parts[part]
    print(f'part {part} of {len(parts)} (with syncs: {with_syncs})')
    if a.durations:
        durations(ev, a.long)
        return
    syncs = Counter(e[4] for e in ev if e[1] == 'data' and e[2] == 'StreamSync')
    ends = Counter(e[4] for e in ev if e[1] == 'data' and e[2] == 'IterationEnd')
    if not syncs:
        raise SystemExit('no StreamSync commands on the timeline')
    tid = a.tid or (ends or syncs).most_common(1)[0][0]
    reqs = requests(ev, tid)[a.skip:]
    durs = sorted(r[1] - r[0] for r in reqs)
    pct = lambda p: durs[min(len(durs) - 1, int(p / 100 * len(durs)))]
    print(f'client data thread {tid}: {len(reqs)} requests, p50 {pct(50):.1f} µs, '
          f'p99 {pct(99):.1f} µs, max {durs[-1]:.1f} µs')
    print('threads:', ', '.join(f'{t} ({w}, {n})' for (t, w), n in
                                sorted(Counter((e[4], e[1]) for e in ev).items())))
    for s, e, own in sorted(reqs, key=lambda r: r[0] - r[1])[:a.top]:
        print(f'\n== request at t={s:.1f} µs: {e - s:.1f} µs')
        print('  its commands:', ', '.join(f'{x[2]} +{x[0] - s:.0f} ({x[3]:.0f})' for x in own))
        others = defaultdict(list)
        for x in ev:
            if x[0] > e:
                break
            if x[4] != tid and x[0] + x[3] >= s:
                others[(x[4], x[1])].append(x)
        for (t, who), xs in sorted(others.items()):
            counts = Counter(x[2] for x in xs)
            busy = sum(min(x[0] + x[3], e) - max(x[0], s) for x in xs)
            print(f'  {who} {t}: {len(xs)} events, {busy:.0f} µs inside; ' +
                  ', '.join(f'{n} {c}' for n, c in counts.most_common(6)))
            for x in xs:
                if x[3] >= a.long:
                    print(f'      long: {x[2]} at {x[0] - s:+.0f} µs for {x[3]:.0f} µs'
                          + on_cpu(x))


if __name__ == '__main__':
    main()
