"""Elided literals (`constant({...})`): parsed and printed as they are, never compiled, run or folded; capture
and the hook carry every literal in full."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlopt.hlo import parse
from hlopt.hlo.literal import ElidedLiteralError, check_no_elided_constants, elided_constants
from hlopt.passes.framework.pipeline import Pipeline

from hlopt import runtime

ELIDED = """HloModule m, entry_computation_layout={(f32[20,4]{1,0})->f32[32,4]{1,0}}

ENTRY %main (w: f32[20,4]) -> f32[32,4] {
  %table = f32[32,20]{1,0} constant({...})
  %w = f32[20,4]{1,0} parameter(0)
  ROOT %dot = f32[32,4]{1,0} dot(%table, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

TWO_ELIDED = """HloModule m2

ENTRY %main () -> f32[32,20] {
  %a = f32[32,20]{1,0} constant({...})
  %b = f32[32,20]{1,0} constant({...})
  ROOT %s = f32[32,20]{1,0} subtract(%a, %b)
}
"""


def test_elided_literal_parses_prints_and_is_found() -> None:
    module = parse(ELIDED)
    assert [i.name for i in elided_constants(module)] == ["table"]
    assert "constant({...})" in module.to_text()


def test_compile_and_execute_refuse_an_elided_literal() -> None:
    for action in (lambda: runtime.compile(parse(ELIDED)), lambda: runtime.compile(ELIDED),
                   lambda: runtime.execute(parse(ELIDED), [np.ones((20, 4), np.float32)])):
        with pytest.raises(ElidedLiteralError, match=r"%table.*--xla_dump_large_constants"):
            action()


def test_check_names_the_action() -> None:
    with pytest.raises(ElidedLiteralError, match="cannot emit module 'm'"):
        check_no_elided_constants(parse(ELIDED), "emit")
    check_no_elided_constants(parse(ELIDED.replace("{...}", "{" + ", ".join(["{" + ", ".join(["1"] * 20) + "}"]
                                                                            * 32) + "}")), "emit")


@pytest.mark.parametrize("pipeline", ["cse", "default"])
def test_passes_never_merge_or_fold_elided_literals(pipeline: str) -> None:
    module = parse(TWO_ELIDED)
    Pipeline.parse(pipeline).run(module)
    assert len(elided_constants(module)) == 2  # a - b is not 0: the values are unknown


def _closure_program():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((32, 20)), jnp.float32)
    return (lambda w: jnp.dot(x, w)), jnp.ones((20, 4), jnp.float32), x


def test_capture_carries_large_constants_in_full() -> None:
    fn, w, x = _closure_program()
    for text in (runtime.capture_text(fn, w), runtime.capture_optimized_text(fn, w)):
        assert "{...}" not in text
    module = runtime.capture(fn, w)
    assert not elided_constants(module)
    np.testing.assert_allclose(runtime.execute(module, [np.asarray(w)])[0], np.asarray(x @ w), rtol=1e-5)


def test_regression_jit_over_closed_over_32x20_array_is_not_zeros() -> None:
    fn, w, x = _closure_program()
    got = runtime.jit(fn, pipeline="default", check=True)(w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x @ w), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(got)).max() > 0


def test_hook_over_closed_over_array_matches_jax() -> None:
    fn, w, x = _closure_program()
    with runtime.hook("default", strict=True) as h:
        got = jax.jit(fn)(w)
    assert h.records and not h.records[-1].fell_back
    np.testing.assert_allclose(np.asarray(got), np.asarray(x @ w), rtol=1e-5, atol=1e-5)
