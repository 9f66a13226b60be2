"""priority-fusion, numerics: the tests that run modules on XLA (before and after, same inputs);
the structure checks without jax are in test_priority_fusion.py."""

from __future__ import annotations

import pytest
from fusion_cases import entry_module
from hlopt.corpus.programs import corpus_texts
from hlopt.passes.framework.pipeline import Pipeline, run_pipeline
from test_priority_fusion import (  # the module texts and helpers the structure tests use
    CHAIN,
    SCATTER_PERMUTED,
    SELECT_SCATTER,
    SUM,
    TRANSPOSE_EPILOGUE,
    _fused_opcodes,
    _fusions,
    _run,
)

from hlopt import hlo, runtime


def test_elementwise_chain_fuses_into_reduction_dot_stays():
    before, m, _ = _run(CHAIN)
    ops = [i.opcode for i in m.entry.instructions]
    assert "dot" in ops and "negate" not in ops and "reduce" not in ops
    red = next(f for f in _fusions(m) if "reduce" in _fused_opcodes(f))
    assert str(red.attrs["kind"]) == "kInput" and "negate" in _fused_opcodes(red)
    assert all("dot" not in _fused_opcodes(f) for f in _fusions(m))
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok


def test_producer_duplicated_into_every_fusible_consumer():
    text = entry_module("""  %x = f32[4096]{0} parameter(0)
  %y = f32[4096]{0} parameter(1)
  %e = f32[4096]{0} exponential(%x)
  %u = f32[4096]{0} add(%e, %y)
  %v = f32[4096]{0} multiply(%e, %y)
  ROOT %o = (f32[4096]{0}, f32[4096]{0}) tuple(%u, %v)""", "x: f32[4096], y: f32[4096]", "(f32[4096], f32[4096])")
    before, m, _ = _run(text)
    assert "exponential" not in [i.opcode for i in m.entry.instructions]
    assert sum("exponential" in _fused_opcodes(f) for f in _fusions(m)) == 2
    assert runtime.run_and_compare(before, m).ok


def test_root_is_never_a_producer_and_names_follow_xla():
    text = entry_module("""  %x = f32[1024]{0} parameter(0)
  %n = f32[1024]{0} negate(%x)
  ROOT %e = f32[1024]{0} exponential(%n)""", "x: f32[1024]", "f32[1024]")
    before, m, _ = _run(text)
    (f,) = _fusions(m)
    assert m.entry.root is f and f.name == "fusion" and str(f.attrs["kind"]) == "kLoop"
    comp = f.attrs["calls"]
    assert comp.name == "fused_computation" and [p.name.split(".")[0] for p in comp.parameters] == ["param_0"]
    assert "kind=kLoop, calls=%fused_computation" in m.to_text()
    assert runtime.run_and_compare(before, m).ok


def test_no_reduce_into_reduce():
    text = entry_module("""  %x = f32[64,64]{1,0} parameter(0)
  %z = f32[] constant(0)
  %r1 = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum
  ROOT %r2 = f32[] reduce(%r1, %z), dimensions={0}, to_apply=%sum""", "x: f32[64,64]", "f32[]")
    before, m, p = _run(text)
    assert sum("reduce" in _fused_opcodes(f) for f in _fusions(m)) == 2
    assert any("contain a reduce" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m).ok


def test_reduction_takes_unary_epilogue_but_not_a_loop_one():
    text = entry_module("""  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64]{0} parameter(1)
  %z = f32[] constant(0)
  %r = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum
  %c = bf16[64]{0} convert(%r)
  %r2 = f32[64]{0} reduce(%x, %z), dimensions={1}, to_apply=%sum
  %a = f32[64]{0} add(%r2, %y)
  ROOT %o = (bf16[64]{0}, f32[64]{0}) tuple(%c, %a)""", "x: f32[64,256], y: f32[64]", "(bf16[64], f32[64])")
    before, m, p = _run(text)
    epilogue = next(f for f in _fusions(m) if "convert" in _fused_opcodes(f))
    assert "reduce" in _fused_opcodes(epilogue) and str(epilogue.attrs["kind"]) == "kInput"
    assert any("into a loop fusion" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m).ok


