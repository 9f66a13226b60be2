"""priority-fusion, structure (no jax): what fuses and what must not, kinds, naming, budgets, the cost
model's say, explanations, speed of the queue. The tests that run modules on XLA (every corpus module fused
runs the same on XLA CPU, and the numerics of each rewrite) are in test_priority_fusion_numerics.py."""

from __future__ import annotations

import pytest
from fusion_cases import SUM, entry_module
from hlopt.hlo.ir import Module
from hlopt.passes.framework.pipeline import NAMED_PIPELINES, Pipeline, PipelineResult, parse_pipeline
from hlopt.passes.framework.registry import create_pass
from hlopt.passes.fusion.fusion_rules import non_trivial_hero
from hlopt.passes.fusion.priority_fusion import PriorityFusion, explain_lines

from hlopt import hlo

CHAIN = """HloModule chain

""" + SUM + """
ENTRY %main (x: f32[64,256], y: f32[64,256], w: f32[256,256]) -> (f32[64], f32[64,256]) {
  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64,256]{1,0} parameter(1)
  %w = f32[256,256]{1,0} parameter(2)
  %a = f32[64,256]{1,0} add(%x, %y)
  %t = f32[64,256]{1,0} negate(%a)
  %zero = f32[] constant(0)
  %r = f32[64]{0} reduce(%t, %zero), dimensions={1}, to_apply=%sum
  %d = f32[64,256]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %m = f32[64,256]{1,0} multiply(%d, %d)
  ROOT %out = (f32[64], f32[64,256]{1,0}) tuple(%r, %m)
}
"""


def _fusions(m: Module) -> list:
    return [i for i in m.instructions() if i.opcode == "fusion"]


def _fused_opcodes(fusion) -> list[str]:
    return [i.opcode for i in fusion.attrs["calls"].instructions if i.opcode != "parameter"]


def _run(text: str, pre: str = "", **options) -> tuple[Module, Module, PipelineResult]:
    """priority-fusion with `options`, after the passes of the spec `pre` (XLA:GPU's pre-fusion rewrites)."""
    m = hlo.parse(text)
    before = m.clone()
    p = create_pass("priority-fusion", **options)
    result = Pipeline([*(parse_pipeline(pre) if pre else []), p]).run(m)
    hlo.verify(m)
    return before, m, result



def test_all_consumers_or_none():
    _, m, p = _run(CHAIN)
    # %a feeds negate and the dot: the dot cannot take it, so %a fuses into neither
    a = m.entry.instruction("a")
    assert a.opcode == "add" and {u.opcode for u in a.users} == {"fusion", "dot"}
    assert any("refused %a" in line and "dot" in line for line in p.explain_lines())


def test_operand_budget():
    params = ", ".join(f"p{i}: f32[128]" for i in range(6))
    decl = "\n".join(f"  %p{i} = f32[128]{{0}} parameter({i})" for i in range(6))
    text = entry_module(decl + """
  %a = f32[128]{0} add(%p0, %p1)
  %b = f32[128]{0} add(%a, %p2)
  %c = f32[128]{0} multiply(%p3, %p4)
  %d = f32[128]{0} subtract(%c, %p5)
  ROOT %e = f32[128]{0} add(%b, %d)""", params, "f32[128]")
    _, m, _ = _run(text)
    assert len(_fusions(m)) == 1
    _, m, p = _run(text, max_operands_and_outputs=6)
    kernels = [i for i in m.entry.instructions if i.opcode not in ("parameter", "tuple", "get-tuple-element")]
    assert len(kernels) > 1  # the budget kept some producers out of the one fusion
    assert any("operands" in line and "> 6" in line for line in p.explain_lines())


def test_code_size_limit():
    body = ["  %x = f32[256]{0} parameter(0)"] + [f"  %t{i} = f32[256]{{0}} tanh(%{'x' if i == 0 else f't{i - 1}'})"
                                                 for i in range(12)]
    body.append("  ROOT %r = f32[256]{0} negate(%t11)")
    text = entry_module("\n".join(body), "x: f32[256]", "f32[256]")
    _, m, _ = _run(text)
    assert len(_fusions(m)) == 1
    _, m, p = _run(text, max_ir_size=5)
    assert len(_fusions(m)) > 1 and any("code size" in line for line in p.explain_lines())


