"""Which CUDA driver calls one small synchronous step makes, under GPUSHARE_CUDA_TRACE=2
(gpushare's driver names every call on stderr): prints "== steps begin" and "== steps end" on
stderr around STEPS timed steps, so the calls between them can be counted per step, and the
median step time on stdout.

    GPUSHARE_CUDA_TRACE=2 gpushare run -- python3 step_calls.py jax|cupy|torch [STEPS] 2> trace.txt
"""
import os
import sys
import time


def jax_step():
    # The coverage matrix's JAX training step (coverage/jax_prog.py train).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "coverage"))
    from jax_prog import train_setup

    step, params = train_setup()
    state = {"p": params}

    def run():
        state["p"], l = step(state["p"])
        l.block_until_ready()

    return run


def cupy_step():
    # The coverage matrix's CuPy product: 512 x 512, its sum read back.
    import cupy as cp

    a = cp.random.default_rng(0).standard_normal((512, 512), dtype=cp.float32)

    def run():
        (a @ a).sum().item()

    return run


def torch_step():
    # A latency-bound PyTorch step: a small product, its sum read back (`.item()`: a copy to
    # pageable memory, then a stream synchronization).
    import torch

    a = torch.randn(256, 256, device="cuda")

    def run():
        (a @ a).sum().item()

    return run


def main():
    which = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    run = {"jax": jax_step, "cupy": cupy_step, "torch": torch_step}[which]()
    for _ in range(100):
        run()
    times = []
    print("== steps begin", file=sys.stderr, flush=True)
    for _ in range(steps):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    print("== steps end", file=sys.stderr, flush=True)
    times.sort()
    print(f"{which} steps {steps} median_ms {times[len(times) // 2] * 1e3:.4f}")


if __name__ == "__main__":
    main()