def test_expensive_producer_not_recomputed_for_reused_elements():
    # a nested (non-contiguous) reduction of 256 inputs per output, then broadcast: fusing would redo it
    text = entry_module("""  %x = f32[4,16,4,16]{3,2,1,0} parameter(0)
  %z = f32[] constant(0)
  %r = f32[4,4]{1,0} reduce(%x, %z), dimensions={1,3}, to_apply=%sum
  %b = f32[4,4,512]{2,1,0} broadcast(%r), dimensions={0,1}
  ROOT %n = f32[4,4,512]{2,1,0} negate(%b)""", "x: f32[4,16,4,16]", "f32[4,4,512]")
    before, m, p = _run(text)
    assert any("recomputed" in line for line in p.explain_lines())
    assert not any({"reduce", "broadcast"} <= set(_fused_opcodes(f)) for f in _fusions(m))
    assert runtime.run_and_compare(before, m).ok


def test_in_place_update_keeps_its_buffer_unread():
    text = entry_module("""  %buf = f32[64,64]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %s = f32[8,64]{1,0} slice(%buf), slice={[8:16], [0:64]}
  %n = f32[8,64]{1,0} negate(%s)
  ROOT %u = f32[64,64]{1,0} dynamic-update-slice(%buf, %n, %i, %z)""", "buf: f32[64,64], i: s32[]", "f32[64,64]")
    before, m, p = _run(text)
    assert any("in place" in line for line in p.explain_lines())
    assert not any({"slice", "dynamic-update-slice"} <= set(_fused_opcodes(f)) for f in _fusions(m))
    assert runtime.run_and_compare(before, m).ok


def test_kinds_transpose_and_concatenate_are_input_fusions():
    text = entry_module("""  %x = f32[128,256]{1,0} parameter(0)
  %y = f32[64,64]{1,0} parameter(1)
  %n = f32[128,256]{1,0} negate(%x)
  %t = f32[256,128]{1,0} transpose(%n), dimensions={1,0}
  %e = f32[64,64]{1,0} exponential(%y)
  %c = f32[128,64]{1,0} concatenate(%e, %y), dimensions={0}
  ROOT %o = (f32[256,128]{1,0}, f32[128,64]{1,0}) tuple(%t, %c)""", "x: f32[128,256], y: f32[64,64]",
                   "(f32[256,128], f32[128,64])")
    before, m, _ = _run(text)
    kinds = {f.attrs["calls"].root.opcode: str(f.attrs["kind"]) for f in _fusions(m)}
    assert kinds == {"transpose": "kInput", "concatenate": "kInput"}
    assert runtime.run_and_compare(before, m).ok


def test_transpose_read_through_a_binary_op_is_a_transpose_fusion_that_computes_the_same():
    before, m, _ = _run(TRANSPOSE_EPILOGUE)
    assert [str(f.attrs["kind"]) for f in _fusions(m)] == ["kInput"]
    assert runtime.run_and_compare(before, m).ok


def test_existing_fusions_are_merged_not_nested():
    text = """HloModule nested

%f1 (p: f32[512]) -> f32[512] {
  %p = f32[512]{0} parameter(0)
  ROOT %e = f32[512]{0} exponential(%p)
}

%f2 (q: f32[512], r: f32[512]) -> f32[512] {
  %q = f32[512]{0} parameter(0)
  %r = f32[512]{0} parameter(1)
  ROOT %m = f32[512]{0} multiply(%q, %r)
}

ENTRY %main (x: f32[512], y: f32[512]) -> f32[512] {
  %x = f32[512]{0} parameter(0)
  %y = f32[512]{0} parameter(1)
  %a = f32[512]{0} fusion(%x), kind=kLoop, calls=%f1
  ROOT %b = f32[512]{0} fusion(%a, %y), kind=kLoop, calls=%f2
}
"""
    before, m, _ = _run(text)
    (f,) = _fusions(m)
    assert sorted(_fused_opcodes(f)) == ["exponential", "multiply"]
    assert "f1" not in [c.name for c in m.computations]
    assert runtime.run_and_compare(before, m).ok


