"""Roundtrip oracle: what we print means to XLA exactly what we parsed, and printing is idempotent.

For every module (XLA's own test modules in ../shared/xla_cases, the test corpus, the other forms jax and
XLA emit, and hand-written modules for syntax the corpus lacks):

    xla_canonical(print(parse(text))) == xla_canonical(text)
    print(parse(print(parse(text)))) == print(parse(text))

where `xla_canonical` is jaxlib's parser and printer (`hlo_module_from_text(t).to_string()`), compared both
with XLA's default options and with large constants printed in full.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED
from hlopt.hlo.attributes import Metadata, Raw, ReplicaGroups
from hlopt.hlo.literal import Literal, LiteralError

from hlopt import hlo

XLA_CASES = sorted((SHARED / "xla_cases").glob("**/*.hlo")) if (SHARED / "xla_cases").is_dir() else []


# ----------------------------------------------------------------------------- the oracle


def xla_canonical(text: str) -> str:
    """XLA's parse of `text`, printed by XLA with its default options."""
    try:
        from hlopt.runtime._xla import xla_canonical_text
    except ImportError:  # pragma: no cover - runtime always has it today
        from jaxlib import _hlo

        return _hlo.hlo_module_from_text(text).to_string()
    return xla_canonical_text(text)


def xla_canonical_full(text: str) -> str:
    """XLA's parse of `text`, printed by XLA with large constants in full (the default elides them)."""
    from jaxlib import _hlo

    options = _hlo.HloPrintOptions()
    options.print_large_constants = True
    return _hlo.hlo_module_from_text(text).to_string(options)


def assert_roundtrip(text: str, name: str = "<text>", xla: bool = True) -> hlo.Module:
    """Parse, print, and check the print against XLA's oracle and for idempotence; return the module."""
    module = hlo.parse(text, filename=name)
    printed = module.to_text()
    if xla:
        assert xla_canonical(printed) == xla_canonical(text), f"{name}: XLA reads our print differently"
        if "{...}" not in text:  # XLA fills elided constants with arbitrary values, different every parse
            assert xla_canonical_full(printed) == xla_canonical_full(text), f"{name}: constants differ"
    else:
        xla_canonical(printed)  # XLA cannot read the input, but must read what we print
    again = hlo.parse(printed, filename=name + " (printed)").to_text()
    assert again == printed, f"{name}: printing is not idempotent"
    return module


# ----------------------------------------------------------------------------- XLA's test modules


@pytest.mark.skipif(not XLA_CASES, reason="../shared/xla_cases is not present")
@pytest.mark.parametrize("path", XLA_CASES, ids=[str(p.relative_to(SHARED / "xla_cases")) for p in XLA_CASES])
def test_xla_cases_round_trip(path: Path) -> None:
    assert_roundtrip(path.read_text(), str(path))


# ----------------------------------------------------------------------------- the corpus


def _corpus_ids() -> list[str]:
    from hlopt.corpus.programs import PROGRAMS

    return [p.name + suffix for p in PROGRAMS for suffix in ("", ".opt")]


@pytest.mark.parametrize("entry_id", _corpus_ids())
def test_corpus_round_trip(entry_id: str) -> None:
    from hlopt.corpus.programs import corpus_texts

    entry = next(e for e in corpus_texts() if e.id == entry_id)
    module = assert_roundtrip(entry.text, entry.id)
    assert module.instruction_count() == hlo.parse(module.to_text()).instruction_count()


