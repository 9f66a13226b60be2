"""dce, cse, tuple-simplifier, algebraic-simplifier: the module texts, and the checks by structure alone (no
jax). Every rewrite run on XLA CPU (before vs after, same inputs) and every pass over the test corpus:
test_simplifiers_numerics.py."""

from __future__ import annotations

import numpy as np
import pytest
from hlopt.passes.framework.pipeline import run_pipeline

from hlopt import hlo

SIMPLIFY = "call-inliner,fix(algebraic-simplifier,tuple-simplifier,cse,dce)"


def _ops(m: hlo.Module) -> list[str]:
    return [i.opcode for i in m.entry.instructions]


def _same_bits(expected: list[np.ndarray], actual: list[np.ndarray]) -> None:
    """Equal element for element, bit for bit (so -0.0 != 0.0), any NaN equal to any NaN."""
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert e.dtype == a.dtype and e.shape == a.shape, i
        if e.dtype.kind == "f" or e.dtype.name in ("bfloat16", "float16"):
            both_nan = np.isnan(e.astype(np.float64)) & np.isnan(a.astype(np.float64))
            same = (e.view(f"u{e.dtype.itemsize}") == a.view(f"u{a.dtype.itemsize}")) | both_nan
            assert same.all(), (i, e, a)
        else:
            assert np.array_equal(e, a), (i, e, a)


# ----------------------------------------------------------------------------- dce

DCE = """
HloModule dce

%pure (a: f32[4]) -> f32[4] {
  %a = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%a)
}

%noisy (b: f32[4]) -> f32[4] {
  %b = f32[4] parameter(0)
  %tok = token[] after-all()
  %o = token[] outfeed(%b, %tok), outfeed_shape=f32[4]
  ROOT %e = f32[4] exponential(%b)
}

%unused (c: f32[4]) -> f32[4] {
  ROOT %c = f32[4] parameter(0)
}

ENTRY %main (p: f32[4], q: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %dead1 = f32[4] exponential(%q)
  %dead2 = f32[4] add(%dead1, %p)
  %dead_call = f32[4] call(%p), to_apply=%pure
  %noisy_call = f32[4] call(%p), to_apply=%noisy
  %side = f32[4] custom-call(%p), custom_call_target="foo", custom_call_has_side_effect=true
  %ordered = f32[4] sqrt(%q)
  %tail = f32[4] abs(%q), control-predecessors={%ordered}
  %kept = f32[4] custom-call(%p), custom_call_target="Sharding", sharding={replicated}
  %e = f32[4] exponential(%q)
  %s = f32[4] custom-call(%e), custom_call_target="Sharding", sharding={replicated}
  ROOT %r = f32[4] negate(%p)
}
"""


COLLECTIVE = """
HloModule c, replica_count=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  %ar = f32[4] all-reduce(%p), channel_id=1, replica_groups={{0,1}}, to_apply=%sum
  %ar2 = f32[4] all-reduce(%p), replica_groups={{0,1}}, to_apply=%sum
  ROOT %r = f32[4] negate(%p)
}
"""


EFFECTS = """
HloModule e{header}

%sum (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%body (t: (f32[4], token[])) -> (f32[4], token[]) {{
  %t = (f32[4], token[]) parameter(0)
  %v = f32[4] get-tuple-element(%t), index=0
  %k = token[] get-tuple-element(%t), index=1
  %o = token[] outfeed(%v, %k), outfeed_shape=f32[4]
  ROOT %r = (f32[4], token[]) tuple(%v, %o)
}}

%cond (c: (f32[4], token[])) -> pred[] {{
  %c = (f32[4], token[]) parameter(0)
  ROOT %f = pred[] constant(false)
}}

ENTRY %main (p: f32[4]) -> f32[4] {{
  %p = f32[4] parameter(0)
  %ar = f32[4] all-reduce(%p), channel_id=1, replica_groups={{{{0,1}}}}, to_apply=%sum
  %cb = f32[4] collective-broadcast(%p), channel_id=2, replica_groups={{{{0,1}}}}
  %tok = token[] after-all()
  %init = (f32[4], token[]) tuple(%p, %tok)
  %w = (f32[4], token[]) while(%init), condition=%cond, body=%body
  ROOT %n = f32[4] negate(%p)
}}
"""


