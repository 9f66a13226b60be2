"""Programs written after the corpus, to check that the re-emission path generalizes (none of hlopt's rules was
tuned on them when they were added): the shapes of program users write that the corpus has few of.

    from hlopt.corpus.unseen_programs import unseen_texts   # name -> (HLO text as jax lowers it, devices)

- `attn_bf16_grad`: causal softmax attention, bf16 activations and f32 scores, forward and backward;
- `cnn_bn_grad`: two NHWC convolutions with batch norm and relu, gradient of the weights;
- `gru_scan_grad`: a GRU cell scanned over 20 steps, gradient;
- `qmlp_f16_grad`: int8 weights dequantized to f16, matmul, f32 layer norm, gelu, gradient of the input;
- `tp_mlp_grad`: a Megatron-style tensor-parallel MLP in shard_map on 8 devices (psum), bf16, gradient;
- `ring_permute`: ring attention-like loop on 8 devices: softmax blocks and collective-permute in a fori_loop;
- `fsdp_scan_stats`: a scanned stack of weights sharded over 8 devices (jit shardings, no shard_map), bf16 weights
  in an f32 relu MLP, the update and six statistics of the gradient as outputs: an all-gather per layer and a
  scalar all-reduce in the loop, which XLA:GPU's estimates and hlopt's model time differently.

The 8-device programs need `--xla_force_host_platform_device_count=8` set before jax is imported (`hlopt.corpus.use_cpu_devices()`
does it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["UNSEEN", "unseen_texts"]


def _lowered(fn: Callable, *args: Any) -> str:
    import jax

    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def _attn_bf16_grad() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    def loss(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) / 8.0
        mask = jnp.tril(jnp.ones((s.shape[-2], s.shape[-1]), bool))
        p = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1).astype(jnp.bfloat16)
        o = jnp.einsum("bhqk,bhkd->bhqd", p, v)
        return jnp.sum(o.astype(jnp.float32) ** 2)

    q = jax.random.normal(jax.random.PRNGKey(0), (4, 8, 256, 64), jnp.bfloat16)
    return _lowered(jax.grad(loss, argnums=(0, 1, 2)), q, q, q), 1


def _cnn_bn_grad() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    def batch_norm(y):
        return (y - y.mean((0, 1, 2))) * jax.lax.rsqrt(y.var((0, 1, 2)) + 1e-5)

    def loss(w1, w2, x):
        dims = ("NHWC", "HWIO", "NHWC")
        y = jax.nn.relu(batch_norm(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dims)))
        y = jax.nn.relu(batch_norm(jax.lax.conv_general_dilated(y, w2, (2, 2), "SAME", dimension_numbers=dims)))
        return jnp.mean(y ** 2)

    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (16, 32, 32, 16))
    w1, w2 = jax.random.normal(key, (3, 3, 16, 32)) * 0.1, jax.random.normal(key, (3, 3, 32, 64)) * 0.1
    return _lowered(jax.grad(loss, argnums=(0, 1)), w1, w2, x), 1


def _gru_scan_grad() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    def loss(params, xs):
        wz, wr, wh = params

        def cell(h, x):
            hx = jnp.concatenate([h, x], -1)
            z, r = jax.nn.sigmoid(hx @ wz), jax.nn.sigmoid(hx @ wr)
            h = (1 - z) * h + z * jnp.tanh(jnp.concatenate([r * h, x], -1) @ wh)
            return h, h.sum()

        h, ys = jax.lax.scan(cell, jnp.zeros((32, 128)), xs)
        return ys.sum() + h.sum()

    key = jax.random.PRNGKey(0)
    params = tuple(jax.random.normal(key, (192, 128)) * 0.05 for _ in range(3))
    return _lowered(jax.grad(loss), params, jax.random.normal(key, (20, 32, 64))), 1


def _qmlp_f16_grad() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    def loss(wq, scale, x):
        h = x @ (wq.astype(jnp.float16) * scale)
        h32 = h.astype(jnp.float32)
        h = ((h - h32.mean(-1, keepdims=True)) * jax.lax.rsqrt(h32.var(-1, keepdims=True) + 1e-6)).astype(jnp.float16)
        return jax.nn.gelu(h).astype(jnp.float32).sum()

    key = jax.random.PRNGKey(0)
    wq = jax.random.randint(key, (512, 1024), -127, 127).astype(jnp.int8)
    scale = jnp.full((1024,), 0.01, jnp.float16)
    return _lowered(jax.grad(loss, argnums=2), wq, scale, jax.random.normal(key, (256, 512), jnp.float16)), 1


def _mesh():
    import jax
    from jax.sharding import Mesh

    return Mesh(jax.devices()[:8], ("x",))


def _tp_mlp_grad() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def body(w1, w2, x):
        y = jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "x")
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def loss(w1, w2, x):
        return jax.shard_map(body, mesh=_mesh(), in_specs=(P(None, "x"), P("x", None), P()), out_specs=P(),
                             check_vma=False)(w1, w2, x)

    key = jax.random.PRNGKey(1)
    w1 = jax.random.normal(key, (512, 2048), jnp.bfloat16) * 0.02
    w2 = jax.random.normal(key, (2048, 512), jnp.bfloat16) * 0.02
    return _lowered(jax.grad(loss, argnums=(0, 1)), w1, w2, jax.random.normal(key, (256, 512), jnp.bfloat16)), 8


def _ring_permute() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    ring = [(j, (j + 1) % 8) for j in range(8)]

    def body(q, kv):
        def step(_, carry):
            acc, kv = carry
            acc = acc + jax.nn.softmax(q @ kv.T, -1) @ kv
            return acc, jax.lax.ppermute(kv, "x", ring)

        return jax.lax.fori_loop(0, 8, step, (jnp.zeros_like(q), kv))[0]

    def fn(q, kv):
        return jax.shard_map(body, mesh=_mesh(), in_specs=(P("x"), P("x")), out_specs=P("x"))(q, kv)

    key = jax.random.PRNGKey(1)
    return _lowered(fn, jax.random.normal(key, (1024, 64)), jax.random.normal(key, (1024, 64))), 8


def _fsdp_scan_stats() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def loss(ws, x):
        def layer(h, w):
            return jax.nn.relu(h @ w.astype(jnp.bfloat16).astype(jnp.float32)), jnp.mean(h)

        h, means = jax.lax.scan(layer, x, ws)
        return h.sum() + means.sum()

    def step(ws, x):
        value, g = jax.value_and_grad(loss)(ws, x)
        return ws - 0.01 * g, value, g.mean(), jnp.max(g), jnp.min(g), (g ** 2).sum(), jnp.abs(g).mean()

    mesh = _mesh()
    ws = jax.ShapeDtypeStruct((4, 64, 64), jnp.float32, sharding=NamedSharding(mesh, P(None, "x", None)))
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))
    return _lowered(step, ws, x), 8


#: name -> builder of (HLO text, devices).
UNSEEN: dict[str, Callable[[], tuple[str, int]]] = {
    "attn_bf16_grad": _attn_bf16_grad,
    "cnn_bn_grad": _cnn_bn_grad,
    "gru_scan_grad": _gru_scan_grad,
    "qmlp_f16_grad": _qmlp_f16_grad,
    "tp_mlp_grad": _tp_mlp_grad,
    "ring_permute": _ring_permute,
    "fsdp_scan_stats": _fsdp_scan_stats,
}


def unseen_texts(names: list[str] | None = None) -> dict[str, tuple[str, int]]:
    """name -> (HLO text as jax lowers it, devices) of the unseen programs (all, or those named)."""
    return {name: UNSEEN[name]() for name in (names or list(UNSEEN))}
