"""A training loop written for plain `jax.jit`, run unchanged under hlopt's pre-compile hook, then again
without the hook: the losses and parameters must agree with plain `jax.jit`'s.

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


STEPS = 5


def train(params, x, y) -> tuple[dict, list[float]]:
    """STEPS steps of `train_step`; the final parameters and the losses."""
    losses = []
    for _ in range(STEPS):
        params, value = train_step(params, x, y)
        losses.append(float(value))
    return params, losses


def main() -> None:
    """Train under the hook, print what the pipeline did, and compare with plain `jax.jit`."""
    import numpy as np

    key = jax.random.PRNGKey(0)
    params = {"w1": jax.random.normal(key, (16, 32)) * 0.1, "b1": jnp.zeros(32),
              "w2": jax.random.normal(jax.random.fold_in(key, 1), (32, 4)) * 0.1}
    x, y = jax.random.normal(key, (64, 16)), jnp.ones((64, 4))
    with runtime.hook("call-inliner,simplify,priority-fusion") as hook:
        hooked_params, hooked_losses = train(params, x, y)
    for record in hook.records:
        print(record.summary())
    jax.clear_caches()  # the hooked executable is cached by jax: compile again, without the hook
    plain_params, plain_losses = train(params, x, y)
    for step, (a, b) in enumerate(zip(hooked_losses, plain_losses, strict=True)):
        print(f"step {step}: loss {a:.6f} (plain jax.jit {b:.6f})")
    np.testing.assert_allclose(hooked_losses, plain_losses, rtol=1e-5, atol=1e-6)
    for name in params:
        np.testing.assert_allclose(hooked_params[name], plain_params[name], rtol=1e-5, atol=1e-6)
    print("hooked training matches plain jax.jit")


if __name__ == "__main__":
    main()
