"""The test corpus: HLO generated at test time from JAX programs of our own (nothing committed).

Each program gives its unoptimized HLO (`lower(...).as_text(dialect="hlo")`) and XLA:CPU's
after-optimization HLO (`lower(...).compile().as_text()`). Multi-device programs use 8 CPU devices
(`hlopt.corpus.use_cpu_devices()`, or tests/conftest.py, sets the flag before jax is imported).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Program", "PROGRAMS", "CORPUS", "corpus_texts", "program", "program_by_name", "built", "program_text",
           "CorpusEntry"]


@dataclass(frozen=True)
class Program:
    """A JAX program: a builder returning (function, example args), and its device count."""

    name: str
    build: Callable[[], tuple[Callable, tuple]]
    devices: int = 1
    #: why XLA refuses to compile its own after-optimization text of this program again (None: it compiles).
    reentry_refused: str | None = None


@dataclass(frozen=True)
class CorpusEntry:
    """One module of the corpus: `id` is the program name (`.opt` appended for XLA:CPU's optimized module)."""

    id: str
    text: str
    devices: int
    optimized: bool
    #: why this module cannot be run on XLA again (set on `.opt` entries of such programs), else None.
    reentry_refused: str | None = None


PROGRAMS: list[Program] = []
CORPUS = PROGRAMS  # the name the API brief uses


def program(name: str, devices: int = 1, reentry_refused: str | None = None) -> Callable:
    """Register a corpus program."""

    def register(build: Callable[[], tuple[Callable, tuple]]) -> Callable:
        PROGRAMS.append(Program(name, build, devices, reentry_refused))
        return build

    return register


def _jnp():
    import jax
    import jax.numpy as jnp

    return jax, jnp


@program("mlp_grad")
def _mlp_grad():
    jax, jnp = _jnp()

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    params = {"w1": jnp.ones((8, 16)) * 0.1, "b1": jnp.zeros(16), "w2": jnp.ones((16, 4)) * 0.1}
    return jax.grad(loss), (params, jnp.ones((4, 8)), jnp.ones((4, 4)))


@program("conv_net_grad")
def _conv_grad():
    jax, jnp = _jnp()
    from jax import lax

    def loss(w, x):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        y = jax.nn.relu(y)
        y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return jnp.sum(y ** 2)

    return jax.value_and_grad(loss), (jnp.ones((4, 3, 3, 3)) * 0.1, jnp.ones((2, 3, 8, 8)))


@program("scan_rnn")
def _scan():
    jax, jnp = _jnp()
    from jax import lax

    def f(w, xs):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h.sum()

        return lax.scan(step, jnp.zeros(4), xs)

    return f, (jnp.eye(4) * 0.5, jnp.ones((6, 4)))


@program("while_fori_cond")
def _while():
    jax, jnp = _jnp()
    from jax import lax

    def f(x):
        y = lax.fori_loop(0, 5, lambda i, v: v * 1.1 + i, x)
        z = lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 0.9), (0, y))[1]
        return lax.cond(z.sum() > 0, jnp.sin, jnp.cos, z), lax.switch(1, [jnp.exp, jnp.tanh, jnp.abs], z)

    return f, (jnp.arange(4.0),)


@program("sort_topk_argmax")
def _sort():
    jax, jnp = _jnp()
    from jax import lax

    def f(x, k):
        return jnp.sort(x, axis=-1), lax.top_k(x, 3), jnp.argmax(x, axis=0), jnp.argsort(k)

    return f, (jnp.arange(24.0).reshape(4, 6)[::-1], jnp.array([3, 1, 2, 0]))


@program("gather_scatter")
def _gather():
    jax, jnp = _jnp()

    def f(x, idx, upd):
        return x[idx], x.at[idx].add(upd), x.at[idx].set(upd), jnp.take_along_axis(x[idx], (idx[:, None] % 3), axis=1)

    return f, (jnp.arange(30.0).reshape(10, 3), jnp.array([1, 3, 5, 9]), jnp.ones((4, 3)))


@program("random_threefry")
def _random():
    jax, jnp = _jnp()

    def f(key):
        k1, k2 = jax.random.split(key)
        return jax.random.normal(k1, (8,)), jax.random.uniform(k2, (3, 3)), jax.random.bernoulli(k2, 0.3, (5,))

    return f, (jax.random.PRNGKey(42),)


@program("linalg")
def _linalg():
    jax, jnp = _jnp()

    def f(a, b):
        spd = a @ a.T + 4.0 * jnp.eye(4)
        chol = jnp.linalg.cholesky(spd)
        q, r = jnp.linalg.qr(a)
        return chol, q @ r, jnp.linalg.solve(spd, b), jax.scipy.linalg.solve_triangular(chol, b, lower=True)

    return f, (jnp.arange(16.0).reshape(4, 4) / 10, jnp.ones((4, 2)))