@pytest.mark.parametrize("name", ["transformer_train_step", "while_fori_cond", "shmap_psum_in_scan", "linalg"])
def test_every_form_jax_and_xla_emit(name: str, tmp_path: Path) -> None:
    """`as_text(dialect="hlo")`, `compiler_ir("hlo").as_hlo_text()`, `compile().as_text()` and every file of an
    XLA dump directory (before/after optimizations and after each pass)."""
    import jax
    from hlopt.corpus.programs import program_by_name

    fn, args = program_by_name(name).build()
    lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)
    assert_roundtrip(lowered.as_text(dialect="hlo"), name + ":as_text")
    assert_roundtrip(lowered.compiler_ir("hlo").as_hlo_text(), name + ":compiler_ir")
    compiled = lowered.compile(compiler_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_pass_re": ".*"})
    assert_roundtrip(compiled.as_text(), name + ":compiled")
    dumps = [p for p in sorted(tmp_path.glob("*.txt")) if p.read_text().startswith("HloModule")]
    assert any(".before_optimizations" in p.name for p in dumps)
    assert any("after_optimizations.txt" in p.name for p in dumps)
    assert len(dumps) > 10, "expected per-pass dumps"
    for path in dumps:
        assert_roundtrip(path.read_text(), path.name)
    assert hlo.parse_file(dumps[0]).name


# ----------------------------------------------------------------------------- hand-written modules

_ALL_DTYPES = [
    ("pred", "{true, false}"), ("s2", "{-2, 1}"), ("s4", "{-8, 7}"), ("s8", "{-128, 127}"),
    ("s16", "{-32768, 32767}"), ("s32", "{-2147483648, 2147483647}"),
    ("s64", "{-9223372036854775808, 9223372036854775807}"), ("u2", "{0, 3}"), ("u4", "{0, 15}"),
    ("u8", "{0, 255}"), ("u16", "{0, 65535}"), ("u32", "{0, 4294967295}"), ("u64", "{0, 18446744073709551615}"),
    ("f16", "{65504, -6.1e-05}"), ("bf16", "{3.389e+38, -0.0078125}"), ("f32", "{3.4028235e+38, 1e-45}"),
    ("f64", "{1.7976931348623157e+308, 5e-324}"), ("c64", "{(1, -2), (inf, nan)}"),
    ("c128", "{(0.5, 1e+300), (-0, -inf)}"), ("f8e4m3fn", "{448, -0.001953125}"),
    ("f8e5m2", "{57344, -inf}"), ("f8e4m3", "{240, inf}"), ("f8e3m4", "{15.5, -0.015625}"),
    ("f8e4m3fnuz", "{240, -0.0009765625}"), ("f8e5m2fnuz", "{57344, 7.6e-06}"),
    ("f8e4m3b11fnuz", "{30, -0.125}"), ("f8e8m0fnu", "{1.70141e+38, 5.87747e-39}"),
    ("f4e2m1fn", "{6, -0.5}"), ("u1", "{0, 1}"), ("s1", "{-1, 0}"),
]


def _all_dtypes_module() -> str:
    lines = ["HloModule all_dtypes", "", "ENTRY %main {"]
    for number, (dt, values) in enumerate(_ALL_DTYPES):
        lines.append(f"  %p_{dt} = {dt}[2] parameter({number})")
        lines.append(f"  %c_{dt} = {dt}[2] constant({values})")
    roots = ", ".join(f"%c_{dt}" for dt, _ in _ALL_DTYPES)
    shapes = ", ".join(f"{dt}[2]" for dt, _ in _ALL_DTYPES)
    lines.append(f"  ROOT %t = ({shapes}) tuple({roots})")
    return "\n".join(lines) + "\n}\n"


_SUM = """%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

#: name -> module text; every one is accepted by XLA's parser.
MODULES: dict[str, str] = {
    "all_dtypes": _all_dtypes_module(),
    "dynamic_dims": """HloModule dynamic
ENTRY %e {
  %p = f32[<=4,3]{1,0} parameter(0)
  %u = f32[?,3]{1,0} parameter(1)
  %s = s32[] get-dimension-size(%p), dimensions={0}
  %q = f32[<=4,3] set-dimension-size(%p, %s), dimensions={0}
  %n = f32[?,3] negate(%u)
  ROOT %t = (f32[<=4,3], s32[], f32[?,3]) tuple(%q, %s, %n)
}
""",
    "layouts": """HloModule layouts, entry_computation_layout={(f32[8,128]{1,0:T(8,128)(2,1)})->f32[8,128]{0,1:T(8,128)E(32)S(1)}}
ENTRY %e {
  %p = f32[8,128]{1,0:T(8,128)(2,1)} parameter(0)
  %c = f32[8,128]{0,1:T(8,128)E(32)S(1)} copy(%p)
  %u = u4[16]{0:E(4)} constant({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0})
  %s = s4[8]{0:T(4)L(4)#(u8)*(s8)E(4)S(1)} parameter(1)
  %d = s4[8]{0:D(C+)T(2)} parameter(2)
  %m = f32[8,128]{1,0:T(2,*,128)S(1)SC(0:1,2)M(8)} parameter(3)
  %e = f32[] parameter(4)
  ROOT %r = f32[8,128]{0,1:T(8,128)E(32)S(1)} copy(%c)
}
""",
    "nested_tuples": """HloModule tuples
ENTRY %e {
  %p = ((f32[2], (s32[], pred[])), u8[3], ()) parameter(0)
  %g = (f32[2], (s32[], pred[])) get-tuple-element(%p), index=0
  %h = (s32[], pred[]) get-tuple-element(%g), index=1
  %i = pred[] get-tuple-element(%h), index=1
  %empty = () tuple()
  ROOT %t = (pred[], ((f32[2], (s32[], pred[])), u8[3], ()), ()) tuple(%i, %p, %empty)
}
""",
    "index_comments": """HloModule index_comments
ENTRY %e (p0: f32[]) -> (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[], f32[]) {
  %p0 = f32[] parameter(0)
  ROOT %t = (f32[], f32[], f32[], f32[], f32[], /*index=5*/f32[], f32[]) tuple(%p0, %p0, %p0, %p0, %p0, /*index=5*/%p0, %p0)
}
""",
    "inline_computations": """HloModule inline
ENTRY %e {
  %p = f32[4] parameter(0)
  %z = f32[] constant(0)
  %r = f32[] reduce(%p, %z), dimensions={0}, to_apply={
    %a = f32[] parameter(0)
    %b = f32[] parameter(1)
    ROOT %s = f32[] add(%a, %b)
  }
  ROOT %c = f32[] call(%r), to_apply={
    %x = f32[] parameter(0)
    ROOT %y = f32[] call(%x), to_apply={
      ROOT %w = f32[] parameter(0)
    }
  }
}
""",
    "shapeless_instructions": """HloModule shapeless
ENTRY %e {
  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %a = add(%p, %q)
  %b = multiply(%a, %p)
  %t = tuple(%a, %b)
  %g = get-tuple-element(%t), index=1
  %c = compare(%g, %a), direction=GT
  %bc = f32[4] broadcast(f32[] constant(2)), dimensions={}
  %n = negate(%bc)
  ROOT %s = select(%c, %a, %n)
}
""",
    "inline_operands": """HloModule inline_operands
ENTRY %e {
  %p = f32[4] parameter(0)
  %a = f32[4] add(%p, f32[4] constant({1, 2, 3, 4}))
  %m = f32[] reduce(%a, f32[] constant(0)), dimensions={0}, to_apply={
    %x = f32[] parameter(0)
    %y = f32[] parameter(1)
    ROOT %s = f32[] add(%x, f32[] multiply(f32[] constant(2), %y))
  }
  ROOT %n = f32[] add(negate(exponential(%m)), multiply(sine(%m), f32[] constant(-1.5)))
}
""",
    "operand_shapes": """HloModule operand_shapes
ENTRY %e {
  %p = f32[4]{0} parameter(0)
  %q = (f32[4]{0}, s32[]) parameter(1)
  %g = f32[4]{0} get-tuple-element((f32[4]{0}, s32[]) %q), index=0
  ROOT %a = f32[4]{0} add(f32[4]{0} %p, f32[4]{0} %g)
}
""",
    "async_computations": """HloModule async, is_scheduled=true

%async_comp (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%p)
}, execution_thread="host"

%callee (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %e = f32[4] exponential(%p)
}, execution_thread="host"

ENTRY %e {
  %p = f32[4] parameter(0)
  %s = ((f32[4]), f32[4], s32[]) async-start(%p), async_execution_thread="host", calls=%async_comp
  %u = ((f32[4]), f32[4], s32[]) async-update(%s)
  %d = f32[4] async-done(%u)
  %cs = ((f32[4]), f32[4], s32[]) call-start(%d), async_execution_thread="host", to_apply=%callee
  %cd = f32[4] call-done(%cs)
  %ccs = ((f32[4]), f32[4], u32[]) custom-call-start(%cd), custom_call_target="foo"
  ROOT %ccd = f32[4] custom-call-done(%ccs)
}
""",
    "async_collectives": """HloModule async_collectives, replica_count=4
""" + _SUM + """
ENTRY %e {
  %p = f32[4] parameter(0)
  %s = f32[4] all-reduce-start(%p), channel_id=3, replica_groups=[2,2]<=[4], to_apply=%sum
  %d = f32[4] all-reduce-done(%s)
  %ag = (f32[4], f32[16]) all-gather-start(%p), dimensions={0}, replica_groups=[1,4]<=[2,2]T(1,0)
  %agd = f32[16] all-gather-done(%ag)
  %cp = (f32[4], f32[4], u32[], u32[]) collective-permute-start(%p), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cpd = f32[4] collective-permute-done(%cp)
  %cs = (f32[4], f32[4], u32[]) copy-start(%p), cross_program_prefetch_index=0
  %cd = f32[4] copy-done(%cs)
  ROOT %t = (f32[4], f32[16], f32[4], f32[4]) tuple(%d, %agd, %cpd, %cd)
}
""",
    "schedule_and_control": """HloModule schedule, is_scheduled=true
ENTRY %e {
  %p = f32[4] parameter(0)
  %c = f32[4] sine(%p)
  %a = f32[4] negate(%p)
  %b = f32[4] exponential(%p), control-predecessors={%a}
  %d = f32[4] cosine(%p), control-predecessors={%a, %b}
  ROOT %t = (f32[4], f32[4], f32[4], f32[4]) tuple(%a, %b, %c, %d)
}
""",
    "root_not_last": """HloModule root_not_last
ENTRY %e {
  %p = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%p)
  %q = f32[4] exponential(%p)
}
""",
    "sharding": """HloModule sharding, num_partitions=4
