"""Programs of the shapes users write, for the JAX hook on XLA:GPU (tests/test_gpu_hook.py and
benchmarks/gpu_hook_compile_time.py): each builder returns (function, example arguments); `specs_of` turns
arguments into ShapeDtypeStructs on a mesh, for jax's deviceless ahead-of-time compile.
"""

from __future__ import annotations

__all__ = ["PROGRAMS", "specs_of", "mlp_step"]


def specs_of(mesh, tree, spec_of=None):
    """`tree` as ShapeDtypeStructs placed on `mesh` (replicated, or by `spec_of(array)`)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(
        mesh, spec_of(a) if spec_of else P())), tree)


def mlp_step():
    """A one-hidden-layer MLP's SGD step: (step function, (params, x, y))."""
    import jax
    import jax.numpy as jnp

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    def step(p, x, y):
        g = jax.grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g)

    p = {"w1": jnp.zeros((64, 128)), "b1": jnp.zeros((128,)), "w2": jnp.zeros((128, 16))}
    return step, (p, jnp.zeros((32, 64)), jnp.zeros((32, 16)))


def attention_bf16():
    import jax
    import jax.numpy as jnp

    def attention(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s.astype(jnp.float32), -1).astype(q.dtype), v)

    x = jnp.zeros((2, 4, 64, 32), jnp.bfloat16)
    return attention, (x, x, x)


def conv_bn_pool():
    import jax
    import jax.numpy as jnp

    def f(x, w, g, b):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        mean, var = y.mean((0, 1, 2)), y.var((0, 1, 2))
        y = jax.nn.relu((y - mean) * jax.lax.rsqrt(var + 1e-5) * g + b)
        return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    return f, (jnp.zeros((4, 16, 16, 8)), jnp.zeros((3, 3, 8, 16)), jnp.ones((16,)), jnp.zeros((16,)))


def scan_rnn():
    import jax
    import jax.numpy as jnp

    def f(w, xs):
        def cell(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h.sum()

        return jax.lax.scan(cell, jnp.zeros((8, 32)), xs)

    return f, (jnp.zeros((32, 32)), jnp.zeros((10, 8, 32)))


def adam_update():
    import jax
    import jax.numpy as jnp

    def update(p, g, m, v, t):
        m = jax.tree.map(lambda m_, g_: 0.9 * m_ + 0.1 * g_, m, g)
        v = jax.tree.map(lambda v_, g_: 0.999 * v_ + 0.001 * g_ * g_, v, g)
        scale = jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        p = jax.tree.map(lambda p_, m_, v_: p_ - 1e-3 * scale * m_ / (jnp.sqrt(v_) + 1e-8), p, m, v)
        return p, m, v

    tree = {"a": jnp.zeros((256, 64)), "b": jnp.zeros((64,)), "c": jnp.zeros((64, 10))}
    return update, (tree, tree, tree, tree, jnp.float32(3.0))


PROGRAMS = {"mlp_step": mlp_step, "attention_bf16": attention_bf16, "conv_bn_pool": conv_bn_pool,
            "scan_rnn": scan_rnn, "adam_update": adam_update}