@program("fft_complex")
def _fft():
    jax, jnp = _jnp()

    def f(x):
        c = jnp.fft.fft(x)
        return jnp.real(jnp.fft.ifft(c * 2)), jnp.abs(c), jnp.fft.rfft(x), jnp.angle(c + 1j)

    return f, (jnp.arange(8.0),)


@program("integer_bitwise")
def _int():
    jax, jnp = _jnp()

    def f(x, y):
        return (x << 2) ^ (y >> 1), x & ~y | 3, jnp.left_shift(x, 1) // 3, x % 5, jax.lax.population_count(x), \
            x.astype(jnp.uint8), jnp.clip(x * y, -7, 7), (x > y).astype(jnp.int8)

    return f, (jnp.arange(-8, 8, dtype=jnp.int32), jnp.arange(16, dtype=jnp.int32))


@program("pad_slice_dus")
def _pad():
    jax, jnp = _jnp()
    from jax import lax

    def f(x, i):
        p = jnp.pad(x, ((1, 2), (0, 3)))
        s = lax.dynamic_slice(p, (i, 1), (2, 3))
        u = lax.dynamic_update_slice(p, s * 10, (0, i))
        return p[1:4:2, ::2], u, jnp.concatenate([x, x[::-1]], axis=0), lax.pad(x, 0.0, ((1, 1, 1), (0, 0, 0)))

    return f, (jnp.arange(12.0).reshape(3, 4), jnp.array(1))


@program("remat_opt_barrier")
def _remat():
    jax, jnp = _jnp()

    def loss(w, x):
        @jax.checkpoint
        def block(v):
            return jnp.sin(v @ w) * 2

        return jnp.sum(block(block(x)))

    return jax.grad(loss), (jnp.eye(4) * 0.3, jnp.ones((2, 4)))


@program("custom_vjp")
def _custom_vjp():
    jax, jnp = _jnp()

    @jax.custom_vjp
    def clip_grad(x):
        return jnp.tanh(x)

    def fwd(x):
        return jnp.tanh(x), x

    def bwd(x, g):
        return (jnp.clip(g * (1 - jnp.tanh(x) ** 2), -0.1, 0.1),)

    clip_grad.defvjp(fwd, bwd)
    return jax.grad(lambda x: clip_grad(x * 3).sum()), (jnp.linspace(-1, 1, 8),)


@program("transformer_train_step")
def _transformer():
    jax, jnp = _jnp()

    def layer_norm(x, g):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g

    def loss(p, x):
        h = layer_norm(x, p["g"])
        q, k, v = h @ p["wq"], h @ p["wk"], h @ p["wv"]
        att = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k) / 4.0, axis=-1)
        x = x + jnp.einsum("bqk,bkd->bqd", att, v) @ p["wo"]
        x = x + jax.nn.gelu(layer_norm(x, p["g"]) @ p["w1"]) @ p["w2"]
        return jnp.mean(x ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    key = jax.random.PRNGKey(0)
    d = 16
    shapes = {"g": (d,), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, 32), "w2": (32, d)}
    p = {k: jax.random.normal(jax.random.fold_in(key, i), s) * 0.1 for i, (k, s) in enumerate(shapes.items())}
    return step, (p, jnp.ones((2, 4, d)))


@program("reductions_mixed_dtypes")
def _reduce():
    jax, jnp = _jnp()

    def f(x, b):
        return (x.astype(jnp.bfloat16).sum(0), jnp.max(x, axis=1), jnp.any(b), x.astype(jnp.float16).mean(),
                jax.nn.logsumexp(x, axis=-1), jnp.cumsum(x, axis=1), jnp.prod(x[:2, :2]))

    return f, (jnp.arange(12.0).reshape(3, 4) / 7, jnp.array([True, False, True]))


@program("elementwise_math")
def _math():
    jax, jnp = _jnp()

    def f(x):
        return (jnp.exp(x), jnp.log1p(jnp.abs(x)), jnp.expm1(x), jnp.arctan2(x, 2.0), jnp.power(jnp.abs(x), 1.5),
                jnp.round(x * 3), jnp.floor(x), jnp.sign(x), jax.lax.erf(x), jnp.isfinite(x / (x - 0.5)),
                jax.nn.sigmoid(x), jnp.where(x > 0, x, -x), jnp.maximum(x, 0.1), jnp.remainder(x, 0.3))

    return f, (jnp.linspace(-2, 2, 9),)