ENTRY %e {
  %p = f32[4,8] parameter(0), sharding={devices=[2,2]<=[4]}
  %q = f32[4,8] parameter(1), sharding={devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}
  %r = f32[4,8] parameter(2), sharding={replicated}
  %s = f32[4,8] parameter(3), sharding={maximal device=1}
  %a = f32[4,8] add(%p, %q), sharding={devices=[4,1]<=[2,2]T(1,0) metadata={op_name="a"}}
  ROOT %t = (f32[4,8], f32[4,8]) tuple(%a, %r), sharding={{devices=[2,2]<=[4]}, {manual}}
}
""",
    "backend_config_and_strings": r"""HloModule backend_config
ENTRY %e {
  %p = f32[4] parameter(0)
  %a = f32[4] custom-call(%p), custom_call_target="a}b,c\"d", backend_config="{\"key\":1}"
  %b = f32[4] custom-call(%a), custom_call_target="bar", backend_config={"key":1, "x":"a\"b"}
  %c = f32[4] custom-call(%b), custom_call_target="baz", api_version=API_VERSION_TYPED_FFI, backend_config={}
  %d = f32[4] custom-call(%c), custom_call_target="q", custom_call_has_side_effect=true, backend_config=""
  %f = (f32[4], s32[]) custom-call(%d), custom_call_target="x", operand_layout_constraints={f32[4]{0}}, schedule=SCHEDULE_LATEST, output_to_operand_aliasing={{0}: (0, {})}
  ROOT %g = f32[4] custom-call(%d), custom_call_target="g", backend_config={
    "a": 1,
    "b": [1, 2]
  }
}
""",
    "frontend_attributes": r"""HloModule frontend, frontend_attributes={xla.sdy.meshes="{mesh = #sdy.mesh<[\"x\"=2]>}", k="v"}