@pytest.mark.parametrize("header, channel_effect", [(", replica_count=2", True), (", num_partitions=2", False)])
def test_one_side_effect_rule_for_the_ir_and_dce(header, channel_effect):
    # XLA's HasSideEffect: collective-broadcast always, a channel all-reduce outside SPMD only, after-all
    # never; a while has its body's effects (HasSideEffectNoRecurse leaves them out)
    m = hlo.parse(EFFECTS.format(header=header))
    e = m.entry
    expected = {"ar": channel_effect, "cb": True, "tok": False, "w": True, "p": False}
    assert {name: e.instruction(name).has_side_effect for name in expected} == expected
    assert not e.instruction("w").has_side_effect_no_recurse
    run_pipeline(m, "dce")  # what has an effect stays (the while keeps its operands); the rest goes
    assert {i.name for i in e.instructions} == {"p", "cb", "tok", "init", "w", "n"} | ({"ar"} if channel_effect else set())


# ----------------------------------------------------------------------------- cse

CSE = """
HloModule cse

%r1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%r2 (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %t = f32[] add(%x, %y)
}

ENTRY %main (p: f32[4], q: f32[4]) -> (f32[4], f32[4], f32[], f32[], f32[4], f32[4], s32[4], s32[4], f32[4], f32[4], f32[4], f32[4]) {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %a1 = f32[4] add(%p, %q), metadata={op_name="one"}
  %a2 = f32[4] add(%q, %p), metadata={op_name="two"}
  %z1 = f32[] constant(0)
  %z2 = f32[] constant(0)
  %sum1 = f32[] reduce(%p, %z1), dimensions={0}, to_apply=%r1
  %sum2 = f32[] reduce(%p, %z2), dimensions={0}, to_apply=%r2
  %d1 = f32[4] subtract(%p, %q)
  %d2 = f32[4] subtract(%q, %p)
  %i1 = s32[4] iota(), iota_dimension=0
  %i2 = s32[4] iota(), iota_dimension=0
  %e1 = f32[4] exponential(%p), sharding={replicated}
  %e2 = f32[4] exponential(%p), sharding={maximal device=0}
  %l1 = f32[4] log(%q)
  %l2 = f32[4] log(%q), control-predecessors={%l1}
  ROOT %t = (f32[4], f32[4], f32[], f32[], f32[4], f32[4], s32[4], s32[4], f32[4], f32[4], f32[4], f32[4]) tuple(%a1, %a2, %sum1, %sum2, %d1, %d2, %i1, %i2, %e1, %e2, %l1, %l2)
}
"""


# ----------------------------------------------------------------------------- tuple-simplifier

TUPLES = """
HloModule tuples

ENTRY %main (p: f32[4], q: s32[2], r: (f32[4], s32[2])) -> (f32[4], s32[2], (f32[4], s32[2]), f32[4], (f32[4], s32[2])) {
  %p = f32[4] parameter(0)
  %q = s32[2] parameter(1)
  %r = (f32[4], s32[2]) parameter(2)
  %inner = (f32[4], s32[2]) tuple(%p, %q)
  %outer = ((f32[4], s32[2]), f32[4]) tuple(%inner, %p)
  %g = (f32[4], s32[2]) get-tuple-element(%outer), index=0
  %gg = s32[2] get-tuple-element(%g), index=1
  %e = f32[4] exponential(%p)
  %pair = (f32[4], f32[4]) tuple(%e, %e)
  %g0 = f32[4] get-tuple-element(%pair), index=0
  %x0 = f32[4] get-tuple-element(%r), index=0
  %x1 = s32[2] get-tuple-element(%r), index=1
  %whole = (f32[4], s32[2]) tuple(%x0, %x1)
  %swapped = (s32[2], f32[4]) tuple(%x1, %x0)
  %n = f32[4] negate(%p)
  %h = f32[4] get-tuple-element(%swapped), index=1, control-predecessors={%n}
  ROOT %t = (f32[4], s32[2], (f32[4], s32[2]), f32[4], (f32[4], s32[2])) tuple(%g0, %gg, %whole, %h, %g)
}
"""


# ----------------------------------------------------------------------------- algebraic-simplifier