@program("vmap_batched_dot")
def _vmap():
    jax, jnp = _jnp()

    def f(a, b):
        return jax.vmap(lambda x, y: jnp.dot(x, y.T))(a, b), jnp.einsum("bij,bjk->bik", a, b.transpose(0, 2, 1))

    return f, (jnp.ones((3, 4, 5)), jnp.ones((3, 6, 5)) * 0.5)


@program("shmap_psum_in_scan", devices=8)
def _shmap_psum():
    return _shard_map_program("psum_scan")


@program("shmap_all_gather", devices=8)
def _shmap_ag():
    return _shard_map_program("all_gather")


@program("shmap_psum_scatter", devices=8)
def _shmap_rs():
    return _shard_map_program("psum_scatter")


@program("shmap_ppermute", devices=8)
def _shmap_pp():
    return _shard_map_program("ppermute")


@program("shmap_all_to_all", devices=8)
def _shmap_a2a():
    return _shard_map_program("all_to_all")


@program("shmap_grad_accumulation", devices=8)
def _shmap_accum():
    return _shard_map_program("grad_accumulation")


@program("shmap_fsdp_scan", devices=8)
def _shmap_fsdp_scan():
    """FSDP over a scanned layer stack: all-gathers in the forward scan, reduce-scatters in the backward one,
    and a psum, all on jax's one channel."""
    from hlopt.corpus.pipeline_programs import fsdp_scan

    return fsdp_scan(layers=2, d=32, d_ff=64, batch=1, seq=4, heads=2)


@program("shmap_dp_scan_remat", devices=8)
def _shmap_dp_scan_remat():
    """Data parallelism over a rematerialized scanned layer stack, gradients all-reduced in the backward scan."""
    from hlopt.corpus.pipeline_programs import dp_scan

    return dp_scan(layers=2, d=32, d_ff=64, batch=1, seq=4, heads=2, remat=True)


def _shard_map_program(kind: str) -> tuple[Callable, tuple]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    x = jnp.arange(64.0).reshape(8, 8) / 10

    def body(v: Any) -> Any:
        if kind == "psum_scan":
            return lax.scan(lambda c, y: (c + lax.psum(y, "i"), None), jnp.zeros_like(v[0]), v)[0]
        if kind == "all_gather":
            return lax.all_gather(v, "i", tiled=True) * 2
        if kind == "psum_scatter":
            return lax.psum_scatter(jnp.tile(v, (8, 1)), "i", scatter_dimension=0, tiled=True)
        if kind == "ppermute":
            return lax.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)])
        if kind == "all_to_all":
            return lax.all_to_all(jnp.tile(v, (8, 1)), "i", 0, 0, tiled=True)
        w = jnp.ones((8, 8)) * 0.1

        def micro(acc, xb):
            g = jax.grad(lambda w_: jnp.sum(jnp.tanh(xb @ w_)))(w)
            return acc + lax.psum(g, "i"), None

        return lax.scan(micro, jnp.zeros_like(w), v.reshape(1, 1, 8))[0]

    out_specs = P() if kind == "grad_accumulation" else P("i")
    if kind == "psum_scan":
        out_specs = P()
    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=out_specs, check_vma=False)
    return jax.jit(f), (x,)


@functools.cache
def built(name: str) -> tuple[Callable, tuple]:
    """(jitted function, example args) of a program, built once per session (so jax's caches hit)."""
    import jax

    fn, args = program_by_name(name).build()
    return (fn if hasattr(fn, "lower") else jax.jit(fn)), args


@functools.cache
def _entries() -> tuple[CorpusEntry, ...]:
    out: list[CorpusEntry] = []
    for prog in PROGRAMS:
        fn, args = built(prog.name)
        lowered = fn.lower(*args)
        out.append(CorpusEntry(prog.name, lowered.as_text(dialect="hlo"), prog.devices, False))
        out.append(CorpusEntry(prog.name + ".opt", lowered.compile().as_text(), prog.devices, True,
                               prog.reentry_refused))
    return tuple(out)


def corpus_texts(optimized: bool | None = None) -> list[CorpusEntry]:
    """Every corpus module (cached per session); `optimized` filters unoptimized/after-optimization ones."""
    return [e for e in _entries() if optimized is None or e.optimized == optimized]


def program_by_name(name: str) -> Program:
    """A registered program."""
    return next(p for p in PROGRAMS if p.name == name)


def program_text(name: str) -> tuple[str, int]:
    """(unoptimized HLO text as jax lowers it, devices) of a program."""
    fn, args = built(name)
    return fn.lower(*args).as_text(dialect="hlo"), program_by_name(name).devices


from hlopt.corpus import programs_extra  # noqa: E402,F401 - registers more programs: sharded jit, DP/FSDP steps, batched LAPACK
