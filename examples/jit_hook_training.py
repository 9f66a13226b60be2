"""A training loop written for plain `jax.jit`, run unchanged under hlopt's pre-compile hook.

    python3 examples/jit_hook_training.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hlopt import runtime


@jax.jit
def train_step(params, x, y):
    """One SGD step of a two-layer MLP (ordinary JAX code; nothing hlopt-specific)."""

    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def main() -> None:
    """Train a few steps under the hook and print what the pipeline did."""
    key = jax.random.PRNGKey(0)
    params = {"w1": jax.random.normal(key, (16, 32)) * 0.1, "b1": jnp.zeros(32),
              "w2": jax.random.normal(jax.random.fold_in(key, 1), (32, 4)) * 0.1}
    x, y = jax.random.normal(key, (64, 16)), jnp.ones((64, 4))
    with runtime.hook("call-inliner,simplify,priority-fusion") as hook:
        for step in range(5):
            params, value = train_step(params, x, y)
            print(f"step {step}: loss {float(value):.4f}")
    for record in hook.records:
        print(record.summary())


if __name__ == "__main__":
    main()