def test_basic_block_splits_are_limited_only_when_asked():
    # XLA:GPU's MLIR emitters have no basic-block split limit (ProducerConsumerMergedTooLarge checks the IR
    # size only): six pads chained fuse into one kernel; the legacy emitters' limit (an option) splits them
    body = ["  %x = f32[256]{0} parameter(0)", "  %z = f32[] constant(0)"]
    body += [f"  %p{i} = f32[{257 + i}]{{0}} pad(%{'x' if i == 0 else f'p{i - 1}'}, %z), padding=0_1"
             for i in range(6)]
    body.append("  ROOT %r = f32[262]{0} negate(%p5)")
    text = entry_module("\n".join(body), "x: f32[256]", "f32[262]")
    _, m, _ = _run(text)
    assert len(_fusions(m)) == 1
    _, m, p = _run(text, max_basic_block_splits=3)
    assert len(_fusions(m)) > 1 and any("basic-block splits > 3" in line for line in p.explain_lines())


def test_cost_model_refuses_when_fusing_is_slower():
    # a big add feeding six consumers: each fused copy would read both 64 MiB inputs again
    ops = ["negate", "exponential", "tanh", "abs", "sqrt", "floor"]
    uses = "\n".join(f"  %c{i} = f32[4096,4096]{{1,0}} {op}(%a)" for i, op in enumerate(ops))
    text = entry_module(f"""  %x = f32[4096,4096]{{1,0}} parameter(0)
  %y = f32[4096,4096]{{1,0}} parameter(1)
  %a = f32[4096,4096]{{1,0}} add(%x, %y)
{uses}
  ROOT %o = ({", ".join(["f32[4096,4096]{1,0}"] * 6)}) tuple({", ".join(f"%c{i}" for i in range(6))})""",
                   "x: f32[4096,4096], y: f32[4096,4096]", "(" + ", ".join(["f32[4096,4096]"] * 6) + ")")
    _, m, p = _run(text)
    assert m.entry.instruction("a").opcode == "add"
    assert any("refused %a" in line and "slower if fused" in line for line in p.explain_lines())


def test_expensive_math_stays_out_of_a_small_reduction():
    # XLA's model: a row reduction of 64 rows keeps most SMs idle, so tanh is cheaper as its own kernel
    text = CHAIN.replace("negate(%a)", "tanh(%a)")
    _, m, p = _run(text)
    assert any("refused %t" in line and "slower if fused" in line for line in p.explain_lines())


def test_small_dot_add_still_fuses():
    # (m + n) * k < 100: XLA keeps the dot for its loop emitter, so its add is an ordinary fusible add
    text = entry_module("""  %x = f32[4,4]{1,0} parameter(0)
  %w = f32[4,4]{1,0} parameter(1)
  %b = f32[4]{0} parameter(2)
  %d = f32[4,4]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bb = f32[4,4]{1,0} broadcast(%b), dimensions={1}
  %a = f32[4,4]{1,0} add(%d, %bb)
  ROOT %t = f32[4,4]{1,0} tanh(%a)""", "x: f32[4,4], w: f32[4,4], b: f32[4]", "f32[4,4]")
    _, m, _ = _run(text)
    assert "add" not in [i.opcode for i in m.entry.instructions]


SELECT_SCATTER = """
%ge (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction=GE
}
"""


def test_pre_fusion_rewrites_are_passes_of_the_fusion_and_default_pipelines():
    from hlopt.passes.framework.registry import registered_passes

    assert {"dot-strength-reduction", "select-and-scatter-expander", "scatter-simplifier"} <= set(registered_passes())
    fusion = [p.name for p in parse_pipeline("fusion")]
    assert fusion == ["dot-strength-reduction", "select-and-scatter-expander", "scatter-simplifier",
                      "priority-fusion", "multi-output-fusion"]
    default = [p.name for p in parse_pipeline("default") if hasattr(p, "name") and not p.name.startswith("fix(")]
    start = default.index("dot-strength-reduction")
    assert default[start:start + 5] == fusion and "fusion" in NAMED_PIPELINES["default"]


