"""match, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_match.py."""

from __future__ import annotations

import numpy as np
from hlopt.hlo.builder import Builder
from hlopt.passes.framework.match import Pat, PatternMatcher, replace_instruction
from test_match import _m

from hlopt import hlo, runtime


def test_user_rule_is_numerically_sound():
    """x * 2 -> x + x, written with the DSL, checked on XLA CPU."""
    before = _m()
    after = before.clone()

    def double(root, x):
        return Builder(root.parent, before=root).add(x, x)

    rules = PatternMatcher([(Pat("multiply", [Pat.any("x"), Pat.const(2)]), double)])
    e = after.entry
    changed = 0
    for inst in list(e.instructions):
        new = rules.rewrite(inst)
        if new is not None:
            changed += replace_instruction(inst, new)
    assert changed == 1 and e.root.operand(5).opcode == "add"
    hlo.verify(after)
    inputs = runtime.random_inputs(before, 0)
    expected, actual = runtime.execute(before, inputs), runtime.execute(after, inputs)
    for x, y in zip(expected, actual, strict=True):
        np.testing.assert_array_equal(x, y)
