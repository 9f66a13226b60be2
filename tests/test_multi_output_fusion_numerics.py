"""multi-output-fusion, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_multi_output_fusion.py."""

from __future__ import annotations

import pytest
from fusion_cases import entry_module
from hlopt.corpus.programs import corpus_texts
from hlopt.passes.framework.pipeline import run_pipeline
from test_multi_output_fusion import (  # the module texts and helpers the structure tests use
    SIBLINGS,
    _multi_output,
    _run,
)

from hlopt import hlo, runtime


def test_siblings_reading_one_operand_become_one_kernel():
    before, m, p = _run(SIBLINGS)
    (mof,) = _multi_output(m)
    assert mof.operand_count == 1 and mof.operand(0).opcode == "parameter"
    assert str(mof.attrs["kind"]) == "kInput"  # a reduction hero
    assert {u.opcode for u in mof.users} == {"get-tuple-element"}
    assert any("sibling" in line and "fused" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok


def test_producer_consumer_with_extra_user():
    text = entry_module("""  %x = f32[128,512]{1,0} parameter(0)
  %y = f32[128,512]{1,0} parameter(1)
  %w = f32[512,64]{1,0} parameter(2)
  %a = f32[128,512]{1,0} add(%x, %y)
  %z = f32[] constant(0)
  %r = f32[128]{0} reduce(%a, %z), dimensions={1}, to_apply=%sum
  %d = f32[128,64]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %o = (f32[128]{0}, f32[128,64]{1,0}) tuple(%r, %d)""", "x: f32[128,512], y: f32[128,512], w: f32[512,64]",
                   "(f32[128], f32[128,64])")
    before, m, p = _run(text)
    (mof,) = _multi_output(m)
    fused = [i.opcode for i in mof.attrs["calls"].instructions]
    assert "add" in fused and "reduce" in fused
    dot = next(i for i in m.entry.instructions if i.opcode == "dot")
    assert dot.operand(0).opcode == "get-tuple-element" and dot.operand(0).operand(0) is mof
    assert any("as an extra output" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m, rtol=1e-4, atol=1e-4).ok


def test_producer_consumer_refused_when_it_would_make_a_cycle():
    text = entry_module("""  %x = f32[128,128]{1,0} parameter(0)
  %a = f32[128,128]{1,0} exponential(%x)
  %d = f32[128,128]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %s = f32[128,128]{1,0} multiply(%a, %d)
  ROOT %o = (f32[128,128]{1,0}, f32[128,128]{1,0}) tuple(%s, %a)""", "x: f32[128,128]",
                   "(f32[128,128], f32[128,128])")
    before, m, p = _run(text)
    assert any("cycle" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m, rtol=1e-4, atol=1e-4).ok


def test_dynamic_update_slice_roots_are_left_alone():
    text = entry_module("""  %x = f32[1024]{0} parameter(0)
  %u = f32[16]{0} parameter(1)
  %i = s32[] parameter(2)
  %n = f32[16]{0} negate(%u)
  %d = f32[1024]{0} dynamic-update-slice(%x, %n, %i)
  %e = f32[1024]{0} exponential(%x)
  ROOT %o = (f32[1024]{0}, f32[1024]{0}) tuple(%d, %e)""", "x: f32[1024], u: f32[16], i: s32[]",
                   "(f32[1024], f32[1024])")
    before, m, p = _run(text)
    assert not _multi_output(m)
    assert runtime.run_and_compare(before, m).ok


@pytest.mark.parametrize("entry", corpus_texts(), ids=[e.id for e in corpus_texts()])
def test_corpus_fused_with_multi_output_runs_the_same(entry):
    if entry.reentry_refused:
        pytest.skip(entry.reentry_refused)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner,simplify,priority-fusion,multi-output-fusion")
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)