IDENTITIES = """
HloModule ids

ENTRY %main (p: f32[4], i: s32[4], b: pred[4], m: f32[2,3]) -> (f32[4], f32[4], f32[4], f32[4], f32[4], s32[4], s32[4], s32[4], pred[4], pred[4], f32[4], f32[4], s32[4], f32[3,2], f32[2,3]) {
  %p = f32[4] parameter(0)
  %i = s32[4] parameter(1)
  %b = pred[4] parameter(2)
  %m = f32[2,3] parameter(3)
  %zero = f32[] constant(0)
  %zeros = f32[4] broadcast(%zero), dimensions={}
  %ones = f32[4] constant({1, 1, 1, 1})
  %izero = s32[] constant(0)
  %izeros = s32[4] broadcast(%izero), dimensions={}
  %true = pred[] constant(true)
  %trues = pred[4] broadcast(%true), dimensions={}
  %false = pred[] constant(false)
  %falses = pred[4] broadcast(%false), dimensions={}
  %add0 = f32[4] add(%zeros, %p)
  %sub0 = f32[4] subtract(%p, %zeros)
  %mul1 = f32[4] multiply(%ones, %p)
  %div1 = f32[4] divide(%p, %ones)
  %nn = f32[4] negate(f32[4] negate(%p))
  %imul0 = s32[4] multiply(%i, %izeros)
  %isub = s32[4] subtract(%i, %i)
  %ior = s32[4] or(%izeros, %i)
  %band = pred[4] and(%b, %trues)
  %bor = pred[4] or(%falses, %b)
  %fmul0 = f32[4] multiply(%p, %zeros)
  %fsub = f32[4] subtract(%p, %p)
  %max = s32[4] maximum(%i, %i)
  %tr = f32[3,2] transpose(%m), dimensions={1,0}
  %tr2 = f32[2,3] transpose(%tr), dimensions={1,0}
  %ptrue = pred[2,3] broadcast(%true), dimensions={}
  %sel = f32[2,3] select(%ptrue, %tr2, %m)
  ROOT %t = (f32[4], f32[4], f32[4], f32[4], f32[4], s32[4], s32[4], s32[4], pred[4], pred[4], f32[4], f32[4], s32[4], f32[3,2], f32[2,3]) tuple(%add0, %sub0, %mul1, %div1, %nn, %imul0, %isub, %ior, %band, %bor, %fmul0, %fsub, %max, %tr, %sel)
}
"""


SHAPES = """
HloModule shapes

ENTRY %main (p: f32[2,3], q: f32[6], s: s32[], v: f32[2,3], h: f16[4], w: f32[4]) -> (f32[6], f32[2,3], f32[6], f32[2,3,5], f32[2,1], f32[2,3], f32[2,3], f32[2,3]{0,1}, f32[2,3], f32[2,3], f16[4], f32[4], f32[2,3]) {
  %p = f32[2,3] parameter(0)
  %q = f32[6] parameter(1)
  %s = s32[] parameter(2)
  %v = f32[2,3] parameter(3)
  %h = f16[4] parameter(4)
  %w = f32[4] parameter(5)
  %r1 = f32[3,2] reshape(%p)
  %r2 = f32[6] reshape(%r1)
  %bc = f32[2,3] bitcast(%p)
  %cp = f32[2,3] copy(%p)
  %cv = f32[2,3] convert(%p)
  %q1 = f32[1,6] reshape(%q)
  %q2 = f32[6] reshape(%q1)
  %b1 = f32[2,3] broadcast(%p), dimensions={0,1}
  %b2 = f32[2,3,5] broadcast(%b1), dimensions={0,1}
  %sl = f32[2,3] slice(%p), slice={[0:2], [0:3]}
  %sl1 = f32[2,2] slice(%p), slice={[0:2], [1:3]}
  %sl2 = f32[2,1] slice(%sl1), slice={[0:2], [1:2]}
  %pd = f32[2,3] pad(%p, f32[] constant(0)), padding=0_0x0_0
  %rv = f32[2,3] reverse(%p), dimensions={}
  %layout = f32[2,3]{0,1} copy(%p)
  %ds = f32[2,3] dynamic-slice(%p, %s, %s), dynamic_slice_sizes={2,3}
  %dus = f32[2,3] dynamic-update-slice(%p, %v, %s, %s)
  %up = f32[4] convert(%h)
  %down = f16[4] convert(%up)
  %lossy = f16[4] convert(%w)
  %lossy2 = f32[4] convert(%lossy)
  %rp = f32[2,3] reduce-precision(%p), exponent_bits=8, mantissa_bits=23
  ROOT %t = (f32[6], f32[2,3], f32[6], f32[2,3,5], f32[2,1], f32[2,3], f32[2,3], f32[2,3]{0,1}, f32[2,3], f32[2,3], f16[4], f32[4], f32[2,3]) tuple(%r2, %bc, %q2, %b2, %sl2, %sl, %pd, %layout, %ds, %dus, %down, %lossy2, %rp)
}
"""