def test_loop_bodies_are_fused_reducers_are_not():
    text = """HloModule loop

""" + SUM + """
%cond (s: (s32[], f32[256])) -> pred[] {
  %s = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (s: (s32[], f32[256])) -> (s32[], f32[256]) {
  %s = (s32[], f32[256]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %v = f32[256]{0} get-tuple-element(%s), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %t = f32[256]{0} tanh(%v)
  %w = f32[256]{0} multiply(%t, %v)
  ROOT %r = (s32[], f32[256]{0}) tuple(%j, %w)
}

ENTRY %main (x: f32[256]) -> f32[] {
  %x = f32[256]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[256]{0}) tuple(%zero, %x)
  %loop = (s32[], f32[256]{0}) while(%init), condition=%cond, body=%body
  %v = f32[256]{0} get-tuple-element(%loop), index=1
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%v, %z), dimensions={0}, to_apply=%sum
}
"""
    before, m, _ = _run(text)
    body = m.computation("body")
    assert any(i.opcode == "fusion" and {"tanh", "multiply"} <= set(_fused_opcodes(i)) for i in body.instructions)
    assert [i.opcode for i in m.computation("sum").instructions] == ["parameter", "parameter", "add"]
    assert runtime.run_and_compare(before, m).ok


def test_vector_dot_is_strength_reduced_and_fused():
    # XLA:GPU's algebraic simplifier turns a vector x matrix dot into multiply + reduce before fusion;
    # left as a dot, XLA would rewrite it after our fusion with a broadcast its layout normalization rejects
    text = entry_module("""  %v = f32[4]{0} parameter(0)
  %w = f32[4,6]{1,0} parameter(1)
  %b = f32[6]{0} parameter(2)
  %d = f32[6]{0} dot(%v, %w), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %a = f32[6]{0} add(%d, %b)
  ROOT %t = f32[6]{0} tanh(%a)""", "v: f32[4], w: f32[4,6], b: f32[6]", "f32[6]")
    before, m, p = _run(text, pre="dot-strength-reduction")
    assert [r.name for r in p.records] == ["dot-strength-reduction", "priority-fusion"]
    assert "dot" not in [i.opcode for i in m.instructions()]
    (fusion,) = _fusions(m)
    assert {"broadcast", "multiply", "reduce", "add", "tanh"} <= set(_fused_opcodes(fusion))
    assert any("refused" not in line and "%d" in line and "strength reduction" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok


def test_batched_and_transposed_vector_dots_keep_their_values():
    text = entry_module("""  %x = f32[3,5,4]{2,1,0} parameter(0)
  %y = f32[3,4]{1,0} parameter(1)
  %m = f32[7,4]{1,0} parameter(2)
  %d = f32[3,5]{1,0} dot(%x, %y), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %e = f32[3,7]{1,0} dot(%y, %m), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  ROOT %o = (f32[3,5]{1,0}, f32[3,7]{1,0}) tuple(%d, %e)""", "x: f32[3,5,4], y: f32[3,4], m: f32[7,4]",
                   "(f32[3,5], f32[3,7])")
    before, m, _ = _run(text, pre="dot-strength-reduction")
    assert [i.opcode for i in m.instructions()].count("dot") == 1  # %e has no vector operand: a GEMM
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok
    _, kept, _ = _run(text)  # priority-fusion no longer rewrites dots itself
    assert [i.opcode for i in kept.instructions()].count("dot") == 2
    with pytest.deprecated_call():  # the old option still works, through the pass
        _, old, _ = _run(text, reduce_vector_dots=True)
    assert old.to_text() == m.to_text()


def test_tiny_loop_kernel_leaves_lanes_idle_so_math_joins_the_reduction():
    # XLA's ComputeTime counts min(threads per block, lanes): a 3-element loop kernel runs 3 threads, so
    # exp/log there cost ~40x more than inside the reduction's kernel (XLA fuses them there too)
    text = entry_module("""  %x = f32[3,4]{1,0} parameter(0)
  %y = f32[3]{0} parameter(1)
  %e = f32[3,4]{1,0} exponential(%x)
  %zero = f32[] constant(0)
  %r = f32[3]{0} reduce(%e, %zero), dimensions={1}, to_apply=%sum
  %l = f32[3]{0} log(%r)
  ROOT %a = f32[3]{0} add(%l, %y)""", "x: f32[3,4], y: f32[3]", "f32[3]")
    before, m, p = _run(text)
    red = next(f for f in _fusions(m) if "reduce" in _fused_opcodes(f))
    assert {"exponential", "log"} <= set(_fused_opcodes(red))
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok


def test_gemm_bias_add_is_left_for_the_gemm_epilogue():
    # XLA:GPU's GemmRewriter folds add(dot, broadcast(bias)) and add(dot, matrix) into the cuBLAS call
    # before fusing; fused into a loop kernel here, the add would cost XLA an extra pass over the output
    text = entry_module("""  %x = f32[64,128]{1,0} parameter(0)
  %w = f32[128,256]{1,0} parameter(1)
  %b = f32[256]{0} parameter(2)
  %r = f32[64,256]{1,0} parameter(3)
  %w2 = f32[256,256]{1,0} parameter(4)
  %d = f32[64,256]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %bb = f32[64,256]{1,0} broadcast(%b), dimensions={1}
  %a = f32[64,256]{1,0} add(%d, %bb)
  %t = f32[64,256]{1,0} tanh(%a)
  %e = f32[64,256]{1,0} dot(%t, %w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %s = f32[64,256]{1,0} add(%r, %e)
  ROOT %n = f32[64,256]{1,0} negate(%s)""",
                   "x: f32[64,128], w: f32[128,256], b: f32[256], r: f32[64,256], w2: f32[256,256]", "f32[64,256]")
    before, m, p = _run(text)
    for name in ("a", "s"):  # vector and matrix bias adds stay, with their dot as only operand user
        add = m.entry.instruction(name)
        assert add.opcode == "add" and "dot" in {o.opcode for o in add.operands}
        assert any(f"refused %{name}:" in line and "is not fusible" in line for line in p.explain_lines())
    assert m.entry.instruction("bb").opcode == "broadcast"  # XLA elides it into the BIAS epilogue
    assert runtime.run_and_compare(before, m, rtol=1e-4, atol=1e-4).ok


def test_iota_shared_with_a_sort_still_fuses_into_its_other_consumers():
    # XLA:GPU's SortIotaFusion gives the sort its own copy of the iota, so the sort does not keep the
    # iota out of the argmax reduce fusion
    text = entry_module("""  %k = s32[64]{0} parameter(0)
  %i = s32[64]{0} iota(), iota_dimension=0
  %s = (s32[64]{0}, s32[64]{0}) sort(%k, %i), dimensions={0}, is_stable=true, to_apply=%lt
  %p = s32[64]{0} get-tuple-element(%s), index=1
  %m = s32[64]{0} multiply(%k, %i)
  ROOT %o = (s32[64]{0}, s32[64]{0}) tuple(%p, %m)""", "k: s32[64]", "(s32[64], s32[64])", extra="""
%lt (a: s32[], b: s32[], c: s32[], d: s32[]) -> pred[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %r = pred[] compare(%a, %b), direction=LT
}
""")
    before, m, _ = _run(text)
    (fusion,) = _fusions(m)
    assert "iota" in _fused_opcodes(fusion)
    assert m.entry.instruction("i").opcode == "iota" and [u.opcode for u in m.entry.instruction("i").users] == ["sort"]
    assert runtime.run_and_compare(before, m, rtol=0, atol=0).ok


def test_select_and_scatter_is_expanded_and_fused():
    # XLA:GPU expands select-and-scatter before fusing (iotas into the reduce-window, the index
    # concatenate into the scatter); relu zeros make ties (the first element wins) and the padded,
    # overlapping windows check that padding is never selected
    text = entry_module("""  %x = f32[2,7,7]{2,1,0} parameter(0)
  %g = f32[2,4,4]{2,1,0} parameter(1)
  %zero = f32[] constant(0)
  %zeros = f32[2,7,7]{2,1,0} broadcast(%zero), dimensions={}
  %r = f32[2,7,7]{2,1,0} maximum(%x, %zeros)
  ROOT %s = f32[2,7,7]{2,1,0} select-and-scatter(%r, %g, %zero), window={size=1x3x3 stride=1x2x2 pad=0_0x1_1x1_1}, select=%ge, scatter=%sum""",
                   "x: f32[2,7,7], g: f32[2,4,4]", "f32[2,7,7]", extra=SELECT_SCATTER)
    before, m, p = _run(text, pre="select-and-scatter-expander")
    ops = [i.opcode for i in m.entry.instructions]
    assert "select-and-scatter" not in ops and "iota" not in ops and "concatenate" not in ops
    scatter = next(f for f in _fusions(m) if "scatter" in _fused_opcodes(f))
    assert "concatenate" in _fused_opcodes(scatter) and str(scatter.attrs["kind"]) == "kInput"
    window = next(f for f in _fusions(m) if "reduce-window" in _fused_opcodes(f))
    assert _fused_opcodes(window).count("iota") == 3
    assert any("SelectAndScatterExpander" in line for line in p.explain_lines())
    assert runtime.run_and_compare(before, m, rtol=1e-5, atol=1e-5).ok
    _, kept, _ = _run(text)  # priority-fusion no longer expands select-and-scatter itself
    assert "select-and-scatter" in [i.opcode for i in kept.entry.instructions]
    with pytest.deprecated_call():
        _, old, _ = _run(text, expand_select_and_scatter=True)
    assert old.to_text() == m.to_text()


def test_xla_cpu_keeps_our_loop_fusions():
    m = hlo.parse(entry_module("""  %x = f32[128]{0} parameter(0)
  %y = f32[128]{0} parameter(1)
  %a = f32[128]{0} add(%x, %y)
  %n = f32[128]{0} negate(%a)
  ROOT %t = f32[128]{0} multiply(%n, %x)""", "x: f32[128], y: f32[128]", "f32[128]"))
    before = m.clone()
    run_pipeline(m, "priority-fusion")
    (fusion,) = _fusions(m)
    assert str(fusion.attrs["kind"]) == "kLoop"
    exe = runtime.compile(m, keep_fusions=True)
    compiled = exe.compiled_text()
    assert "kind=kLoop" in compiled and "negate(" in compiled and "multiply(" in compiled
    inputs = runtime.random_inputs(before)
    assert runtime.compare(runtime.execute(before, inputs), exe.execute(inputs)).ok


@pytest.mark.parametrize("entry", corpus_texts(), ids=[e.id for e in corpus_texts()])
def test_corpus_fused_runs_the_same(entry):
    if entry.reentry_refused:
        pytest.skip(entry.reentry_refused)
    before = hlo.parse(entry.text)
    after = before.clone()
    run_pipeline(after, "call-inliner,simplify,priority-fusion")
    result = runtime.run_and_compare(before, after, rtol=1e-4, atol=1e-5)
    assert result.ok, str(result)


def test_scatter_with_permuted_index_map_fused_computes_the_same():
    """In-range indices (the scatter is defined for any, but clamped windows keep the test meaningful)."""
    import numpy as np

    before, m, _ = _run(SCATTER_PERMUTED)
    assert m.entry.root.opcode == "fusion"
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 4, (8, 1)).astype(np.int32), rng.integers(0, 6, (8, 2)).astype(np.int32),
              rng.standard_normal((8, 1, 1, 1)).astype(np.float32)]
    assert runtime.run_and_compare(before, m, inputs=inputs, rtol=1e-5, atol=1e-5).ok


@pytest.mark.slow
def test_20k_instruction_transformer_step_fuses_and_verifies():
    """(jax builds the module: it lives here, beside the tests that run XLA.)"""
    from hlopt.corpus.transformer import module_of_size

    text, _ = module_of_size(20_000)
    m = hlo.parse(text)
    Pipeline.parse("priority-fusion", check_changed=False).run(m)
    hlo.verify(m)
    assert sum(1 for i in m.entry.instructions if i.opcode == "fusion") > 1000
