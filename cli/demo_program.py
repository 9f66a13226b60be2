"""The demo's JAX program: a small data-parallel transformer training step on 8 CPU devices.

Gradients of each microbatch are all-reduced (psum) inside a `lax.scan` and accumulated: the
pattern `while-loop-all-reduce-code-motion` moves out of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["make_train_step", "DEMO_DEVICES"]

DEMO_DEVICES = 8


def _init_params(d_model: int, d_ff: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 6)

    def dense(k, shape):
        return jax.random.normal(k, shape, jnp.float32) / jnp.sqrt(shape[0])

    return {
        "wq": dense(keys[0], (d_model, d_model)),
        "wk": dense(keys[1], (d_model, d_model)),
        "wv": dense(keys[2], (d_model, d_model)),
        "wo": dense(keys[3], (d_model, d_model)),
        "w1": dense(keys[4], (d_model, d_ff)),
        "w2": dense(keys[5], (d_ff, d_model)),
        "ln": jnp.ones((d_model,), jnp.float32),
    }


def _block(p: dict[str, Any], x: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def layer_norm(v):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) * jax.lax.rsqrt(var + 1e-5) * p["ln"]

    h = layer_norm(x)
    q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
    att = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1]), axis=-1)
    x = x + jnp.einsum("bqk,bkd->bqd", att, v) @ p["wo"]
    return x + jax.nn.gelu(layer_norm(x) @ p["w1"]) @ p["w2"]


def make_train_step(
    microbatches: int = 4, batch: int = 16, seq: int = 8, d_model: int = 32, d_ff: int = 64
) -> tuple[Callable, tuple]:
    """(jitted train step, example args) for a data-parallel step over 8 devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:DEMO_DEVICES]), ("data",))
    params = _init_params(d_model, d_ff)

    def loss(p, x, y):
        return jnp.mean((_block(p, x) - y) ** 2)

    def step(p, xs, ys):
        def micro(acc, xy):
            g = jax.grad(loss)(p, *xy)
            g = jax.tree.map(lambda t: lax.psum(t, "data"), g)
            return jax.tree.map(jnp.add, acc, g), None

        zeros = jax.tree.map(jnp.zeros_like, p)
        grads, _ = lax.scan(micro, zeros, (xs, ys))
        return jax.tree.map(lambda w, g: w - 0.01 * g / microbatches, p, grads)

    sharded = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(None, "data"), P(None, "data")), out_specs=P())
    key = jax.random.PRNGKey(1)
    xs = jax.random.normal(key, (microbatches, batch, seq, d_model), jnp.float32)
    ys = jax.random.normal(jax.random.fold_in(key, 1), (microbatches, batch, seq, d_model), jnp.float32)
    return jax.jit(sharded), (params, xs, ys)
