"""A flax.nnx training loop written for plain `jax.jit`, run unchanged under hlopt's pre-compile hook.

    python3 examples/flax_training_hook.py

The loop runs twice from the same initial state: with plain `jax.jit` and under `runtime.hook("default")`;
the losses must agree, and the hook's statistics (per compiled module) are printed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hlopt import runtime


class MLP(nnx.Module):
    """A small two-layer MLP."""

    def __init__(self, din: int, hidden: int, dout: int, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(din, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, dout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.l2(nnx.gelu(self.l1(x)))


def make_state(seed: int = 0) -> tuple:
    """(graphdef, params, opt_state, optimizer) of a fresh model, as a plain-jax training loop keeps them."""
    model = MLP(16, 64, 4, nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adam(1e-2)
    return graphdef, params, tx.init(params), tx


def make_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation):
    """The training step, jitted with plain `jax.jit` (nothing hlopt-specific)."""

    @jax.jit
    def train_step(params, opt_state, x, y):
        def loss_fn(p):
            model = nnx.merge(graphdef, p)
            return jnp.mean((model(x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def batches(steps: int, seed: int = 1) -> list[tuple[jax.Array, jax.Array]]:
    """A fixed regression data stream."""
    key = jax.random.PRNGKey(seed)
    w = jax.random.normal(key, (16, 4))
    out = []
    for i in range(steps):
        x = jax.random.normal(jax.random.fold_in(key, i + 1), (32, 16))
        out.append((x, jnp.sin(x @ w)))
    return out


def train(steps: int = 20, seed: int = 0) -> list[float]:
    """Run the loop with whatever compile path is active; the losses per step."""
    graphdef, params, opt_state, tx = make_state(seed)
    step = make_step(graphdef, tx)
    losses = []
    for x, y in batches(steps):
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))
    return losses


def main() -> None:
    """Train plainly and under the hook; check the losses agree and print what the pipeline did."""
    plain = train()
    jax.clear_caches()  # so that the hooked run compiles afresh
    with runtime.hook("default") as hook:
        hooked = train()
    for i, (a, b) in enumerate(zip(plain, hooked, strict=True)):
        if i % 5 == 0 or i == len(plain) - 1:
            print(f"step {i:2d}: loss {a:.6f} (jax.jit)  {b:.6f} (hlopt hook)")
    np.testing.assert_allclose(hooked, plain, rtol=1e-4, atol=1e-6)
    print("losses agree")
    for record in hook.records:
        print(record.summary())
        if "train_step" not in record.module:
            continue
        for p in record.passes:
            if p.changed:
                print(f"    {p.name}: {p.instructions_before} -> {p.instructions_after} ({p.seconds * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
