"""A flax training loop written for plain jax.jit runs unchanged under runtime.hook."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

import jax  # noqa: E402

from hlopt import runtime  # noqa: E402


def _example():
    path = Path(__file__).resolve().parent.parent / "examples" / "flax_training_hook.py"
    spec = importlib.util.spec_from_file_location("flax_training_hook", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flax_training_loop_under_hook_matches_plain_jit():
    ex = _example()
    plain = ex.train(steps=4)
    jax.clear_caches()  # the hooked run must compile afresh, not reuse plain jit's executables
    with runtime.hook("default") as h:
        hooked = ex.train(steps=4)
    np.testing.assert_allclose(hooked, plain, rtol=1e-4, atol=1e-6)
    steps = [r for r in h.records if "train_step" in r.module]
    assert len(steps) == 1, [r.module for r in h.records]
    record = steps[0]
    assert record.fell_back is None
    assert {p.name for p in record.passes if p.changed} & {"algebraic-simplifier", "cse", "dce", "call-inliner"}
    # XLA:CPU discards our fusions and schedule: the hook skips those passes and says so
    assert set(record.skipped) == {"dot-strength-reduction", "select-and-scatter-expander", "scatter-simplifier",
                                   "priority-fusion", "multi-output-fusion", "latency-hiding-scheduler"}
    assert "skipped on XLA:CPU" in record.summary()
    assert record.instructions_before > 50