DIVIDE_REDUCE = """
HloModule divide_reduce

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%add_s32 (a: s32[], b: s32[]) -> s32[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}

ENTRY %main (p: f32[2,4,16], q: f32[2,4,1], i: s32[4], h: f16[8]) -> (f32[2,4,16], f16[8], s32[4], f32[2,4], f32[16], f32[2,4], f32[2,4], f32[2], f32[2,4,1]) {
  %p = f32[2,4,16] parameter(0)
  %q = f32[2,4,1] parameter(1)
  %i = s32[4] parameter(2)
  %h = f16[8] parameter(3)
  %sixteen = f32[] constant(16)
  %b16 = f32[2,4,16] broadcast(%sixteen), dimensions={}
  %mean = f32[2,4,16] divide(%p, %b16)
  %three = f16[] constant(3)
  %b3 = f16[8] broadcast(%three), dimensions={}
  %third = f16[8] divide(%h, %b3)
  %two = s32[] constant(2)
  %b2 = s32[4] broadcast(%two), dimensions={}
  %idiv = s32[4] divide(%i, %b2)
  %zero = f32[] constant(0)
  %ninf = f32[] constant(-inf)
  %one = f32[] constant(1)
  %noop = f32[2,4] reduce(%q, %zero), dimensions={2}, to_apply=%add
  %sum = f32[16] reduce(%p, %zero), dimensions={0,1}, to_apply=%add
  %r3 = f32[1,1,16] reshape(%sum)
  %sum2 = f32[16] reduce(%r3, %zero), dimensions={0,1}, to_apply=%add
  %noop_max = f32[2,4] reduce(%q, %ninf), dimensions={2}, to_apply=%max
  %not_identity = f32[2,4] reduce(%q, %one), dimensions={2}, to_apply=%add
  %inner = f32[2,4] reduce(%p, %zero), dimensions={2}, to_apply=%add
  %outer = f32[2] reduce(%inner, %zero), dimensions={1}, to_apply=%add
  %sum_inner = f32[2,4,1] reduce(%q, %zero), dimensions={}, to_apply=%add
  ROOT %t = (f32[2,4,16], f16[8], s32[4], f32[2,4], f32[16], f32[2,4], f32[2,4], f32[2], f32[2,4,1]) tuple(%mean, %third, %idiv, %noop, %sum2, %noop_max, %not_identity, %outer, %sum_inner)
}
"""


MIN_MAX_COMPARE = """
HloModule min_max_compare

ENTRY %main (x: f32[8], i: s32[8]) -> (f32[8], f32[8], f32[8], pred[8], pred[8], s32[8], f32[8]) {
  %x = f32[8] parameter(0)
  %i = s32[8] parameter(1)
  %lo = f32[] constant(-1)
  %hi = f32[] constant(6)
  %blo = f32[8] broadcast(%lo), dimensions={}
  %bhi = f32[8] broadcast(%hi), dimensions={}
  %mn = f32[8] minimum(%x, %bhi)
  %relu6 = f32[8] maximum(%blo, %mn)
  %mx = f32[8] maximum(%blo, %x)
  %clip = f32[8] minimum(%mx, %bhi)
  %mn2 = f32[8] minimum(%x, %blo)
  %empty = f32[8] maximum(%bhi, %mn2)
  %zero = s32[] constant(0)
  %bz = s32[8] broadcast(%zero), dimensions={}
  %lt = pred[8] compare(%i, %bz), direction=LT
  %f = pred[] constant(false)
  %bf = pred[8] broadcast(%f), dimensions={}
  %ne = pred[8] compare(%lt, %bf), direction=NE
  %t = pred[] constant(true)
  %bt = pred[8] broadcast(%t), dimensions={}
  %eq = pred[8] compare(%bt, %lt), direction=EQ
  %three = s32[] constant(-3)
  %sign = s32[] sign(%three)
  %bs = s32[8] broadcast(%sign), dimensions={}
  %mz = f32[] constant(-0.0)
  %fsign = f32[] sign(%mz)
  %bfs = f32[8] broadcast(%fsign), dimensions={}
  ROOT %r = (f32[8], f32[8], f32[8], pred[8], pred[8], s32[8], f32[8]) tuple(%relu6, %clip, %empty, %ne, %eq, %bs, %bfs)
}
"""