def test_pre_fusion_rewrites_carry_the_replaced_instructions_annotations():
    """As XLA's ReplaceInstruction: the replacement takes the old instruction's metadata, frontend attributes
    and sharding when it has none of its own (OpExpanderPass and the dot rewrite replace that way)."""
    notes = ', metadata={op_name="jit(f)/op" source_line=7}, frontend_attributes={k="v"}, sharding={replicated}'
    sas = entry_module(f"""  %x = f32[2,7,7]{{2,1,0}} parameter(0)
  %g = f32[2,4,4]{{2,1,0}} parameter(1)
  %zero = f32[] constant(0)
  ROOT %s = f32[2,7,7]{{2,1,0}} select-and-scatter(%x, %g, %zero), window={{size=1x3x3 stride=1x2x2 pad=0_0x1_1x1_1}}, select=%ge, scatter=%sum{notes}""",
                       "x: f32[2,7,7], g: f32[2,4,4]", "f32[2,7,7]", extra=SELECT_SCATTER)
    dot = entry_module(f"""  %a = f32[8,16]{{1,0}} parameter(0)
  %v = f32[16]{{0}} parameter(1)
  ROOT %d = f32[8]{{0}} dot(%a, %v), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}{notes}""",
                       "a: f32[8,16], v: f32[16]", "f32[8]")
    for text, spec, opcode in ((sas, "select-and-scatter-expander", "select-and-scatter"),
                               (dot, "dot-strength-reduction", "dot")):
        m = hlo.parse(text)
        assert Pipeline.parse(spec).run(m).changed
        root = m.entry.root
        assert root.opcode != opcode, spec
        assert root.attrs["metadata"].op_name == "jit(f)/op", spec
        assert dict(root.attrs["frontend_attributes"]) == {"k": "v"}, spec
        assert "replicated" in str(root.attrs["sharding"]), spec


def test_best_gain_first_and_neighbours_recosted_only(monkeypatch):
    import hlopt.passes.fusion.priority_fusion as pf

    calls = []
    original = pf._Queue.priority  # noqa: SLF001 (deliberately pokes internals)

    def counting(self, producer):
        calls.append(producer.name)
        return original(self, producer)

    monkeypatch.setattr(pf._Queue, "priority", counting)  # noqa: SLF001 (deliberately pokes internals)
    n = 300
    body = ["  %x0 = f32[1024]{0} parameter(0)"] + [f"  %x{i + 1} = f32[1024]{{0}} negate(%x{i})" for i in range(n)]
    body.append(f"  ROOT %r = f32[1024]{{0}} exponential(%x{n})")
    _, m, p = _run(entry_module("\n".join(body), "x0: f32[1024]", "f32[1024]"))
    assert len(_fusions(m)) == 1
    assert len(calls) < 5 * n  # incremental: a full rescan per fusion would be ~n*n/2
    gains = [e.gain_us for e in p.explanations if e.taken and e.gain_us is not None]
    assert gains and gains[0] == max(gains)


def test_explanations_come_back_in_the_result_and_the_pass_keeps_none():
    m = hlo.parse(CHAIN)
    pipeline = Pipeline.parse("priority-fusion")
    result = pipeline.run(m)
    lines = explain_lines(result)
    assert lines == result.explain_lines() == result.records[0].explain_lines()
    assert any("fused %t" in line and "modeled gain" in line for line in lines)
    assert any("refused %d" in line and "dot is not fusible" in line for line in lines)
    assert "_deprecated_last_result" not in vars(pipeline.passes[0])  # a pipeline run leaves nothing on the pass
    other = hlo.parse(CHAIN)
    again = pipeline.run(other)  # the same pass objects, another module: a result of its own
    assert again.explain_lines() == lines and result.explain_lines() == lines
    direct = PriorityFusion().run_with_result(hlo.parse(CHAIN))
    assert direct.explain_lines() == lines and explain_lines(direct) == lines


