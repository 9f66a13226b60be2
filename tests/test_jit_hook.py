"""runtime.jit and runtime.hook: jax programs compiled through an hlopt pipeline."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlopt.passes import ModulePass, register
from hlopt.runtime.jax_integration.jit import CheckError

from hlopt import runtime


def _f(x, y, scale=1.0):
    z = x * 1.0 + 0.0
    return {"s": jnp.tanh(z @ y).sum(0) * scale, "z": z}


def test_jit_matches_jax_and_reports():
    g = runtime.jit(_f, pipeline="call-inliner,simplify", check=True, static_argnames="scale")
    x, y = jnp.arange(16.0).reshape(4, 4) / 10, jnp.ones((4, 4))
    out = g(x, y, scale=2.0)
    want = jax.jit(_f, static_argnames="scale")(x, y, scale=2.0)
    np.testing.assert_allclose(out["s"], want["s"], rtol=1e-6)
    assert len(g.records) == 1 and g.records[0].passes
    g(x + 1, y, scale=2.0)  # same signature: no new compile
    assert len(g.records) == 1
    assert "optimized by 'call-inliner,simplify'" in g.stats()


def test_jit_multi_device_training_step_with_default_pipeline():
    from hlopt.cli.demo_program import make_train_step

    step, args = make_train_step(microbatches=2, batch=8, seq=4, d_model=16, d_ff=32)
    g = runtime.jit(step, pipeline="default", check=True, rtol=2e-4, atol=1e-5)
    g(*args)
    (record,) = [r for r in g.records if r.module.startswith("jit_step")]
    assert any(p.name == "while-loop-all-reduce-code-motion" and p.changed for p in record.passes)


@register
@dataclass(frozen=True)
class _Breaks(ModulePass):
    name: ClassVar[str] = "test-hook-breaks"

    def run(self, module):
        raise RuntimeError("deliberately broken")


@register
@dataclass(frozen=True)
class _Wrong(ModulePass):
    name: ClassVar[str] = "test-hook-wrong"

    def run(self, module):
        for inst in module.entry.instructions:
            if inst.opcode == "tanh":
                inst.opcode = "exponential"
                return True
        return False


def test_failing_pass_falls_back_unless_strict():
    x, y = jnp.ones((4, 4)), jnp.ones((4, 4))
    g = runtime.jit(_f, pipeline="test-hook-breaks")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = g(x, y)
    assert any("deliberately broken" in str(w.message) for w in caught)
    assert g.records[0].fell_back
    np.testing.assert_allclose(out["s"], jax.jit(_f)(x, y)["s"])
    strict = runtime.jit(_f, pipeline="test-hook-breaks", strict=True)
    with pytest.raises(Exception, match="deliberately broken"):
        strict(x, y)


def test_check_catches_a_wrong_pass():
    g = runtime.jit(_f, pipeline="test-hook-wrong", check=True)
    with pytest.raises(CheckError, match="changed the results"):
        g(jnp.ones((4, 4)), jnp.ones((4, 4)))


def test_hook_applies_to_unmodified_jax_code_and_uninstalls():
    @jax.jit
    def user_step(w, x):
        return w - 0.1 * jax.grad(lambda w_: jnp.sum(jnp.tanh(x @ w_) ** 2))(w)

    w, x = jnp.ones((4, 4)) * 0.1, jnp.ones((2, 4))
    with runtime.hook("call-inliner,simplify") as h:
        got = np.asarray(user_step(w, x))
        for _ in range(3):
            user_step(w, x)
    want = np.asarray(jax.jit(lambda a, b: user_step.__wrapped__(a, b))(w, x))
    assert any(r.module.startswith("jit_user_step") for r in h.records)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    from jax._src import compiler

    assert compiler.backend_compile_and_load.__module__ == "jax._src.compiler"


def test_jit_hook_applies_only_inside_its_calls_and_unpatches_when_gone():
    import gc
    import threading

    from jax._src import compiler

    g = runtime.jit(lambda a: a * 2.0 + 1.0, pipeline="simplify")
    x = jnp.ones((3,))
    g(x)
    assert len(g.records) == 1
    jax.jit(lambda a: a * 3.0)(x)  # jax is patched while g lives, but this compile is not g's
    assert len(g.records) == 1
    result = {}
    worker = threading.Thread(target=lambda fn=g: result.setdefault("y", np.asarray(fn(jnp.ones((5,))))))
    worker.start()
    worker.join()
    np.testing.assert_allclose(result["y"], np.full(5, 3.0))
    assert len(g.records) == 2  # a call in another thread compiles through g's pipeline too
    del g
    gc.collect()
    assert compiler.backend_compile_and_load.__module__ == "jax._src.compiler"
