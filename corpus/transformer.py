"""N-layer transformer training steps from jax, sized to instruction counts (the benchmarks' scaling inputs)."""

from __future__ import annotations

import os
from functools import cache

os.environ.setdefault("JAX_PLATFORMS", "cpu")

__all__ = ["transformer_step_text", "module_of_size", "step_or_file", "SIZES", "stack_loss", "layer_norm"]

#: Target instruction counts of the benchmark modules.
SIZES = {"1k": 1_000, "5k": 5_000, "20k": 20_000, "100k": 100_000}


def layer_norm(x, g):  # noqa: ANN001, ANN201 - jax arrays
    """Layer norm over the last axis, scaled by `g`."""
    import jax

    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def stack_loss(ps, x, scale: float = 8.0, norms: tuple[str, str] = ("g", "g")):  # noqa: ANN001, ANN201
    """Mean square of `x` through a stack of transformer blocks (attention, then a gelu MLP, each behind a layer
    norm whose scale is the parameter named in `norms`); `scale` divides the attention scores."""
    import jax
    import jax.numpy as jnp

    def block(p, x):
        h = layer_norm(x, p[norms[0]])
        att = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", h @ p["wq"], h @ p["wk"]) / scale, axis=-1)
        x = x + jnp.einsum("bqk,bkd->bqd", att, h @ p["wv"]) @ p["wo"]
        return x + jax.nn.gelu(layer_norm(x, p[norms[1]]) @ p["w1"]) @ p["w2"]

    for p in ps:
        x = block(p, x)
    return jnp.mean(x ** 2)


@cache
def transformer_step_text(layers: int, d_model: int = 64, d_ff: int = 128) -> str:
    """Unoptimized HLO of a `layers`-layer transformer training step (forward, grad, SGD update)."""
    import jax
    import jax.numpy as jnp

    def step(ps, x):
        grads = jax.grad(stack_loss)(ps, x)
        return jax.tree.map(lambda a, b: a - 1e-3 * b, ps, grads)

    shapes = {"g": (d_model,), "wq": (d_model, d_model), "wk": (d_model, d_model), "wv": (d_model, d_model),
              "wo": (d_model, d_model), "w1": (d_model, d_ff), "w2": (d_ff, d_model)}
    params = [{k: jnp.ones(s, jnp.float32) * 0.01 for k, s in shapes.items()} for _ in range(layers)]
    return jax.jit(step).lower(params, jnp.ones((2, 8, d_model), jnp.float32)).as_text(dialect="hlo")


def module_of_size(target: int) -> tuple[str, int]:
    """(HLO text, layers) of the transformer step whose instruction count is closest to `target`."""
    from hlopt import hlo

    per_layer = hlo.parse(transformer_step_text(2)).instruction_count() - \
        hlo.parse(transformer_step_text(1)).instruction_count()
    base = hlo.parse(transformer_step_text(1)).instruction_count() - per_layer
    layers = max(1, round((target - base) / per_layer))
    return transformer_step_text(layers), layers


def step_or_file(instructions: int, path: str | None = None) -> tuple[str, str]:
    """(HLO text, how to name it): the module in `path` where given, else the transformer step of about
    `instructions` instructions (`module_of_size`): what the benchmarks' `--hlo FILE | --instructions N` read."""
    if path:
        from pathlib import Path

        return Path(path).read_text(), path
    text, layers = module_of_size(instructions)
    return text, f"transformer training step, {layers} layers ({instructions} instructions asked)"