ENTRY %e {
  %p = f32[4] parameter(0), frontend_attributes={_xla_compute_type="host", b="2"}
  %q = f32[4] negate(%p), frontend_attributes={x="y\"z", w="}", v="{,"}
  ROOT %a = f32[4] negate(%q), frontend_attributes={}
}
""",
    "metadata": r"""HloModule metadata
ENTRY %e {
  %p = f32[4] parameter(0), metadata={op_type="p" op_name="a\"b\\c\n\td" source_file="/x/y z.py" source_line=42 source_end_line=43 source_column=1 source_end_column=5 deduplicated_name="fusion.1" scheduling_name="p"}
  ROOT %a = f32[4] negate(%p), metadata={op_name="jit(f)/neg" profile_type={} }
}
""",
    "replica_groups": """HloModule replica_groups, replica_count=8
""" + _SUM + """
ENTRY %e {
  %p = f32[8] parameter(0)
  %a = f32[8] all-reduce(%p), replica_groups=[2,4]<=[8], to_apply=%sum
  %b = f32[8] all-reduce(%a), replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%sum, channel_id=2, use_global_device_ids=true
  %c = f32[8] all-reduce(%b), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%sum, constrain_layout=true
  %d = f32[8] all-reduce(%c), replica_groups={}, to_apply=%sum
  %g = f32[32] all-gather(%d), dimensions={0}, replica_groups=[2,4]<=[8]
  %rs = f32[2] reduce-scatter(%d), dimensions={0}, replica_groups=[2,4]<=[8], to_apply=%sum
  %a2a = f32[8] all-to-all(%d), dimensions={0}, replica_groups={{0,1,2,3,4,5,6,7}}
  %cb = f32[8] collective-broadcast(%d), replica_groups={{0,1}}
  %cp = f32[8] collective-permute(%d), source_target_pairs={{0,1},{1,0}}, channel_id=9
  %cp2 = f32[8] collective-permute(%cp), source_target_pairs={}
  ROOT %t = (f32[32], f32[2], f32[8], f32[8], f32[8]) tuple(%g, %rs, %a2a, %cb, %cp2)
}
""",
    "composite_call": """HloModule composite
%add.impl (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}
ENTRY %e {
  %p = f32[] parameter(0)
  ROOT %c = f32[] call(%p, %p), to_apply=%add.impl, is_composite=true, frontend_attributes={composite.attributes={n = 1 : i32},composite.name="foo.bar",composite.version="1"}
}
""",
    "literals": """HloModule literals
ENTRY %e {
  %a = f32[2,3] constant({ { 1, 2.5, -3e+10 }, { inf, -inf, nan } })
  %b = f32[2,0] constant({ {  }, {  } })
  %c = c64[2] constant({(1, -2), (inf, nan)})
  %d = f32[] constant(-nan)
  %e = bf16[3] constant({1.5, -0, 3.140625})
  %f = (f32[], s32[2], (pred[])) constant(( 1.5, {1, 2}, (true) ))
  %g = f32[2,2,2] constant({ { { 1, 2 }, { 3, 4 } }, { { 5, 6 }, { 7, 8 } } })
  %i = f32[2] constant({nan(0x1), -nan(0x7fffff)})
  %j = pred[2,2] constant({ { 1, 0 }, { true, false } })
  %k = f32[0] constant({})
  %l = f64[] constant(1.0000000000000002)
  %m = f32[20] constant({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
  %n = f8e4m3fn[3] constant({448, -448, nan})
  %o = f4e2m1fn[4] constant({6, -6, 0.5, -0})
  %q = f8e8m0fnu[2] constant({1, 1.70141e+38})
  ROOT %t = (f32[2,3], f32[2,0], c64[2], f32[], bf16[3], (f32[], s32[2], (pred[])), f32[2,2,2], f32[2], pred[2,2], f32[0], f64[], f32[20], f8e4m3fn[3], f4e2m1fn[4], f8e8m0fnu[2]) tuple(%a, %b, %c, %d, %e, %f, %g, %i, %j, %k, %l, %m, %n, %o, %q)
}
""",
    "elided_literal": """HloModule elided
ENTRY %e {
  %h = f32[200] constant({...})
  ROOT %t = (f32[200], s32[20,30]) tuple(%h, s32[20,30] constant({...}))
}
""",
    "header": """HloModule header, is_scheduled=true, entry_computation_layout={(f32[4]{0}, f32[4]{0})->(f32[4]{0}, f32[4]{0})}, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, must-alias) }, buffer_donor={ (1, {}) }, replica_count=2, num_partitions=2, frontend_attributes={a="b"}, alias_passthrough_params=true, allow_spmd_sharding_propagation_to_output={true}, allow_spmd_sharding_propagation_to_parameters={false,true}
