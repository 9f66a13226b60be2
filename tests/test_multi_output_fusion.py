"""multi-output-fusion, structure (no jax): siblings on a shared operand, producer-consumer with extra users,
XLA's refusals (connected siblings, loop shapes, cycles, DUS, budgets), the cost model. Numerics on XLA CPU:
test_multi_output_fusion_numerics.py."""

from __future__ import annotations

from fusion_cases import entry_module
from hlopt.hlo.ir import Module
from hlopt.passes.framework.pipeline import Pipeline, PipelineResult, run_pipeline
from hlopt.passes.framework.registry import create_pass
from hlopt.passes.fusion.priority_fusion import explain_lines

from hlopt import hlo


def _run(text: str, spec: str = "priority-fusion", **options) -> tuple[Module, Module, PipelineResult]:
    m = hlo.parse(text)
    before = m.clone()
    run_pipeline(m, spec)
    p = create_pass("multi-output-fusion", **options)
    result = Pipeline([p]).run(m)
    hlo.verify(m)
    return before, m, result


def _multi_output(m: Module) -> list:
    return [i for i in m.instructions() if i.opcode == "fusion" and i.attrs["calls"].root.opcode == "tuple"]


SIBLINGS = entry_module("""  %x = f32[64,1024]{1,0} parameter(0)
  %e = f32[64,1024]{1,0} exponential(%x)
  %n = f32[64,1024]{1,0} negate(%e)
  %z = f32[] constant(0)
  %r = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum
  ROOT %o = (f32[64,1024]{1,0}, f32[64]{0}) tuple(%n, %r)""", "x: f32[64,1024]", "(f32[64,1024], f32[64])")


def test_connected_siblings_are_not_fused():
    text = entry_module("""  %x = f32[4096]{0} parameter(0)
  %w = f32[4096,4096]{1,0} parameter(1)
  %e = f32[4096]{0} exponential(%x)
  %b = f32[1,4096]{1,0} reshape(%e)
  %d = f32[1,4096]{1,0} dot(%b, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %r = f32[4096]{0} reshape(%d)
  %s = f32[4096]{0} add(%x, %r)
  ROOT %o = (f32[4096]{0}, f32[4096]{0}) tuple(%e, %s)""", "x: f32[4096], w: f32[4096,4096]",
                   "(f32[4096], f32[4096])")
    _, m, p = _run(text)
    assert not _multi_output(m)
    assert any("connected" in line or "cycle" in line for line in p.explain_lines())


def test_different_loop_shapes_are_not_fused():
    text = entry_module("""  %x = f32[256,256]{1,0} parameter(0)
  %s = f32[16,256]{1,0} slice(%x), slice={[0:16], [0:256]}
  %e = f32[16,256]{1,0} exponential(%s)
  %n = f32[256,256]{1,0} negate(%x)
  %t = f32[256,256]{1,0} tanh(%n)
  ROOT %o = (f32[16,256]{1,0}, f32[256,256]{1,0}) tuple(%e, %t)""", "x: f32[256,256]",
                   "(f32[16,256], f32[256,256])")
    _, m, p = _run(text)
    assert not _multi_output(m)
    assert any("different loop shapes" in line for line in p.explain_lines())


def test_unnested_reduction_budget():
    reduces = "\n".join(f"  %e{i} = f32[64,1024]{{1,0}} multiply(%x, %x)\n"
                        f"  %r{i} = f32[64]{{0}} reduce(%e{i}, %z), dimensions={{1}}, to_apply=%sum" for i in range(4))
    outs = ", ".join(f"%r{i}" for i in range(4))
    text = entry_module(f"""  %x = f32[64,1024]{{1,0}} parameter(0)
  %z = f32[] constant(0)
{reduces}
  ROOT %o = ({", ".join(["f32[64]{0}"] * 4)}) tuple({outs})""", "x: f32[64,1024]", "(" + ", ".join(["f32[64]"] * 4) + ")")
    _, m, _ = _run(text)
    assert len(_multi_output(m)) == 1
    _, m, p = _run(text, max_unnested_reductions=2)
    assert any("unnested reductions" in line for line in p.explain_lines())
    assert all(sum(i.opcode == "reduce" for i in f.attrs["calls"].instructions) <= 2 for f in _multi_output(m))


def test_explain_lines_cover_both_passes():
    m = hlo.parse(SIBLINGS)
    lines = explain_lines(run_pipeline(m, "priority-fusion,multi-output-fusion"))
    assert any(line.startswith("[priority-fusion]") for line in lines)
    assert any(line.startswith("[multi-output-fusion]") for line in lines)


