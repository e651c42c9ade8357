"""The lines of gpushared's timeline (broker/src/timeline.rs), for the timeline-*.py scripts."""
import re

LINE = re.compile(r'timeline: (\w+) t=([\d.]+) (\w+) ([\d.]+) tid=(\d+)'
                  r'(?: oncpu=(\d+) preempted=(\d+))?')


def read(path):
    """Every note in `path`, in time order: (t µs, who, what, took µs, tid, cpu), where cpu is
    (µs on a core, preemptions) from a GPUSHARE_TIMELINE=2 run, else None."""
    ev = []
    with open(path, errors='replace') as f:
        for line in f:
            m = LINE.search(line)
            if m:
                cpu = m.group(6) and (int(m.group(6)), int(m.group(7)))
                ev.append((float(m.group(2)), m.group(1), m.group(3), float(m.group(4)),
                           int(m.group(5)), cpu))
    ev.sort(key=lambda e: e[:5])  # cpu may be None beside a tuple
    return ev