def test_deprecated_explanation_readers():
    p = PriorityFusion()
    assert p.run(hlo.parse(CHAIN)) is True
    with pytest.deprecated_call():
        lines = p.explain_lines()
    with pytest.deprecated_call():
        assert [str(e) for e in p.explanations] == lines == explain_lines(p)
    assert any("fused %t" in line for line in lines)
    for gone in (hlo.parse(CHAIN), Pipeline.parse("priority-fusion"), None):
        with pytest.raises(TypeError, match="result.explain_lines"):
            explain_lines(gone)


def test_other_devices_and_fallback_roofline():
    for device in ("h200", "b200", "a100"):
        before, m, _ = _run(CHAIN, device=device)
        assert any("negate" in _fused_opcodes(f) for f in _fusions(m))
    from hlopt.passes.fusion.fusion_utils import FusionCostModel

    cost = FusionCostModel("h100")
    assert cost.kernel_time_us(0, 0, 3.35232e12) == pytest.approx(1e6 + cost.launch_us, rel=1e-3)


def test_one_pipeline_runs_on_several_modules_at_once():
    # a pass keeps nothing of a run (the per-run state lives in the run's FusionRun): the same pass objects
    # run on four modules in four threads, switching every few bytecodes, give what one run alone gives
    import sys
    import threading

    body = ["  %x0 = f32[64,256]{1,0} parameter(0)", "  %zero = f32[] constant(0)"]
    for i in range(40):
        body += [f"  %n{i} = f32[64,256]{{1,0}} negate(%x{i})",
                 f"  %r{i} = f32[64]{{0}} reduce(%n{i}, %zero), dimensions={{1}}, to_apply=%sum",
                 f"  %b{i} = f32[64,256]{{1,0}} broadcast(%r{i}), dimensions={{0}}",
                 f"  %x{i + 1} = f32[64,256]{{1,0}} add(%n{i}, %b{i})"]
    body.append("  ROOT %out = f32[64,256]{1,0} exponential(%x40)")
    text = entry_module("\n".join(body), "x0: f32[64,256]", "f32[64,256]")
    pipeline = Pipeline.parse("fusion")
    alone = hlo.parse(text)
    expected_lines = pipeline.run(alone).explain_lines()
    modules = [hlo.parse(text) for _ in range(4)]
    results: list = [None] * 4

    def work(i: int) -> None:
        results[i] = pipeline.run(modules[i])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert all(m.to_text() == alone.to_text() for m in modules)
    assert all(r.explain_lines() == expected_lines for r in results)


def _scatter_module(dims_to_operand: str = "0,2,1", inserted: str = "") -> str:
    """A scatter whose indices (a concatenate of two columns) and updates (a scaled value) have producers,
    in ScatterSimplifier's form except, optionally, for `scatter_dims_to_operand_dims` and inserted dims."""
    window = "1,2,3" if not inserted else "1,2"
    upd = "f32[8,1,1,1]" if not inserted else "f32[8,1,1]"
    return entry_module(f"""  %z = f32[] constant(0)
  %buf = f32[4,6,6]{{2,1,0}} broadcast(%z), dimensions={{}}
  %i0 = s32[8,1]{{1,0}} parameter(0)
  %i1 = s32[8,2]{{1,0}} parameter(1)
  %idx = s32[8,3]{{1,0}} concatenate(%i0, %i1), dimensions={{1}}
  %u = {upd}{{{'3,2,1,0' if not inserted else '2,1,0'}}} parameter(2)
  %two = f32[] constant(2)
  %twob = {upd} broadcast(%two), dimensions={{}}
  %scaled = {upd} multiply(%u, %twob)
  ROOT %s = f32[4,6,6]{{2,1,0}} scatter(%buf, %idx, %scaled), update_window_dims={{{window}}}, inserted_window_dims={{{inserted}}}, scatter_dims_to_operand_dims={{{dims_to_operand}}}, index_vector_dim=1, to_apply=%sum""",
                   f"i0: s32[8,1], i1: s32[8,2], u: {upd}", "f32[4,6,6]")


