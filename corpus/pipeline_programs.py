"""Scanned training steps on 8 devices, written as users write them, for collective pipelining.

Each builder returns `(jitted_fn, args)`; `capture(name)` gives the unoptimized HLO text. jax must see 8 devices
(`--xla_force_host_platform_device_count=8` in XLA_FLAGS before jax is imported; `hlopt.corpus.use_cpu_devices()` sets it).

- `fsdp_scan`: FSDP over a scanned stack of transformer layers. Stacked weights are sharded along their first
  non-layer dimension; the scan body all-gathers the layer's weights before its first matmul; `jax.grad` turns
  each all-gather into a reduce-scatter of the layer's gradient inside the backward scan, written into the
  stacked gradient by dynamic-update-slice.
- `dp_scan`: data parallelism over a scanned stack: replicated weights, each layer's gradient all-reduced inside
  the backward scan (a custom_vjp identity whose backward is a psum, the usual way to overlap gradient
  all-reduces with the backward pass).
- `*_remat`: the same with `jax.checkpoint` on the layer (optimization barriers in the loop bodies).
- `grad_accum`: data-parallel gradient accumulation over microbatches in a scan, the accumulated gradient
  all-reduced once per microbatch inside the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["PROGRAMS", "build", "capture", "DEVICES"]

#: Devices every program runs on.
DEVICES = 8


def _jax():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    if len(jax.devices()) < DEVICES:
        raise RuntimeError(f"pipeline programs need {DEVICES} devices; set "
                           f"XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES} before importing jax")
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("d",))
    return jax, jnp, lax, mesh, P


def _layer(jax, jnp, p: dict, x: Any, heads: int) -> Any:
    """A pre-norm transformer layer on `x` [batch, seq, d] with full (gathered) weights `p`."""

    def norm(v, g):
        mu = v.mean(-1, keepdims=True)
        return (v - mu) * jax.lax.rsqrt(((v - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g

    b, s, d = x.shape
    h = norm(x, p["g1"])
    q, k, v = ((h @ p[w]).reshape(b, s, heads, d // heads) for w in ("wq", "wk", "wv"))
    att = jax.nn.softmax(jnp.einsum("bqhc,bkhc->bhqk", q, k) / (d // heads) ** 0.5, axis=-1)
    x = x + jnp.einsum("bhqk,bkhc->bqhc", att, v).reshape(b, s, d) @ p["wo"]
    return x + jax.nn.gelu(norm(x, p["g2"]) @ p["w1"]) @ p["w2"]


def _stacked_params(jnp, layers: int, d: int, d_ff: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = {"g1": (d,), "g2": (d,), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, d_ff),
              "w2": (d_ff, d)}
    return {k: jnp.asarray(rng.standard_normal((layers, *s), np.float32) * (1.0 if k[0] == "g" else d ** -0.5))
            for k, s in shapes.items()}


def _scanned_step(body: Callable, remat: bool, grad_divisor: int) -> Callable:
    """A training step over a layer stack scanned with `body` (rematerialized with `remat`): the mean-square loss,
    an SGD update by the gradients over `grad_divisor` (no division when it is 1), and the loss averaged over the
    devices."""
    jax, jnp, lax, _, _ = _jax()
    layer = jax.checkpoint(body) if remat else body

    def loss(params, x):
        y, _ = lax.scan(layer, x, params)
        return jnp.mean(y ** 2)

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        if grad_divisor == 1:
            return jax.tree.map(lambda w, g: w - 1e-2 * g, params, grads), lax.pmean(value, "d")
        return jax.tree.map(lambda w, g: w - 1e-2 * g / grad_divisor, params, grads), lax.pmean(value, "d")

    return step


def fsdp_scan(layers: int = 4, d: int = 512, d_ff: int = 2048, batch: int = 1, seq: int = 128, remat: bool = False,
              heads: int = 8) -> tuple[Callable, tuple]:
    """FSDP training step over a scanned layer stack (weights sharded on their first non-layer dimension)."""
    jax, jnp, lax, mesh, P = _jax()

    def body(x, shard):
        full = {k: lax.all_gather(v, "d", axis=0, tiled=True) for k, v in shard.items()}
        return _layer(jax, jnp, full, x, heads), None

    step = _scanned_step(body, remat, grad_divisor=1)

    params = _stacked_params(jnp, layers, d, d_ff)
    x = jnp.ones((batch * DEVICES, seq, d), jnp.float32) * 0.1
    pspec = {k: P(None, "d") for k in params}
    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(pspec, P("d")), out_specs=(pspec, P()), check_vma=False))
    return fn, (params, x)


def dp_scan(layers: int = 4, d: int = 512, d_ff: int = 2048, batch: int = 1, seq: int = 128, remat: bool = False,
            heads: int = 8) -> tuple[Callable, tuple]:
    """Data-parallel step over a scanned layer stack, each layer's gradient all-reduced in the backward scan."""
    jax, jnp, lax, mesh, P = _jax()

    @jax.custom_vjp
    def reduce_grad(w):
        return w

    def reduce_fwd(w):
        return w, None

    def reduce_bwd(_, g):
        return (jax.tree.map(lambda t: lax.psum(t, "d"), g),)

    reduce_grad.defvjp(reduce_fwd, reduce_bwd)

    def body(x, p):
        return _layer(jax, jnp, reduce_grad(p), x, heads), None

    step = _scanned_step(body, remat, grad_divisor=DEVICES)

    params = _stacked_params(jnp, layers, d, d_ff)
    x = jnp.ones((batch * DEVICES, seq, d), jnp.float32) * 0.1
    pspec = {k: P() for k in params}
    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(pspec, P("d")), out_specs=(pspec, P()), check_vma=False))
    return fn, (params, x)


