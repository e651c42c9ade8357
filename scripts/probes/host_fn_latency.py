"""How long a host function queued on a stream takes to run (`cuLaunchHostFunc`, through
CuPy's `Stream.launch_host_func`), the way JAX's `block_until_ready` waits for each step:
with an idle stream, and after a short kernel. Prints the median and p90 in µs of each.

    python3 host_fn_latency.py [N]              # directly
    gpushare run -- python3 host_fn_latency.py  # consolidated
"""
import sys
import threading
import time


def main():
    import cupy as cp

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    s = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(1 << 16, dtype=cp.float32)
    done = threading.Event()

    def called(_):
        done.set()

    results = {}
    for case in ("idle", "after_kernel"):
        times = []
        for i in range(n + 50):
            done.clear()
            with s:
                if case == "after_kernel":
                    x += 1
                t = time.perf_counter()
                s.launch_host_func(called, None)
            done.wait()
            if i >= 50:
                times.append(time.perf_counter() - t)
        s.synchronize()
        times.sort()
        results[case] = (times[len(times) // 2] * 1e6, times[int(len(times) * 0.9)] * 1e6)
    print(" ".join(f"{k}_us {v[0]:.1f} {v[1]:.1f}" for k, v in results.items()))


if __name__ == "__main__":
    main()
