"""Differential suite: real programs under `runtime.jit(check=True)` and under `runtime.hook`, for every named
pipeline, compared with plain `jax.jit`. The `default` pipeline runs by default; the others are marked slow."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlopt.passes.framework.pipeline import NAMED_PIPELINES

from hlopt import runtime

RNG = np.random.default_rng(0)
Program = tuple[Callable, list[tuple], dict]  # function, argument tuples (one call each), jax.jit kwargs


def _closure(dtype: Any) -> Program:
    base = RNG.standard_normal((32, 20)) * 4
    table = jnp.asarray(base > 0 if dtype == jnp.bool_ else base, dtype)  # large enough for XLA to elide it

    def fn(w):
        return jnp.dot(table.astype(jnp.float32), w) + jnp.sum(table.astype(jnp.float32))

    return fn, [(jnp.asarray(RNG.standard_normal((20, 4)), jnp.float32),)], {}


def _static_argument() -> Program:
    def fn(x, n):
        return jnp.sum(x * jnp.arange(x.shape[0])) * n

    x = jnp.arange(1.0, 101.0)
    return fn, [(x, 2), (x, 3), (x, 7)], {"static_argnums": 1}


def _donation() -> Program:
    def fn(params, grads):
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    def args():
        return ({"w": jnp.ones((16, 8)), "b": jnp.arange(8.0)}, {"w": jnp.full((16, 8), 2.0), "b": jnp.ones(8)})

    return fn, [args(), args()], {"donate_argnums": 0}


def _pytrees() -> Program:
    def fn(tree, scale):
        a, (b, c) = tree["a"], tree["bc"]
        return {"sum": a + b, "parts": (a * scale, jnp.tanh(c))}, [jnp.max(c)]

    tree = {"a": jnp.arange(12.0).reshape(3, 4), "bc": (jnp.ones((3, 4)), jnp.asarray(RNG.standard_normal((5,))))}
    return fn, [(tree, 2.5)], {}


def _control_flow() -> Program:
    mask = jnp.asarray(RNG.standard_normal((16,)) > 0)

    def fn(x, k):
        def body(carry, xi):
            return carry * 0.9 + xi, carry

        carry, ys = jax.lax.scan(body, jnp.zeros(16), x)
        count = jax.lax.while_loop(lambda s: s[0] < k, lambda s: (s[0] + 1, s[1] * 1.5), (0, carry))[1]
        return jax.lax.cond(jnp.sum(count) > 0, lambda: jnp.where(mask, count, ys[0]), lambda: -count)

    return fn, [(jnp.asarray(RNG.standard_normal((8, 16)), jnp.float32), 5)], {}


def _prng() -> Program:
    fixed = jax.random.key(7)

    def fn(key, x):
        k1, k2 = jax.random.split(key)
        noise = jax.random.normal(k1, x.shape) + jax.random.uniform(jax.random.fold_in(fixed, 3), x.shape)
        return x + noise, jax.random.bernoulli(k2, 0.3, x.shape), jax.random.key_data(k2)

    return fn, [(jax.random.key(0), jnp.ones((4, 8)))], {}


def _flax_linen_optax() -> Program:
    flax_linen = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")

    class MLP(flax_linen.Module):
        @flax_linen.compact
        def __call__(self, x):
            return flax_linen.Dense(1)(flax_linen.relu(flax_linen.Dense(32)(x)))

    model, opt = MLP(), optax.adam(1e-2)
    x = jnp.asarray(RNG.standard_normal((64, 8)), jnp.float32)
    y = jnp.sum(x, axis=1, keepdims=True)  # closed over: the batch
    params = model.init(jax.random.key(0), x)

    def step(params, opt_state):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, [(params, opt.init(params))], {}


def _flax_nnx() -> Program:
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    x = jnp.asarray(RNG.standard_normal((16, 8)), jnp.float32)

    def loss(state):
        return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

    def fn(state):
        value, grads = jax.value_and_grad(loss)(state)
        return value, jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)

    return fn, [(state,)], {}


def _mesh():
    from jax.sharding import Mesh

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 CPU devices")
    return Mesh(np.array(jax.devices()[:8]), ("d",))


def _shard_map() -> Program:
    from jax.sharding import PartitionSpec as P

    mesh = _mesh()
    shard_map = getattr(jax, "shard_map", None) or __import__("jax.experimental.shard_map").experimental.shard_map

    @partial(shard_map.shard_map if hasattr(shard_map, "shard_map") else shard_map, mesh=mesh, in_specs=P("d"),
             out_specs=P())
    def fn(x):
        return jax.lax.psum(jnp.sum(x * x, axis=0), "d")

    return fn, [(jnp.asarray(RNG.standard_normal((64, 4)), jnp.float32),)], {}


def _jit_with_shardings() -> Program:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = _mesh()
    rows = NamedSharding(mesh, P("d"))
    w = jnp.asarray(RNG.standard_normal((8, 8)), jnp.float32)

    def fn(x):
        return jnp.tanh(x @ w), jnp.sum(x)

    x = jax.device_put(jnp.asarray(RNG.standard_normal((32, 8)), jnp.float32), rows)
    return fn, [(x,)], {"in_shardings": rows, "out_shardings": (rows, NamedSharding(mesh, P()))}


PROGRAMS: dict[str, Callable[[], Program]] = {
    **{f"closure_{np.dtype(d).name}": partial(_closure, d)
       for d in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.int8, jnp.uint8, jnp.bool_)},
    "static_argument": _static_argument, "donation": _donation, "pytrees": _pytrees,
    "control_flow": _control_flow, "prng": _prng, "flax_linen_optax": _flax_linen_optax, "flax_nnx": _flax_nnx,
    "shard_map": _shard_map, "jit_with_shardings": _jit_with_shardings,
}
PIPELINES = [pytest.param(p, marks=() if p == "default" else pytest.mark.slow) for p in NAMED_PIPELINES]


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x, tree)


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(jax.random.key_data(x) if jnp.issubdtype(getattr(x, "dtype", np.float32),
                                                               jax.dtypes.prng_key) else x)
            for x in jax.tree.leaves(tree)]


def _assert_same(got: Any, want: Any) -> None:
    got, want = _leaves(got), _leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.isfinite(g.astype(np.float64)).all() == np.isfinite(w.astype(np.float64)).all()
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-2 if g.dtype.itemsize < 4
                                   else 1e-4, atol=1e-4)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_runtime_jit_check_matches_jax_jit(name: str, pipeline: str) -> None:
    fn, calls, jit_kwargs = PROGRAMS[name]()
    jitted = runtime.jit(fn, pipeline=pipeline, check=True, strict=True, rtol=1e-4, atol=1e-4, **jit_kwargs)
    jitted.hook.skip_discarded_on_cpu = False  # prove the fusion and scheduling passes too (the hook test skips them)
    plain = jax.jit(fn, **jit_kwargs)
    for args in calls:
        want = plain(*_copy(args))
        _assert_same(jitted(*args), want)
    assert jitted.records and not any(r.fell_back for r in jitted.records)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_hook_matches_jax_jit(name: str, pipeline: str) -> None:
    fn, calls, jit_kwargs = PROGRAMS[name]()
    wants = [jax.jit(fn, **jit_kwargs)(*_copy(args)) for args in calls]
    with runtime.hook(pipeline, strict=True) as h:
        jitted = jax.jit(fn, **jit_kwargs)
        gots = [jitted(*args) for args in calls]
    for got, want in zip(gots, wants, strict=True):
        _assert_same(got, want)
    assert h.records and not any(r.fell_back for r in h.records)
    if pipeline == "default":
        assert all("priority-fusion" in r.skipped for r in h.records)  # XLA:CPU would discard its output


def test_regression_flax_linen_mlp_optax_training_is_finite_and_matches() -> None:
    step, [(params, opt_state)], _ = _flax_linen_optax()
    ours, plain = runtime.jit(step, check=True), jax.jit(step)
    p1, s1, p2, s2 = params, opt_state, params, opt_state
    for _ in range(5):
        p1, s1, loss1 = ours(p1, s1)
        p2, s2, loss2 = plain(p2, s2)
        assert np.isfinite(float(loss1))
        np.testing.assert_allclose(float(loss1), float(loss2), rtol=1e-4)


def test_check_runs_for_every_new_static_value() -> None:
    fn, calls, jit_kwargs = _static_argument()
    jitted = runtime.jit(fn, check=True, **jit_kwargs)
    for args in calls:
        jitted(*args)
    assert len(jitted.records) == len(calls)  # one compile, hence one check, per static value


def test_hook_recompiles_functions_jax_compiled_before() -> None:
    from hlopt.runtime.jax_integration.hook import HookWarning

    def twice_plus_one(x):
        return x * 2 + 1

    fn, x = jax.jit(twice_plus_one), jnp.ones(3)
    fn(x)
    with runtime.hook("default") as h:
        fn(x)
    assert [r.module for r in h.records] == ["jit_twice_plus_one"]
    with pytest.warns(HookWarning, match="nothing was compiled"), runtime.hook("default", recompile=False):
        fn(x)