SCATTER_PERMUTED = _scatter_module()


def test_scatter_with_permuted_index_map_takes_its_index_and_update_producers():
    """XLA's ScatterSimplifier (and its scatter emitter) take any `scatter_dims_to_operand_dims` permutation:
    such a scatter fuses its indices' and updates' producers, never its in-place operand."""
    _, m, _ = _run(SCATTER_PERMUTED)
    root = m.entry.root
    assert root.opcode == "fusion" and str(root.attrs["kind"]) == "kInput"
    body = _fused_opcodes(root)
    assert "scatter" in body and "concatenate" in body and "multiply" in body
    assert root.attrs["calls"].root.operand(0).opcode == "parameter"  # the buffer is updated in place


def test_scatter_with_inserted_window_dims_fuses_as_in_xla():
    """XLA's PriorityFusion takes any scatter (its ScatterSimplifier runs before): alone, priority-fusion fuses
    one with inserted window dims; after `scatter-simplifier` (the `fusion` pipeline) the canonical one."""
    for pre in ("", "scatter-simplifier"):
        _, m, _ = _run(_scatter_module("0,1,2", "0"), pre=pre)
        root = m.entry.root
        assert root.opcode == "fusion" and str(root.attrs["kind"]) == "kInput"
        assert {"scatter", "concatenate", "multiply"} <= set(_fused_opcodes(root))
        assert root.attrs["calls"].root.attrs["inserted_window_dims"] == (() if pre else (0,))


def test_a_bitcast_that_changes_the_bit_width_is_not_fused():
    # XLA's IsFusible takes a bitcast only when it keeps the element bit width (KeepsBitwidth): the s8 -> s16
    # view stays outside fusions, and it is a consumer `%n` cannot fuse into, so `%n` fuses into neither user
    text = entry_module("""  %p = s8[3,5,2]{2,1,0} parameter(0)
  %n = s8[3,5,2]{2,1,0} negate(%p)
  %b = s16[3,5]{1,0} bitcast(%n)
  %m = s16[3,5]{1,0} multiply(%b, %b)
  %a = s8[3,5,2]{2,1,0} add(%n, %n)
  ROOT %r = (s16[3,5]{1,0}, s8[3,5,2]{2,1,0}) tuple(%m, %a)""", "p: s8[3,5,2]", "(s16[3,5], s8[3,5,2])")
    _, m, result = _run(text)
    assert not result.changed and not _fusions(m)
    assert any("refused %n" in line and "bitcast" in line for line in result.explain_lines())
    # a bitcast that keeps the width (s8 -> u8) fuses into its user, and the negate into both of its users
    _, m, result = _run(text.replace("s16[3,5]{1,0}", "u8[3,5,2]{2,1,0}").replace("s16[3,5]", "u8[3,5,2]"))
    assert result.changed and {op for f in _fusions(m) for op in _fused_opcodes(f)} == {
        "negate", "bitcast", "multiply", "add"}
    assert m.entry.root.opcode == "tuple" and all(op.opcode == "fusion" for op in m.entry.root.operands)


#: exp(add(transpose(neg(x)), y)): XLA's FindNonTrivialHero looks through elementwise ops of up to three operands
#: for a tiled transpose, so this runs the transpose emitter, a kInput fusion
TRANSPOSE_EPILOGUE = entry_module("""  %x = f32[256,512]{1,0} parameter(0)
  %y = f32[512,256]{1,0} parameter(1)
  %n = f32[256,512]{1,0} negate(%x)
  %t = f32[512,256]{1,0} transpose(%n), dimensions={1,0}
  %a = f32[512,256]{1,0} add(%t, %y)
  ROOT %e = f32[512,256]{1,0} exponential(%a)""", "x: f32[256,512], y: f32[512,256]", "f32[512,256]")