def grad_accum(microbatches: int = 4, d: int = 512, d_ff: int = 2048, batch: int = 1, seq: int = 128,
               heads: int = 8) -> tuple[Callable, tuple]:
    """Gradient accumulation over microbatches in a scan, each microbatch's gradient all-reduced in the loop."""
    jax, jnp, lax, mesh, P = _jax()

    def loss(p, x):
        return jnp.mean(_layer(jax, jnp, p, x, heads) ** 2)

    def step(params, xs):
        def micro(acc, x):
            g = jax.grad(loss)(params, x)
            return jax.tree.map(lambda a, b: a + lax.psum(b, "d"), acc, g), None

        zero = jax.tree.map(jnp.zeros_like, params)
        grads, _ = lax.scan(micro, zero, xs)
        return jax.tree.map(lambda w, g: w - 1e-2 * g / (DEVICES * microbatches), params, grads)

    params = {k: v[0] for k, v in _stacked_params(jnp, 1, d, d_ff).items()}
    xs = jnp.ones((microbatches, batch * DEVICES, seq, d), jnp.float32) * 0.1
    pspec = {k: P() for k in params}
    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(pspec, P(None, "d")), out_specs=pspec, check_vma=False))
    return fn, (params, xs)


#: name -> builder of (jitted_fn, args), at the sizes the benchmark uses (d=512, 8 devices).
PROGRAMS: dict[str, Callable[[], tuple[Callable, tuple]]] = {
    "fsdp_scan": lambda: fsdp_scan(),
    "fsdp_scan_remat": lambda: fsdp_scan(remat=True),
    "dp_scan": lambda: dp_scan(),
    "dp_scan_remat": lambda: dp_scan(remat=True),
    "grad_accum": lambda: grad_accum(),
}


def build(name: str, **sizes: Any) -> tuple[Callable, tuple]:
    """The jitted program `name` and its arguments; `sizes` override the builder's defaults (small tests)."""
    builders = {"fsdp_scan": fsdp_scan, "fsdp_scan_remat": lambda **k: fsdp_scan(remat=True, **k),
                "dp_scan": dp_scan, "dp_scan_remat": lambda **k: dp_scan(remat=True, **k), "grad_accum": grad_accum}
    if name not in builders:
        raise KeyError(f"unknown program {name!r}; known: {', '.join(builders)}")
    return builders[name](**sizes) if sizes else PROGRAMS[name]()


def capture(name: str, **sizes: Any) -> str:
    """Unoptimized HLO text of program `name` (full constants)."""
    from hlopt.runtime import capture_text

    fn, args = build(name, **sizes)
    return capture_text(fn, *args)