def _fold_modules(cases: list[tuple]) -> tuple[str, str, list[np.ndarray]]:
    """For (result type, opcode, operand type, operand literals[, attrs]) cases: a module computing them on
    constants, the same module reading the operands from parameters, and those parameters' values."""
    from hlopt.hlo.literal import Literal
    from hlopt.hlo.shape import Shape

    const_lines, param_lines, params, inputs, outs, types = [], [], [], [], [], []
    for k, (out, op, ty, values, *attrs) in enumerate(cases):
        extra = ", " + attrs[0] if attrs else ""
        names = []
        for j, v in enumerate(values):
            name = f"a{k}_{j}"
            const_lines.append(f"  %{name} = {ty}[] constant({v})")
            param_lines.append(f"  %{name} = {ty}[] parameter({len(params)})")
            params.append(f"{name}: {ty}[]")
            inputs.append(Literal(v, Shape(ty, ())).to_numpy())
            names.append(f"%{name}")
        line = f"  %r{k} = {out}[] {op}({', '.join(names)}){extra}"
        const_lines.append(line)
        param_lines.append(line)
        outs.append(f"%r{k}")
        types.append(f"{out}[]")
    sig = ", ".join(types)
    tail = f"\n  ROOT %t = ({sig}) tuple({', '.join(outs)})\n}}\n"
    const = "HloModule fold\n\nENTRY %main () -> (" + sig + ") {\n" + "\n".join(const_lines) + tail
    param = (f"HloModule fold\n\nENTRY %main ({', '.join(params)}) -> ({sig}) {{\n" + "\n".join(param_lines)
             + tail)
    return const, param, inputs