def test_a_loop_epilogue_reading_a_transpose_is_a_transpose_fusion():
    text = TRANSPOSE_EPILOGUE
    _, m, _ = _run(text)
    (fusion,) = _fusions(m)
    assert _fused_opcodes(fusion) == ["negate", "transpose", "add", "exponential"]
    assert str(fusion.attrs["kind"]) == "kInput"
    # a transpose that something else than elementwise ops reads on the way to the root is no hero
    m = hlo.parse(text.replace("ROOT %e = f32[512,256]{1,0} exponential(%a)",
                               "%e = f32[512,256]{1,0} exponential(%a)\n"
                               "  ROOT %s = f32[512,128]{1,0} slice(%e), slice={[0:512], [0:128]}"
                               ).replace("-> f32[512,256]", "-> f32[512,128]"))
    e = m.entry.instruction("e")
    assert non_trivial_hero(e) is e and non_trivial_hero(m.entry.root) is m.entry.root
    m = hlo.parse(text)
    assert non_trivial_hero(m.entry.root) is m.entry.instruction("t")


def _layers(n: int) -> str:
    """`n` layers of one block (a row softmax-like reduction, a shared mask, a transpose, a small constant, a
    value read twice, a dot with a bias add), each reading the one before: the repeats the queue's memo by
    structure answers. Every other layer reads a value twice where the others read two, every third reads
    its producer's operand: the same instructions read the same way or not. A broadcast every layer reads
    has more users than a key is made for."""
    lines = ["  %h0 = f32[64,256]{1,0} parameter(0)", "  %w = f32[256,256]{1,0} parameter(1)",
             "  %mask = f32[64,256]{1,0} parameter(2)", "  %zero = f32[] constant(0)", "  %half = f32[] constant(0.5)",
             "  %hs = f32[64,256]{1,0} broadcast(%half), dimensions={}"]
    for i in range(n):
        h = f"%h{i}"
        lines += [
            f"  %hh{i} = f32[64,256]{{1,0}} multiply({h}, %hs)",
            f"  %e{i} = f32[64,256]{{1,0}} exponential(%hh{i})",
            f"  %m{i} = f32[64,256]{{1,0}} multiply(%e{i}, %mask)",
            f"  %rs{i} = f32[64]{{0}} reduce(%m{i}, %zero), dimensions={{1}}, to_apply=%sum",
            f"  %b{i} = f32[64,256]{{1,0}} broadcast(%rs{i}), dimensions={{0}}",
            f"  %q{i} = f32[64,256]{{1,0}} divide(%m{i}, {'%b' if i % 2 else '%m'}{i})",
            f"  %hb{i} = f32[64,256]{{1,0}} broadcast(%half), dimensions={{}}",
            f"  %sq{i} = f32[64,256]{{1,0}} multiply(%q{i}, %q{i})",
            f"  %t{i} = f32[256,64]{{1,0}} transpose(%sq{i}), dimensions={{1,0}}",
            f"  %tb{i} = f32[64,256]{{1,0}} bitcast(%t{i})",
            f"  %d{i} = f32[64,256]{{1,0}} dot(%q{i}, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}",
            f"  %bias{i} = f32[64,256]{{1,0}} add(%d{i}, %mask)",
            f"  %g{i} = f32[64,256]{{1,0}} multiply(%bias{i}, {'%hb' + str(i) if i % 3 else '%mask'})",
            f"  %h{i + 1} = f32[64,256]{{1,0}} add(%g{i}, %tb{i})",
        ]
    lines.append(f"  ROOT %out = f32[64,256]{{1,0}} tanh(%h{n})")
    return entry_module("\n".join(lines), "h0: f32[64,256], w: f32[256,256], mask: f32[64,256]", "f32[64,256]")


