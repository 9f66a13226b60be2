"""priority-fusion: what fuses and what must not, kinds, explanations, numerics on XLA CPU."""

from __future__ import annotations

import pytest
from corpus import corpus_texts

import hlo
import runtime
from passes.pipeline import Pipeline, run_pipeline
from passes.registry import create_pass

CHAIN = """HloModule chain

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[64,256], y: f32[64,256], w: f32[256,256]) -> (f32[64], f32[64,256]) {
  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64,256]{1,0} parameter(1)
  %w = f32[256,256]{1,0} parameter(2)
  %a = f32[64,256]{1,0} add(%x, %y)
  %t = f32[64,256]{1,0} tanh(%a)
  %zero = f32[] constant(0)
  %r = f32[64]{0} reduce(%t, %zero), dimensions={1}, to_apply=%sum
  %d = f32[64,256]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %m = f32[64,256]{1,0} multiply(%d, %d)
  ROOT %out = (f32[64], f32[64,256]{1,0}) tuple(%r, %m)
}
"""


def _fusions(m):
    return [i for i in m.instructions() if i.opcode == "fusion"]


def test_elementwise_chain_fuses_into_reduction_and_dot_stays():
    m = hlo.parse(CHAIN)
    before = m.clone()
    assert run_pipeline(m, "priority-fusion").changed
    ops = [i.opcode for i in m.entry.instructions]
    assert "dot" in ops and "tanh" not in ops and "reduce" not in ops
    reduce_fusion = next(f for f in _fusions(m) if any(i.opcode == "reduce" for i in f.attrs["calls"].instructions))
    assert str(reduce_fusion.attrs["kind"]) == "kInput"
    assert all(i.opcode != "dot" for f in _fusions(m) for i in f.attrs["calls"].instructions)
    hlo.verify(m)
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok


def test_producer_with_several_consumers_fuses_into_all_or_none():
    m = hlo.parse(CHAIN)
    run_pipeline(m, "priority-fusion")
    # %a feeds the tanh/reduce chain and the dot: the dot cannot take it, so %a stays a kernel of its own
    a_like = [i for i in m.entry.instructions if i.opcode in ("add", "fusion") and
              any(u.opcode == "dot" for u in i.users)]
    assert len(a_like) == 1


def test_expensive_producer_is_not_duplicated():
    text = CHAIN.replace("%d = f32[64,256]{1,0} dot(%a, %w)", "%d = f32[64,256]{1,0} dot(%t2, %w)").replace(
        "%t = f32[64,256]{1,0} tanh(%a)", "%t = f32[64,256]{1,0} tanh(%a)\n  %t2 = f32[64,256]{1,0} exponential(%a)\n"
        "  %u = f32[64,256]{1,0} add(%t2, %t2)\n  %v = f32[64,256]{1,0} subtract(%t2, %x)")
    text = text.replace("ROOT %out = (f32[64], f32[64,256]{1,0}) tuple(%r, %m)",
                        "ROOT %out = (f32[64], f32[64,256]{1,0}, f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(%r, %m, %u, %v)")
    text = text.replace("-> (f32[64], f32[64,256])", "-> (f32[64], f32[64,256], f32[64,256], f32[64,256])")
    m = hlo.parse(text)
    p = create_pass("priority-fusion")
    Pipeline([p]).run(m)
    assert any("t2" in line and "refused" in line for line in p.explain_lines())


def test_explanations_say_why():
    m = hlo.parse(CHAIN)
    p = create_pass("priority-fusion")
    Pipeline([p]).run(m)
    lines = p.explain_lines()
    assert any(line.startswith("fused %t") and "modeled gain" in line for line in lines)
    assert any("dot is not fusible" in line or "not fusible" in line for line in lines)


def test_xla_cpu_keeps_our_loop_fusions():
    m = hlo.parse("""HloModule keep
ENTRY %main (x: f32[128], y: f32[128]) -> f32[128] {
  %x = f32[128]{0} parameter(0)
  %y = f32[128]{0} parameter(1)
  %a = f32[128]{0} add(%x, %y)
  %n = f32[128]{0} negate(%a)
  ROOT %t = f32[128]{0} multiply(%n, %x)
}""")
    before = m.clone()
    run_pipeline(m, "priority-fusion")
    (fusion,) = _fusions(m)
    assert str(fusion.attrs["kind"]) == "kLoop"
    exe = runtime.compile(m, keep_fusions=True)
    compiled = exe.compiled_text()
    assert "kind=kLoop" in compiled and fusion.attrs["calls"].root.opcode in compiled
    inputs = runtime.random_inputs(before)
    assert runtime.compare(runtime.execute(before, inputs), exe.execute(inputs)).ok


@pytest.mark.parametrize("entry", corpus_texts(), ids=[e.id for e in corpus_texts()])
def test_corpus_fused_runs_the_same(entry):
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner,simplify,priority-fusion")
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)