FOLD_CASES = [
    ("s32", "add", "s32", ["2147483647", "1"]), ("s32", "subtract", "s32", ["-2147483648", "1"]),
    ("s32", "multiply", "s32", ["65536", "65537"]), ("s32", "divide", "s32", ["7", "2"]),
    ("s32", "divide", "s32", ["-7", "2"]), ("s32", "divide", "s32", ["7", "-2"]),
    ("s32", "divide", "s32", ["7", "0"]), ("s32", "divide", "s32", ["-2147483648", "-1"]),
    ("s32", "remainder", "s32", ["-7", "2"]), ("s32", "remainder", "s32", ["7", "-2"]),
    ("s32", "remainder", "s32", ["5", "0"]), ("s32", "remainder", "s32", ["-2147483648", "-1"]),
    ("s32", "maximum", "s32", ["-3", "2"]), ("s32", "minimum", "s32", ["-3", "2"]),
    ("s32", "and", "s32", ["-6", "13"]), ("s32", "or", "s32", ["-6", "13"]), ("s32", "xor", "s32", ["-6", "13"]),
    ("s32", "not", "s32", ["5"]), ("s32", "negate", "s32", ["-2147483648"]), ("s32", "abs", "s32", ["-2147483648"]),
    ("s8", "add", "s8", ["100", "100"]), ("s8", "multiply", "s8", ["-128", "-1"]),
    ("u32", "subtract", "u32", ["0", "1"]), ("u32", "divide", "u32", ["5", "0"]),
    ("u32", "remainder", "u32", ["5", "0"]), ("u32", "not", "u32", ["0"]), ("u8", "add", "u8", ["200", "100"]),
    ("s64", "multiply", "s64", ["4294967296", "4294967297"]),
    ("f32", "add", "f32", ["0.1", "0.2"]), ("f32", "divide", "f32", ["1", "0"]),
    ("f32", "divide", "f32", ["0", "0"]), ("f32", "divide", "f32", ["-1", "0"]),
    ("f32", "remainder", "f32", ["5.5", "-2"]), ("f32", "remainder", "f32", ["-5.5", "2"]),
    ("f32", "maximum", "f32", ["nan", "1"]), ("f32", "minimum", "f32", ["1", "nan"]),
    ("f32", "maximum", "f32", ["-0.0", "0"]), ("f32", "maximum", "f32", ["0", "-0.0"]),
    ("f32", "minimum", "f32", ["-0.0", "0"]), ("f32", "minimum", "f32", ["0", "-0.0"]),
    ("f32", "negate", "f32", ["0"]), ("f32", "abs", "f32", ["-0.0"]), ("f32", "multiply", "f32", ["-0.0", "5"]),
    ("f32", "subtract", "f32", ["0", "0"]), ("f32", "add", "f32", ["-0.0", "-0.0"]),
    ("f32", "multiply", "f32", ["3.4e38", "10"]),
    ("pred", "compare", "f32", ["nan", "nan"], "direction=EQ"), ("pred", "compare", "f32", ["nan", "nan"], "direction=NE"),
    ("pred", "compare", "f32", ["-0.0", "0"], "direction=LT"), ("pred", "compare", "f32", ["-0.0", "0"], "direction=EQ"),
    ("pred", "compare", "s32", ["-1", "1"], "direction=GT"), ("pred", "compare", "u32", ["4294967295", "1"], "direction=GT"),
    ("f16", "add", "f16", ["1", "0.0004"]), ("f16", "multiply", "f16", ["300", "300"]),
    ("f16", "divide", "f16", ["1", "3"]), ("bf16", "add", "bf16", ["1", "0.00390625"]),
    ("bf16", "multiply", "bf16", ["1.5", "1.5078125"]), ("f64", "add", "f64", ["0.1", "0.2"]),
    ("pred", "and", "pred", ["true", "false"]), ("pred", "or", "pred", ["true", "false"]),
    ("pred", "xor", "pred", ["true", "true"]), ("pred", "not", "pred", ["false"]),
    ("s32", "convert", "f32", ["3"]), ("s32", "convert", "f32", ["-0.0"]), ("f16", "convert", "s32", ["7"]),
    ("f16", "convert", "f32", ["nan"]), ("pred", "convert", "s32", ["-5"]), ("f32", "convert", "pred", ["true"]),
    ("s32", "convert", "f32", ["2.5"]), ("f32", "convert", "s32", ["16777217"]), ("f16", "convert", "f32", ["1e10"]),
    ("s8", "convert", "u8", ["255"]),
]
_NOT_FOLDED = 4  # the last four converts are inexact: left to XLA


_PASSES = ["dce", "cse", "tuple-simplifier", "algebraic-simplifier", SIMPLIFY]




def test_divide_by_constant_reciprocals_keep_their_sign_and_type():
    """x / c -> x * (1/c): the reciprocals and their literal texts are remembered by value (`_reciprocal`,
    `_scalar_literal`), never mixing 0.0 with -0.0 or one type's rounding with another's."""
    text = """HloModule recip

ENTRY %main (x: f32[4], h: bf16[4]) -> (f32[4], f32[4], f32[4], bf16[4], f32[4]) {
  %x = f32[4] parameter(0)
  %h = bf16[4] parameter(1)
  %z = f32[] constant(0)
  %nz = f32[] constant(-0.0)
  %three = f32[] constant(3)
  %bz = f32[4] broadcast(%z), dimensions={}
  %bnz = f32[4] broadcast(%nz), dimensions={}
  %b3 = f32[4] broadcast(%three), dimensions={}
  %h3 = bf16[] constant(3)
  %bh3 = bf16[4] broadcast(%h3), dimensions={}
  %d1 = f32[4] divide(%x, %bz)
  %d2 = f32[4] divide(%x, %bnz)
  %d3 = f32[4] divide(%x, %bz)
  %d4 = bf16[4] divide(%h, %bh3)
  %d5 = f32[4] divide(%x, %b3)
  ROOT %r = (f32[4], f32[4], f32[4], bf16[4], f32[4]) tuple(%d1, %d2, %d3, %d4, %d5)
}
"""
    for _ in range(2):  # the second module's reciprocals come from what the first remembered
        m = hlo.parse(text)
        run_pipeline(m, "algebraic-simplifier")
        factors = []
        for out in m.entry.root.operands:
            assert out.opcode == "multiply", out.to_text()
            factors.append(out.operand(1).operand(0).attrs["literal"].text)
        assert factors[:3] == ["inf", "-inf", "inf"]
        assert float(factors[3]) != float(factors[4])  # 1/3 rounded to bf16, then to f32
