#!/usr/bin/env python3
"""Where a launch and its sync spend their time in gpushared, from its timeline.

Reads the stderr of a `gpushared` run with GPUSHARE_TIMELINE=1 (the data threads' command
notes, the workers' call notes, and the points where a call is sent, answered, got and
replied: broker/src/timeline.rs), during a loop of a launch followed by a stream sync (the
`launch` scenario of gpushare-bench). For each round trip (from the data thread's start on a
launch command followed by a StreamSync to its start on the next such launch) it lists every
event as its offset from that start, and prints the median offset of each event over the
round trips of the commonest shape (and of the second commonest), with the step from the
event before it.

    GPUSHARE_TIMELINE=1 gpushare-bench --broker ./gpushared --rounds 1 --scenarios launch \\
        --modes direct,broker --broker-arg=--no-telemetry 2> timeline.err
    scripts/timeline-round-trip.py timeline.err
"""
import statistics as st
import sys
from collections import Counter, defaultdict

from timeline_lines import read


def main(path):
    ev = read(path)
    # The data thread's commands (points have no duration).
    cmds = [i for i, e in enumerate(ev) if e[1] == 'data' and e[3] > 0]
    anchors = [a for a, b in zip(cmds, cmds[1:])
               if ev[a][2].startswith('Launch') and ev[b][2] == 'StreamSync']
    shapes = Counter()
    rows = defaultdict(list)
    for a, nxt in zip(anchors, anchors[1:]):
        t0 = ev[a][0]
        seq = []
        for t, who, name, took, *_ in ev[a:nxt]:
            seq.append((who[:6], name, t - t0))
            if took > 0:
                seq.append((who[:6], name + '.end', t + took - t0))
        seq.sort(key=lambda x: x[2])
        sig = tuple((w, n) for w, n, _ in seq)
        shapes[sig] += 1
        rows[sig].append([x[2] for x in seq] + [ev[nxt][0] - t0])
    print(f'round trips {max(len(anchors) - 1, 0)}, shapes {len(shapes)}')
    for sig, n in shapes.most_common(2):
        print(f'--- shape seen {n} times (µs from the launch command\'s start; step)')
        prev = 0.0
        for (who, name), col in zip(list(sig) + [('data', 'next launch')], zip(*rows[sig])):
            at = st.median(col)
            print(f'  {at:8.3f}  (+{at - prev:6.3f})  {who:6s} {name}')
            prev = at


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
