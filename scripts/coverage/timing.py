"""Time per step for the coverage programs (reported beside their values, not compared).

TIMED_STEPS (default 200) steps are timed, after WARM_S (default 0) seconds of untimed ones:
the speed runs of gpu-coverage.sh warm for a second, so that the GPU's clocks have risen
before the first timed step whichever run comes first.
"""
import os
import time


def median_ms(step):
    """The median time of one call of `step`, in ms."""
    until = time.perf_counter() + float(os.environ.get("WARM_S", "0"))
    while time.perf_counter() < until:
        step()
    times = []
    for _ in range(int(os.environ.get("TIMED_STEPS", "200"))):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3