ENTRY %e {
  %p = f32[4]{0} parameter(0)
  %q = f32[4]{0} parameter(1)
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%p, %q)
}
""",
    "trailer": r"""HloModule trailer

FileNames
1 "a.py"
2 "b \"q\".py"

FunctionNames
1 "f"
2 "g"

FileLocations
1 {file_name_id=1 function_name_id=1 line=1 end_line=2 column=3 end_column=4}
2 {file_name_id=2 function_name_id=2 line=10 end_line=10 column=0 end_column=5}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}


ENTRY %e {
  %p = f32[4] parameter(0), metadata={op_name="x" stack_frame_id=1}
  ROOT %a = f32[4] negate(%p), metadata={op_name="y" stack_frame_id=2}
}
""",
    "control_flow": """HloModule control_flow
%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, s32[] constant(10)), direction=LT
}
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[4] get-tuple-element(%p), index=1
  %i1 = s32[] add(%i, s32[] constant(1))
  ROOT %t = (s32[], f32[4]) tuple(%i1, %x)
}
%b0 (x: f32[4]) -> f32[4] {
  ROOT %x = f32[4] parameter(0)
}
%b1 (x: f32[4]) -> f32[4] {
  %x = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%x)
}
%fused (p0: f32[4], p1: f32[4]) -> f32[4] {
  %p0 = f32[4] parameter(0)
  %p1 = f32[4] parameter(1)
  ROOT %a = f32[4] add(%p0, %p1)
}
ENTRY %e {
  %p = f32[4] parameter(0)
  %k = s32[] parameter(1)
  %w = (s32[], f32[4]) while((s32[], f32[4]) tuple(%k, %p)), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"10"}}
  %c = f32[4] conditional(%k, %p, %p), branch_computations={%b0, %b1}
  %pc = f32[4] conditional(pred[] constant(true), %p, %p), true_computation=%b0, false_computation=%b1
  ROOT %f = f32[4] fusion(%c, %pc), kind=kLoop, calls=%fused, output_to_operand_aliasing={{}: (0, {})}
}
""",
    "many_opcodes": """HloModule many_opcodes, replica_count=2
