"""Programs of the shapes where fusion decisions matter most (issue #31), written after the corpus and the
unseen programs, none of hlopt's rules tuned on them when they were added:

    from hlopt.corpus.fusion_programs import fusion_texts   # name -> (HLO text as jax lowers it, devices)

- `adam_small_large`: an Adam update over 24 small tensors and 2 large ones (moments, bias correction);
- `lamb_small`: a LAMB update over 16 small tensors (Adam moments, per-tensor norms, trust ratios);
- `optax_lamb_small`, `optax_adam_mixed`: optax's LAMB over 20 small tensors, optax's AdamW over 18 small and
  3 large ones;
- `adafactor_mixed`: an Adafactor update (factored second moments of matrices, RMS clipping) over 12 tensors;
- `cnn_bn_nhwc_step`, `cnn_bn_nchw_step`: a 3-convolution CNN with batch norm and relu, loss, gradient and
  an SGD-momentum update, NHWC and NCHW;
- `transformer_4l_remat`, `transformer_8l_remat`: pre-LN transformer training steps (d=256, 4 heads, 128 tokens,
  batch 4), each layer under `jax.checkpoint`, with an SGD update;
- `embed_gather_scatter`: an embedding table looked up (gather), a small MLP, the table's gradient (scatter-add)
  and its update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FUSION_PROGRAMS", "fusion_texts"]


def _lowered(fn: Callable, *args: Any) -> str:
    import jax

    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def _tensors(shapes: list[tuple[int, ...]], seed: int = 0) -> list[Any]:
    import jax

    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return [jax.random.normal(k, s) * 0.02 for k, s in zip(keys, shapes, strict=True)]


_SMALL = [(64,), (128, 64), (256,), (64, 64), (32,), (96, 32)]


def _adam_small_large() -> tuple[str, int]:
    import jax.numpy as jnp

    shapes = _SMALL * 4 + [(1024, 1024), (512, 2048)]

    def step(params, grads, m, v, t):
        b1, b2, lr = 0.9, 0.999, 1e-3
        out = []
        for p, g, mi, vi in zip(params, grads, m, v, strict=True):
            mi = b1 * mi + (1 - b1) * g
            vi = b2 * vi + (1 - b2) * g * g
            mh, vh = mi / (1 - b1 ** t), vi / (1 - b2 ** t)
            out.append((p - lr * (mh / (jnp.sqrt(vh) + 1e-8) + 1e-4 * p), mi, vi))
        return out

    ps = _tensors(shapes)
    return _lowered(step, ps, _tensors(shapes, 1), _tensors(shapes, 2), [abs(x) for x in _tensors(shapes, 3)],
                    jnp.float32(3.0)), 1


def _lamb_small() -> tuple[str, int]:
    import jax.numpy as jnp

    shapes = _SMALL * 2 + [(128, 128), (256, 64), (512,), (48, 48)]

    def step(params, grads, m, v, t):
        b1, b2, lr = 0.9, 0.999, 1e-3
        out = []
        for p, g, mi, vi in zip(params, grads, m, v, strict=True):
            mi = b1 * mi + (1 - b1) * g
            vi = b2 * vi + (1 - b2) * g * g
            u = (mi / (1 - b1 ** t)) / (jnp.sqrt(vi / (1 - b2 ** t)) + 1e-6) + 0.01 * p
            pn, un = jnp.linalg.norm(p), jnp.linalg.norm(u)
            trust = jnp.where((pn > 0) & (un > 0), pn / un, 1.0)
            out.append((p - lr * trust * u, mi, vi))
        return out

    return _lowered(step, _tensors(shapes), _tensors(shapes, 1), _tensors(shapes, 2),
                    [abs(x) for x in _tensors(shapes, 3)], jnp.float32(5.0)), 1


def _optax_step(make: Callable[[], Any], shapes: list[tuple[int, ...]]) -> str:
    import jax
    import optax

    opt = make()
    params = _tensors(shapes)
    state = opt.init(params)

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return _lowered(step, params, state, jax.tree.map(lambda x: x * 0.1, params))


def _optax_lamb_small() -> tuple[str, int]:
    import optax

    return _optax_step(lambda: optax.lamb(1e-3, weight_decay=1e-2), _SMALL * 3 + [(16,), (8, 8)]), 1


def _optax_adam_mixed() -> tuple[str, int]:
    import optax

    return _optax_step(lambda: optax.adamw(1e-3), _SMALL * 3 + [(2048, 512), (1024, 1024), (4096,)]), 1


def _adafactor_mixed() -> tuple[str, int]:
    import jax.numpy as jnp

    shapes = [(256, 512), (512,), (512, 256), (256,), (128, 128), (64,), (1024, 256), (256,), (64, 64),
              (32,), (384, 128), (128,)]

    def step(params, grads, vr, vc, v):
        decay, lr = 0.8, 1e-2
        out = []
        for p, g, r, c, vv in zip(params, grads, vr, vc, v, strict=True):
            g2 = g * g + 1e-30
            if p.ndim == 2:
                r = decay * r + (1 - decay) * g2.mean(1)
                c = decay * c + (1 - decay) * g2.mean(0)
                vhat = (r[:, None] / r.mean()) * c[None, :]
            else:
                vv = decay * vv + (1 - decay) * g2
                vhat = vv
            u = g * jnp.reciprocal(jnp.sqrt(vhat))
            u = u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(u * u)))
            scale = jnp.maximum(jnp.sqrt(jnp.mean(p * p)), 1e-3)
            out.append((p - lr * scale * u, r, c, vv))
        return out

    vr = [jnp.ones(s[:1]) if len(s) == 2 else jnp.ones(()) for s in shapes]
    vc = [jnp.ones(s[1:]) if len(s) == 2 else jnp.ones(()) for s in shapes]
    v = [jnp.ones(s) if len(s) == 1 else jnp.ones(()) for s in shapes]
    return _lowered(step, _tensors(shapes), _tensors(shapes, 1), vr, vc, v), 1


def _cnn_bn_step(layout: str) -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    dims = (layout, "HWIO", layout)
    axes = (0, 1, 2) if layout == "NHWC" else (0, 2, 3)
    shape = (1, 1, 1, -1) if layout == "NHWC" else (1, -1, 1, 1)

    def bn(y, gamma, beta):
        mean, var = y.mean(axes, keepdims=True), y.var(axes, keepdims=True)
        return (y - mean) * jax.lax.rsqrt(var + 1e-5) * gamma.reshape(shape) + beta.reshape(shape)

    strides = (1, 2, 1)

    def loss(params, x, labels):
        y = x
        for (w, gamma, beta), stride in zip(params["convs"], strides, strict=True):
            y = jax.lax.conv_general_dilated(y, w, (stride, stride), "SAME", dimension_numbers=dims)
            y = jax.nn.relu(bn(y, gamma, beta))
        y = y.mean(axes[1:])
        logits = y @ params["head"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))

    def step(params, mom, x, labels):
        grads = jax.grad(loss)(params, x, labels)
        mom = jax.tree.map(lambda m, g: 0.9 * m + g, mom, grads)
        return jax.tree.map(lambda p, m: p - 0.01 * m, params, mom), mom

    key = jax.random.PRNGKey(0)
    chans = [(3, 32), (32, 64), (64, 64)]
    convs = [(jax.random.normal(key, (3, 3, ci, co)) * 0.1, jnp.ones(co), jnp.zeros(co)) for ci, co in chans]
    params = {"convs": convs, "head": jax.random.normal(key, (64, 10)) * 0.1}
    x = jax.random.normal(key, (32, 32, 32, 3) if layout == "NHWC" else (32, 3, 32, 32))
    labels = jax.nn.one_hot(jnp.arange(32) % 10, 10)
    return _lowered(step, params, jax.tree.map(jnp.zeros_like, params), x, labels), 1


def _transformer_remat(layers: int) -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    d, heads, seq, batch, ff = 256, 4, 128, 4, 1024

    def ln(x, g):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-6) * g

    def layer(x, p):
        h = ln(x, p["g1"])
        q, k, v = (jnp.einsum("bsd,de->bse", h, p[n]).reshape(batch, seq, heads, d // heads) for n in "qkv")
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 8.0
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        a = jax.nn.softmax(jnp.where(mask, s, -1e9), -1)
        o = jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(batch, seq, d)
        x = x + o @ p["o"]
        h = ln(x, p["g2"])
        return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    def loss(params, x):
        for p in params:
            x = jax.checkpoint(layer)(x, p)
        return jnp.mean(x ** 2)

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    key = jax.random.PRNGKey(0)

    def init(i):
        k = jax.random.fold_in(key, i)
        w = {n: jax.random.normal(jax.random.fold_in(k, j), (d, d)) * 0.02 for j, n in enumerate("qkvo")}
        return w | {"w1": jax.random.normal(k, (d, ff)) * 0.02, "w2": jax.random.normal(k, (ff, d)) * 0.02,
                    "g1": jnp.ones(d), "g2": jnp.ones(d)}

    return _lowered(step, [init(i) for i in range(layers)], jax.random.normal(key, (batch, seq, d))), 1


def _embed_gather_scatter() -> tuple[str, int]:
    import jax
    import jax.numpy as jnp

    def loss(table, w, ids, y):
        e = table[ids].mean(1)
        return jnp.mean((jnp.tanh(e @ w) - y) ** 2)

    def step(table, w, ids, y):
        gt, gw = jax.grad(loss, argnums=(0, 1))(table, w, ids, y)
        return table - 0.1 * gt, w - 0.1 * gw

    key = jax.random.PRNGKey(0)
    table = jax.random.normal(key, (8192, 128)) * 0.02
    ids = jax.random.randint(key, (256, 16), 0, 8192)
    return _lowered(step, table, jax.random.normal(key, (128, 64)) * 0.1, ids, jnp.zeros((256, 64))), 1


#: name -> builder of (HLO text, devices).
FUSION_PROGRAMS: dict[str, Callable[[], tuple[str, int]]] = {
    "adam_small_large": _adam_small_large,
    "lamb_small": _lamb_small,
    "optax_lamb_small": _optax_lamb_small,
    "optax_adam_mixed": _optax_adam_mixed,
    "adafactor_mixed": _adafactor_mixed,
    "cnn_bn_nhwc_step": lambda: _cnn_bn_step("NHWC"),
    "cnn_bn_nchw_step": lambda: _cnn_bn_step("NCHW"),
    "transformer_4l_remat": lambda: _transformer_remat(4),
    "transformer_8l_remat": lambda: _transformer_remat(8),
    "embed_gather_scatter": _embed_gather_scatter,
}


def fusion_texts(names: list[str] | None = None) -> dict[str, tuple[str, int]]:
    """name -> (HLO text as jax lowers it, devices) of these programs (all, or those named)."""
    return {name: FUSION_PROGRAMS[name]() for name in (names or list(FUSION_PROGRAMS))}
