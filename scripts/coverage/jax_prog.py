"""JAX programs for the coverage matrix (scripts/gpu-coverage.sh): each prints one JSON line,
{"ok": true, "values": [...]}, that the run directly and the run through gpushare must agree on.

    python3 jax_prog.py jit|grad|train|loop

loop: a `lax.fori_loop` and a `lax.scan` under `jit` (XLA may run loops as conditional
nodes of a command buffer).
"""
import json
import sys

from timing import median_ms

TIMING = {}


def train_setup():
    """The training case's jitted step (a small MLP's loss, gradient and update) and its
    first parameters (also scripts/probes/step_calls.py's step)."""
    import jax
    import jax.numpy as jnp

    k1, k2, k3, _ = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jax.random.normal(k1, (256, 32), jnp.float32)
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    params = [jax.random.normal(k2, (32, 128)) * 0.1, jnp.zeros(128),
              jax.random.normal(k3, (128, 1)) * 0.1, jnp.zeros(1)]

    def loss(p):
        h = jax.nn.relu(x @ p[0] + p[1])
        return jnp.mean((h @ p[2] + p[3] - y) ** 2)

    @jax.jit
    def step(p):
        l, g = jax.value_and_grad(loss)(p)
        return [a - 0.05 * b for a, b in zip(p, g)], l

    return step, params


def main(case):
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    if jax.devices()[0].platform != "gpu":
        raise RuntimeError(f"JAX runs on {jax.devices()[0].platform}, not the GPU")
    if case == "jit":
        x = jax.random.normal(key, (1024, 1024), jnp.float32)
        y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0))(x)
        return [float(v) for v in y[:16]] + [float(y.sum())]
    if case == "grad":
        k1, k2, k3 = jax.random.split(key, 3)
        x = jax.random.normal(k1, (512, 256), jnp.float32)
        w = jax.random.normal(k2, (256, 64), jnp.float32)
        t = jax.random.normal(k3, (512, 64), jnp.float32)
        g = jax.jit(jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - t) ** 2)))(w)
        return [float(v) for v in g.ravel()[:16]] + [float(g.sum())]
    if case == "loop":
        k1, k2 = jax.random.split(key)
        w = jax.random.normal(k1, (256, 256), jnp.float32) / 16
        x = jax.random.normal(k2, (64, 256), jnp.float32)
        looped = jax.jit(lambda v: jax.lax.fori_loop(0, 20, lambda i, v: jnp.tanh(v @ w), v))(x)
        scanned, _ = jax.jit(lambda v: jax.lax.scan(lambda c, _: (jnp.tanh(c @ w) + 0.1, None),
                                                     v, None, length=20))(x)
        return ([float(v) for v in looped.ravel()[:8]] + [float(looped.sum())]
                + [float(v) for v in scanned.ravel()[:8]] + [float(scanned.sum())])
    if case == "train":
        step, params = train_setup()
        losses = []
        for _ in range(100):
            params, l = step(params)
            losses.append(float(l))
        # Time per step once compiled.
        state = [params]

        def one():
            state[0], l = step(state[0])
            l.block_until_ready()

        TIMING["ms"] = median_ms(one)
        return losses
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    try:
        values = main(sys.argv[1])
        print(json.dumps({"ok": True, "values": values, **TIMING}))
    except Exception as e:  # the matrix records it; the run's stderr says more
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))