""" + _SUM + """
%ge (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = pred[] compare(%a, %b), direction=GE
}
%cmp (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %lt = pred[] compare(%a, %b), direction=LT, type=TOTALORDER
}
ENTRY %e {
  %x = f32[1,4,8,8] parameter(0)
  %w = f32[3,4,3,3] parameter(1)
  %i = s32[4,8] parameter(2)
  %idx = s32[3,1] parameter(3)
  %sq = f32[4,4] parameter(4)
  %k = s32[] parameter(5)
  %p = f32[4] parameter(6)
  %cv = f32[1,3,8,8] convolution(%x, %w), window={size=3x3 pad=1_1x1_1 rhs_reversal=0x1}, dim_labels=bf01_oi01->bf01, feature_group_count=1, operand_precision={highest,default}
  %d = f32[4,8,8] dot(%x, %x), lhs_batch_dims={1}, lhs_contracting_dims={0}, rhs_batch_dims={1}, rhs_contracting_dims={0}, algorithm=dot_tf32_tf32_f32
  %rw = f32[1,4,4,4] reduce-window(%x, f32[] constant(0)), window={size=1x1x2x2 stride=1x1x2x2}, to_apply=%sum
  %ss = f32[1,4,8,8] select-and-scatter(%x, %rw, f32[] constant(0)), window={size=1x1x2x2 stride=1x1x2x2}, select=%ge, scatter=%sum
  %sl = f32[1,4,1,8] slice(%x), slice={[0:1], [0:4], [0:8:8], [0:8]}
  %rs = f32[4,8] reshape(%sl)
  %so = (f32[4,8], s32[4,8]) sort(%rs, %i), dimensions={1}, is_stable=true, to_apply=%cmp
  %s0 = f32[4,8] get-tuple-element(%so), index=0
  %g = f32[3,8] gather(%s0, %idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}, indices_are_sorted=true
  %sc = f32[4,8] scatter(%s0, %idx, %g), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%sum, unique_indices=false
  %ft = c64[4,5] fft(c64[4,8] convert(%sc)), fft_type=RFFT, fft_length={8}
  %pd = f32[6,17] pad(%rs, f32[] constant(0)), padding=1_1x0_1_1
  %tr = f32[8,4] transpose(%rs), dimensions={1,0}
  %rv = f32[4,8] reverse(%rs), dimensions={0,1}
  %cc = f32[8,8] concatenate(%rs, %rs), dimensions={0}
  %tok = token[] after-all()
  %sd = (f32[4], u32[], token[]) send(%p, %tok), channel_id=5, is_host_transfer=true, frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}
  %sdd = token[] send-done(%sd), channel_id=5, is_host_transfer=true
  %rcv = (f32[4], u32[], token[]) recv(%tok), channel_id=6
  %rcvd = (f32[4], token[]) recv-done(%rcv), channel_id=6
  %infd = ((f32[4], s32[]), token[]) infeed(%tok), infeed_config="abc"
  %outf = token[] outfeed(%p, %tok), outfeed_shape=f32[4]{0}, outfeed_config="x"
  %rbg = (u64[2], u32[4]) rng-bit-generator(u64[2] constant({1, 2})), algorithm=rng_three_fry
  %tk = (f32[4,2], s32[4,2]) topk(%sq), k=2, largest=true
  %ds = f32[2] dynamic-slice(%p, %k), dynamic_slice_sizes={2}
  %dus = f32[4] dynamic-update-slice(%p, %ds, %k)
  %io = s32[4,3] iota(), iota_dimension=1
  %rp = f32[4] reduce-precision(%p), exponent_bits=5, mantissa_bits=10
  %bc = s32[4] bitcast-convert(%p)
  %bt = f32[2,2] bitcast(%p)
  %rid = u32[] replica-id()
  %pid = u32[] partition-id()
  %ts = f32[4,4] triangular-solve(%sq, %sq), left_side=true, lower=true, unit_diagonal=false, transpose_a=TRANSPOSE
  %ch = f32[4,4] cholesky(%sq), lower=true
  %dr = f32[2,8] dynamic-reshape(%sq, s32[] constant(2), s32[] constant(8))
  %rng = f32[4] rng(f32[] constant(0), f32[] constant(1)), distribution=rng_uniform
  %ob = (f32[4], s32[]) opt-barrier((f32[4], s32[]) tuple(%p, %k))
  %dom = f32[4] domain(%p), domain={kind="sharding", entry={maximal device=0}, exit={replicated}}
  %ad = f32[4] add-dependency(%p, %tok)
  %map = f32[4] map(%p, %p), dimensions={0}, to_apply=%sum
  %cl = f32[4] clamp(%p, %p, %p)
  %bn = (f32[4,4], f32[4], f32[4]) batch-norm-training(%sq, %p, %p), epsilon=0.001, feature_index=1
  %stc = f16[4] stochastic-convert(%p, u32[4] bitcast-convert(%p))
  %ex = f32[4] exponential(%p), result_accuracy={tolerance={atol=0.1,rtol=0.2,ulps=1}}
  %st = f32[4] negate(%p), statistics={visualizing_index=1,stat-1=33.3}
  %ori = f32[4] negate(%p), origin={{"abc"}}
  %cpx = c64[4] complex(%p, %p)
  %re = f32[4] real(%cpx)
  %pr = f32[4] parameter(7), parameter_replication={true}
  ROOT %t = (f32[1,3,8,8], f32[4,8,8], f32[1,4,8,8], f32[3,8], f32[4,8]) tuple(%cv, %d, %ss, %g, %sc)
}
""",
    "newer_ops": """HloModule newer_ops, replica_count=2
ENTRY %e {
  %a = f8e4m3fn[4,32] parameter(0)
  %b = f8e4m3fn[8,32] parameter(1)
  %sa = f8e8m0fnu[4,1] parameter(2)
  %sb = f8e8m0fnu[8,1] parameter(3)
  %sd = f32[4,8] scaled-dot(%a, %b, %sa, %sb), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %x = f32[16,8] parameter(4)
  %y = f32[2,8,4] parameter(5)
  %gs = s64[2] parameter(6)
  %rd = f32[16,4] ragged-dot(%x, %y, %gs), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}
  %out = f32[16,4] parameter(7)
  %off = s64[2] parameter(8)
  %ra = f32[16,4] ragged-all-to-all(%rd, %out, %off, %gs, %off, %gs), replica_groups={{0,1}}
  ROOT %t = (f32[4,8], f32[16,4]) tuple(%sd, %ra)
}
""",
    "names_and_comments": """HloModule m.odd-name_1 // a line comment
/* a block
   comment */
%comp.1-x (a.b-c: f32[]) -> f32[] {
  %a.b-c = f32[] parameter(0)
  ROOT %neg_1 = f32[] negate(%a.b-c) /* trailing */
}

main {
  // no ENTRY keyword: the last computation is the entry
  p-1.x = f32[] parameter(0)
  _u = f32[] call(/*x*/p-1.x), to_apply=%comp.1-x
  ROOT r = f32[] negate(_u)
}
""",
    "crlf_and_tabs": "HloModule crlf\r\n\r\nENTRY\te\t{\r\n\tp = f32[4] parameter(0)\r\n\tROOT\tn = f32[4] negate(p)\r\n}",
}

#: Modules only our parser reads (XLA 0.10.2 cannot): our print of them must still be valid for XLA.
OUR_EXTENSIONS: dict[str, str] = {
    "gte_shorthand": """HloModule shorthand
