"""More corpus programs: `lapack_batched` joins the PROGRAMS of hlopt.corpus.programs (which imports this module);
the SPMD programs are in `SPMD_PROGRAMS` / `extra_corpus_texts()`.

Shapes of program the cost model must match XLA's HloCostAnalysis on:
- `jit` with `in_shardings` / `out_shardings` / sharding constraints over 8 CPU devices: the unoptimized
  module is the one before SPMD partitioning, with `Sharding` custom-calls and `xla.sdy` attributes;
- a data-parallel and an FSDP training step (the optimized modules are collective-heavy);
- LAPACK custom-calls (cholesky, LU solve, triangular solve, eigh) on batched matrices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from hlopt.corpus.programs import CorpusEntry, Program, program

#: Programs kept out of corpus.PROGRAMS: test_corpus cannot yet execute their XLA:CPU-optimized (partitioned)
#: module shard by shard (a multi-output partitioned module fails to compile on re-entry, "Failed to get
#: shape"; a 2-D or row-sharded output is reassembled wrongly). Their modules are in `extra_corpus_texts()`.
SPMD_PROGRAMS: list[Program] = []


def spmd_program(name: str, devices: int = 8) -> Callable:
    """Register a program in SPMD_PROGRAMS."""

    def register(build: Callable[[], tuple[Callable, tuple]]) -> Callable:
        SPMD_PROGRAMS.append(Program(name, build, devices))
        return build

    return register


@functools.cache
def extra_corpus_texts() -> tuple[CorpusEntry, ...]:
    """The unoptimized (pre-SPMD) and XLA:CPU-optimized modules of SPMD_PROGRAMS (cached per session)."""
    out: list[CorpusEntry] = []
    for prog in SPMD_PROGRAMS:
        fn, args = prog.build()
        lowered = fn.lower(*args)
        out.append(CorpusEntry(prog.name, lowered.as_text(dialect="hlo"), prog.devices, False))
        out.append(CorpusEntry(prog.name + ".opt", lowered.compile().as_text(), prog.devices, True))
    return tuple(out)


def _mesh():
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def _named(mesh, *spec):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(mesh, P(*spec))


def _mlp_loss(params, x, y):
    import jax.numpy as jnp

    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def _params():
    import jax.numpy as jnp

    return {"w1": jnp.ones((16, 32)) * 0.1, "b1": jnp.zeros(32), "w2": jnp.ones((32, 8)) * 0.1}


def _sgd_step(params, x, y):
    import jax

    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


@spmd_program("sharded_jit_constraints")
def _sharded_jit() -> tuple[Callable, tuple]:
    import jax
    import jax.numpy as jnp

    mesh = _mesh()

    def f(x, w):
        h = jax.lax.with_sharding_constraint(x @ w, _named(mesh, "data", "model"))
        h = jnp.maximum(h, 0.0)
        return jax.lax.with_sharding_constraint(h.sum(axis=1), _named(mesh, "data"))

    jitted = jax.jit(f, in_shardings=(_named(mesh, "data", None), _named(mesh, None, "model")),
                     out_shardings=_named(mesh, "data"))
    return jitted, (jnp.arange(256.0).reshape(16, 16) / 100, jnp.ones((16, 32)) * 0.1)


@spmd_program("data_parallel_step")
def _data_parallel() -> tuple[Callable, tuple]:
    import jax
    import jax.numpy as jnp

    mesh = _mesh()
    replicated = _named(mesh)
    batch = _named(mesh, ("data", "model"), None)
    params = _params()
    shard_params = jax.tree.map(lambda _: replicated, params)
    jitted = jax.jit(_sgd_step, in_shardings=(shard_params, batch, batch), out_shardings=(shard_params, replicated))
    return jitted, (params, jnp.ones((32, 16)), jnp.ones((32, 8)))


@spmd_program("fsdp_step")
def _fsdp() -> tuple[Callable, tuple]:
    import jax
    import jax.numpy as jnp

    mesh = _mesh()
    batch = _named(mesh, "data", None)
    params = _params()
    shard_params = {"w1": _named(mesh, "model", None), "b1": _named(mesh, "model"), "w2": _named(mesh, "model", None)}
    jitted = jax.jit(_sgd_step, in_shardings=(shard_params, batch, batch),
                     out_shardings=(shard_params, _named(mesh)))
    return jitted, (params, jnp.ones((32, 16)), jnp.ones((32, 8)))


@program("lapack_batched")
def _lapack() -> tuple[Callable, tuple]:
    import jax
    import jax.numpy as jnp

    def f(a, b):
        spd = a @ jnp.swapaxes(a, -1, -2) + 8.0 * jnp.eye(8)
        chol = jnp.linalg.cholesky(spd)
        x = jnp.linalg.solve(spd, b)
        t = jax.scipy.linalg.solve_triangular(chol, b, lower=True)
        w, v = jnp.linalg.eigh(spd)
        return chol, x, t, w, v

    a = jnp.arange(3 * 64.0).reshape(3, 8, 8) / 100
    return f, (a, jnp.ones((3, 8, 2)))


def _mesh_1d():
    import jax
    from jax.sharding import Mesh

    return Mesh(jax.devices()[:8], ("d",))


@spmd_program("dp_mlp_psum_per_layer")
def _dp_mlp_psum_per_layer() -> tuple[Callable, tuple]:
    """A data-parallel MLP in shard_map: each layer's gradient psum'ed (the cost issue's first program)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)

    def step(ws, x):
        grads = [jax.lax.psum(g, "d") for g in jax.grad(loss)(ws, x)]
        return [w - 0.1 * g for w, g in zip(ws, grads, strict=True)]

    fn = jax.jit(jax.shard_map(step, mesh=_mesh_1d(), in_specs=(P(), P("d")), out_specs=P()))
    return fn, ([jnp.ones((16, 16)) * 0.1 for _ in range(3)], jnp.ones((64, 16)))


@spmd_program("transformer_24_gradient_all_reduces")
def _transformer_24() -> tuple[Callable, tuple]:
    """A 3-block transformer step on 8 devices, its 24 gradients psum'ed (the cost issue's second program)."""
    import jax
    import jax.numpy as jnp
    from hlopt.corpus.transformer import stack_loss
    from jax.sharding import PartitionSpec as P

    def loss(ps, x):
        return stack_loss(ps, x, scale=4.0, norms=("g1", "g2"))

    def step(ps, x):
        grads = jax.tree.map(lambda g: jax.lax.psum(g, "d"), jax.grad(loss)(ps, x))
        return jax.tree.map(lambda a, b: a - 0.1 * b, ps, grads)

    d, key = 16, jax.random.PRNGKey(0)
    shapes = {"g1": (d,), "g2": (d,), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, 32),
              "w2": (32, d)}
    ps = [{k: jax.random.normal(jax.random.fold_in(key, 10 * layer + i), s) * 0.1
           for i, (k, s) in enumerate(shapes.items())} for layer in range(3)]
    fn = jax.jit(jax.shard_map(step, mesh=_mesh_1d(), in_specs=(P(), P("d")), out_specs=P()))
    return fn, (ps, jnp.ones((16, 4, d)))