def test_the_memo_by_structure_changes_no_decision(monkeypatch):
    """Priorities, kernel times and merged profiles remembered by structure (`_Queue.memo_by_structure`) give
    the module and the explanations that computing every one gives, to the last bit, and the repeats hit."""
    import hlopt.passes.fusion.priority_fusion as pf

    text = _layers(12)
    computed = []
    original = pf._Queue._priority  # noqa: SLF001 (deliberately pokes internals)

    def counting(self, producer, *key):
        computed.append(producer.name)
        return original(self, producer, *key)

    monkeypatch.setattr(pf._Queue, "_priority", counting)  # noqa: SLF001
    outputs = []
    for memo in (False, True):
        monkeypatch.setattr(pf._Queue, "memo_by_structure", memo)  # noqa: SLF001
        computed.clear()
        m = hlo.parse(text)
        result = PriorityFusion().run_with_result(m)
        exact = [(e.producer, e.consumers, e.taken, e.reason, e.gain_us, e.before_us, e.after_us) for e in
                 result.explanations]
        outputs.append((m.to_text(), exact, len(computed)))
    (off_text, off_exact, off_computed), (on_text, on_exact, on_computed) = outputs
    assert len(_fusions(hlo.parse(on_text))) > 12
    assert on_text == off_text
    assert on_exact == off_exact
    assert on_computed < off_computed / 3  # the later layers are answered from the memo


def _stays_layers(n: int) -> str:
    """`n` layers where a producer fuses into its one consumer: in every other layer it also has a bitcast user
    (read by a dot: it stays, as XLA leaves bitcasts out), in every third its consumer reads its operand too, in every fourth
    a small constant of another value: the never-slower check of the same classes on other wiring."""
    lines = ["  %h0 = f32[64,256]{1,0} parameter(0)", "  %y = f32[64,256]{1,0} parameter(1)",
             "  %k = f32[64,64]{1,0} parameter(2)", "  %two = f32[] constant(2)", "  %three = f32[] constant(3)"]
    for i in range(n):
        h = f"%h{i}"
        lines += [f"  %c{i} = f32[64,256]{{1,0}} broadcast({'%three' if i % 4 == 3 else '%two'}), dimensions={{}}",
                  f"  %e{i} = f32[64,256]{{1,0}} exponential({h})",
                  f"  %a{i} = f32[64,256]{{1,0}} add(%e{i}, {h if i % 3 == 2 else '%y'})",
                  f"  %m{i} = f32[64,256]{{1,0}} multiply(%a{i}, %c{i})"]
        if i % 2:
            lines += [f"  %v{i} = f32[256,64]{{1,0}} bitcast(%e{i})",
                      f"  %d{i} = f32[256,64]{{1,0}} dot(%v{i}, %k), lhs_contracting_dims={{1}}, "
                      "rhs_contracting_dims={0}",
                      f"  %w{i} = f32[64,256]{{1,0}} bitcast(%d{i})",
                      f"  %h{i + 1} = f32[64,256]{{1,0}} add(%m{i}, %w{i})"]
        else:
            lines.append(f"  %h{i + 1} = f32[64,256]{{1,0}} negate(%m{i})")
    lines.append(f"  ROOT %out = f32[64,256]{{1,0}} tanh(%h{n})")
    return entry_module("\n".join(lines), "h0: f32[64,256], y: f32[64,256], k: f32[64,64]", "f32[64,256]")


def test_the_check_memo_keys_wiring_and_bitcast_users(monkeypatch):
    """The never-slower check remembered by the producer's key (`_Queue.check_key`) tells a producer that stays
    for a bitcast user, or whose consumer reads its operand too, from one that does not: the module and the
    explanations (the check's times included) are those of computing every check."""
    import hlopt.passes.fusion.priority_fusion as pf

    text = _stays_layers(12)
    outputs = []
    for memo in (False, True):
        monkeypatch.setattr(pf._Queue, "memo_by_structure", memo)  # noqa: SLF001
        m = hlo.parse(text)
        result = PriorityFusion().run_with_result(m)
        exact = [(e.producer, e.consumers, e.taken, e.reason, e.gain_us, e.before_us, e.after_us) for e in
                 result.explanations]
        outputs.append((m.to_text(), exact))
    assert outputs[0][0] == outputs[1][0]
    assert outputs[0][1] == outputs[1][1]
    assert any(e[5] is not None for e in outputs[1][1])  # the check ran