ENTRY %e {
  %p = (f32[4], (s32[], f32[4])) parameter(0)
  %a = f32[4] negate(%p#0)
  %g = (s32[], f32[4]) get-tuple-element(%p), index=1
  ROOT %b = f32[4] add(%a, %g#1)
}
""",
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_hand_written_round_trip(name: str) -> None:
    assert_roundtrip(MODULES[name], name)


@pytest.mark.parametrize("name", sorted(OUR_EXTENSIONS))
def test_our_extensions_print_as_xla_syntax(name: str) -> None:
    assert_roundtrip(OUR_EXTENSIONS[name], name, xla=False)


def test_gte_shorthand_means_get_tuple_element() -> None:
    module = hlo.parse(OUR_EXTENSIONS["gte_shorthand"])
    a = module.entry.instruction("a")
    gte = a.operand(0)
    assert gte.opcode == "get-tuple-element" and gte["index"] == 0 and gte.operand(0).name == "p"
    assert str(gte.shape) == "f32[4]"
    explicit = OUR_EXTENSIONS["gte_shorthand"].replace("%p#0", "%p0").replace(
        "  %a =", "  %p0 = f32[4] get-tuple-element(%p), index=0\n  %a =").replace("%g#1", "%g1").replace(
        "  ROOT %b", "  %g1 = f32[4] get-tuple-element(%g), index=1\n  ROOT %b")
    assert xla_canonical(hlo.parse(explicit).to_text()).replace("%p0", "%x").replace("%g1", "%y") == \
        xla_canonical(module.to_text()).replace("%p.gte", "%x").replace("%g.gte", "%y")


# ----------------------------------------------------------------------------- what the model holds


def _parse(name: str) -> hlo.Module:
    return hlo.parse(MODULES[name], filename=name)


def test_model_of_dtypes_and_literals() -> None:
    module = _parse("all_dtypes")
    for dt, _ in _ALL_DTYPES:
        const = module.entry.instruction(f"c_{dt}")
        assert const.shape.dtype == dt and const.shape.dims == (2,)
        if hlo.DTYPES[dt].numpy is not None:
            assert const["literal"].to_numpy().shape == (2,)
    assert module.entry.instruction("c_u64")["literal"].to_numpy()[1] == np.uint64(18446744073709551615)
    assert module.entry.instruction("c_s64")["literal"].to_numpy()[0] == np.iinfo(np.int64).min
    assert float(module.entry.instruction("c_f8e4m3fn")["literal"].to_numpy()[0]) == 448.0


def test_model_of_dynamic_dims_and_layouts() -> None:
    dyn = _parse("dynamic_dims").entry
    assert dyn.instruction("p").shape.dynamic == (True, False)
    assert dyn.instruction("p").shape.dims == (4, 3)
    assert dyn.instruction("u").shape.is_dynamic_dim(0) and dyn.instruction("u").shape.dims[0] == -1
    lay = _parse("layouts").entry
    p = lay.instruction("p").shape.layout
    assert p.minor_to_major == (1, 0) and p.tiles == ((8, 128), (2, 1))
    c = lay.instruction("c").shape.layout
    assert (c.minor_to_major, c.element_size_bits, c.memory_space) == ((0, 1), 32, 1)
    assert lay.instruction("u").shape.layout.element_size_bits == 4
    assert lay.instruction("m").shape.layout.tiles == ((2, -1, 128),)
    assert lay.instruction("e").shape.layout is None


def test_model_of_calls_and_async() -> None:
    inline = _parse("inline_computations")
    reduce = inline.entry.instruction("r")
    assert reduce["to_apply"].is_inline and reduce["to_apply"].root.opcode == "add"
    assert reduce.called_computations == [reduce["to_apply"]]
    module = _parse("async_computations")
    start = module.entry.instruction("s")
    assert start["calls"].name == "async_comp" and start["calls"].execution_thread == "host"
    assert start["async_execution_thread"] == "host"
    assert module.entry.instruction("cs")["to_apply"].name == "callee"
    assert [i.name for i in module.entry.instructions][:4] == ["p", "s", "u", "d"]
    assert module.is_scheduled
    flow = _parse("control_flow").entry
    assert [c.name for c in flow.instruction("c")["branch_computations"]] == ["b0", "b1"]
    assert flow.instruction("w")["body"].name == "body" and flow.instruction("w")["condition"].name == "cond"
    assert flow.instruction("w").backend_config_json() == {"known_trip_count": {"n": "10"}}
    assert flow.instruction("f")["kind"] == "kLoop"


def test_model_of_schedule_and_control_dependencies() -> None:
    module = _parse("schedule_and_control")
    entry = module.entry
    assert [i.name for i in entry.instructions] == ["p", "c", "a", "b", "d", "t"]
    d = entry.instruction("d")
    assert [p.name for p in d.control_predecessors] == ["a", "b"]
    assert [s.name for s in entry.instruction("a").control_successors] == ["b", "d"]
    printed = module.to_text()
    assert "control-predecessors={%a, %b}" in printed
    root_last = _parse("root_not_last").entry
    assert root_last.root.name == "n" and root_last.instructions[-1].name == "q"


def test_model_of_attributes() -> None:
    sharded = _parse("sharding").entry
    assert isinstance(sharded.instruction("p").sharding, Raw) and sharded.instruction("p").sharding == \
        "{devices=[2,2]<=[4]}"
    cfg = _parse("backend_config_and_strings").entry
    assert cfg.instruction("a").backend_config_json() == {"key": 1}
    assert cfg.instruction("b").backend_config_json() == {"key": 1, "x": 'a"b'}
    assert cfg.instruction("c").backend_config_json() == {}
    assert cfg.instruction("d").backend_config_json() is None
    assert cfg.instruction("a")["custom_call_target"] == 'a}b,c"d'
    assert cfg.instruction("g").backend_config_json() == {"a": 1, "b": [1, 2]}
    fe = _parse("frontend_attributes")
    assert fe.config["frontend_attributes"]["xla.sdy.meshes"] == '{mesh = #sdy.mesh<["x"=2]>}'
    assert fe.entry.instruction("q").frontend_attributes == {"x": 'y"z', "w": "}", "v": "{,"}
    md = _parse("metadata").entry.instruction("p").metadata
    assert isinstance(md, Metadata)
    assert md["op_name"] == 'a"b\\c\n\td' and md["source_line"] == 42 and md["source_file"] == "/x/y z.py"
    composite = _parse("composite_call").entry.root
    assert composite["is_composite"] is True
    assert composite.frontend_attributes["composite.name"] == "foo.bar"


def test_model_of_replica_groups() -> None:
    entry = _parse("replica_groups").entry
    iota = entry.instruction("a")["replica_groups"]
    assert isinstance(iota, ReplicaGroups) and iota.groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert iota.to_text() == "[2,4]<=[8]"
    transposed = entry.instruction("b")["replica_groups"]
    assert transposed.groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert entry.instruction("c")["replica_groups"].groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert entry.instruction("d")["replica_groups"].is_empty
    assert entry.instruction("cp")["source_target_pairs"] == ((0, 1), (1, 0))


def test_model_of_header_and_trailer() -> None:
    module = _parse("header")
    config = module.config
    assert config["is_scheduled"] is True and config["replica_count"] == 2 and config["num_partitions"] == 2
    assert config["frontend_attributes"] == {"a": "b"}
    assert "may-alias" in config["input_output_alias"] and config["buffer_donor"] == "{ (1, {}) }"
    assert list(config)[:3] == ["is_scheduled", "entry_computation_layout", "input_output_alias"]
    trailer = _parse("trailer")
    for section in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
        assert section in trailer.trailer
    assert trailer.to_text().index("FileNames") < trailer.to_text().index("ENTRY")
    assert trailer.entry.root.metadata["stack_frame_id"] == 2


def test_model_of_literal_forms() -> None:
    entry = _parse("literals").entry

    def lit(name: str) -> Literal:
        return entry.instruction(name)["literal"]

    a = lit("a").to_numpy()
    assert a.shape == (2, 3) and a[0, 2] == np.float32(-3e10) and math.isinf(a[1, 0]) and math.isnan(a[1, 2])
    assert lit("b").to_numpy().shape == (2, 0)
    c = lit("c").to_numpy()
    assert c[0] == 1 - 2j and math.isinf(c[1].real) and math.isnan(c[1].imag)
    assert math.isnan(lit("d").scalar())
    assert np.signbit(lit("e").to_numpy()[1])
    elided = _parse("elided_literal").entry.instruction("h")["literal"]
    assert elided.is_elided
    with pytest.raises(LiteralError):
        elided.to_numpy()
    with pytest.raises(LiteralError):
        lit("f").to_numpy()  # tuple literals are kept as text
    assert np.isnan(lit("i").to_numpy()).all()
    assert lit("j").to_numpy().tolist() == [[True, False], [True, False]]
    assert lit("k").to_numpy().shape == (0,)
    assert lit("l").scalar() == 1.0000000000000002
    assert lit("m").to_numpy().sum() == 210
    assert np.isnan(lit("n").to_numpy()[2].astype(np.float32))


def test_inline_operands_become_instructions() -> None:
    module = _parse("inline_operands")
    a = module.entry.instruction("a")
    const = a.operand(1)
    assert const.opcode == "constant" and const.inline and const.parent is module.entry
    assert const["literal"].to_numpy().tolist() == [1, 2, 3, 4]
    root = module.entry.root
    assert [op.opcode for op in root.operands] == ["negate", "multiply"]
    assert str(root.operand(0).shape) == "f32[]"  # inferred
    assert "f32[4] constant({1, 2, 3, 4})" in module.to_text()


def test_shapeless_instructions_get_inferred_shapes() -> None:
    entry = _parse("shapeless_instructions").entry
    assert {i.name: str(i.shape) for i in entry.instructions if i.shape_elided} == {
        "a": "f32[4]", "b": "f32[4]", "t": "(f32[4], f32[4])", "g": "f32[4]", "c": "pred[4]", "n": "f32[4]",
        "s": "f32[4]",
    }
