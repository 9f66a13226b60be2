"""cost_model.analysis against XLA's HloCostAnalysis (jaxlib's `hlo_module_cost_analysis`, the reference).

`flops` and `transcendentals` must equal XLA's exactly and `bytes accessed` be within 5% on every module of
the test corpus, and on a single-instruction module per opcode family. XLA reports -1 flops and -1 bytes for
an opaque custom call; `Cost.xla_flops` / `xla_bytes` reproduce that. The corpus holds modules before SPMD
partitioning (`Sharding` custom calls, `xla.sdy` attributes), data-parallel and FSDP steps and LAPACK custom
calls (corpus/programs_extra.py; the SPMD ones from `extra_corpus_texts()`); the totals of `hlopt cost --json` are checked against XLA on every one.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hlopt.corpus.programs import corpus_texts
from hlopt.corpus.programs_extra import extra_corpus_texts
from hlopt.cost_model.analysis import CostAnalysis, module_cost

from hlopt import hlo

try:
    from hlopt.runtime._xla import cost_analysis
except ImportError:  # pragma: no cover - the runtime engineer's shim; jaxlib's entry point directly
    def cost_analysis(text: str) -> dict[str, float]:
        """XLA's HloCostAnalysis of a module on the CPU client."""
        import jax
        from jax._src.lib import _jax
        from jaxlib import _hlo

        return dict(_jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, _hlo.hlo_module_from_text(text)))


# ---------------------------------------------------------------- one module per opcode family: (name, called
# computations, entry body)

ADD = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n"
MAXR = "mx {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] maximum(a, b)\n}\n"
GE = "ge {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = pred[] compare(a, b), direction=GE\n}\n"
CMP2 = "cmp2 {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  c = s32[] parameter(2)\n  d = s32[] parameter(3)\n  ROOT s = pred[] compare(a, b), direction=LT\n}\n"
EXPC = "ex {\n  a = f32[] parameter(0)\n  e = f32[] exponential(a)\n  ROOT s = f32[] add(e, a)\n}\n"
P = "  p = f32[8,16] parameter(0)\n"
Q = "  q = f32[8,16] parameter(1)\n"
UN = ["abs", "ceil", "cosine", "exponential", "exponential-minus-one", "floor", "is-finite", "log", "log-plus-one",
      "logistic", "negate", "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sqrt", "cbrt",
      "tan", "tanh", "erf", "copy"]
BIN = ["add", "atan2", "divide", "maximum", "minimum", "multiply", "power", "remainder", "subtract"]
CASES = []
for op in UN:
    shape = "pred[8,16]" if op == "is-finite" else "f32[8,16]"
    CASES.append((op, "", P + f"  ROOT r = {shape} {op}(p)"))
for op in BIN:
    CASES.append((op, "", P + Q + f"  ROOT r = f32[8,16] {op}(p, q)"))
INTS = "  i = s32[8,16] parameter(0)\n  j = s32[8,16] parameter(1)\n"
for op in ["and", "or", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic"]:
    CASES.append((op, "", INTS + f"  ROOT r = s32[8,16] {op}(i, j)"))
CASES += [
    ("not", "", "  i = s32[8,16] parameter(0)\n  ROOT r = s32[8,16] not(i)"),
    ("popcnt", "", "  i = s32[8,16] parameter(0)\n  ROOT r = s32[8,16] popcnt(i)"),
    ("clz", "", "  i = s32[8,16] parameter(0)\n  ROOT r = s32[8,16] count-leading-zeros(i)"),
    ("compare", "", P + Q + "  ROOT r = pred[8,16] compare(p, q), direction=LT"),
    ("select", "", P + Q + "  c = pred[8,16] parameter(2)\n  ROOT r = f32[8,16] select(c, p, q)"),
    ("clamp", "", P + Q + "  z = f32[8,16] parameter(2)\n  ROOT r = f32[8,16] clamp(z, p, q)"),
    ("convert", "", P + "  ROOT r = bf16[8,16] convert(p)"),
    ("bitcast-convert", "", P + "  ROOT r = s32[8,16] bitcast-convert(p)"),
    ("bitcast-convert-narrow", "", P + "  ROOT r = bf16[8,16,2] bitcast-convert(p)"),
    ("reduce-precision", "", P + "  ROOT r = f32[8,16] reduce-precision(p), exponent_bits=5, mantissa_bits=10"),
    ("complex", "", P + Q + "  ROOT r = c64[8,16] complex(p, q)"),
    ("real", "", "  c = c64[8,16] parameter(0)\n  ROOT r = f32[8,16] real(c)"),
    ("broadcast", "", "  v = f32[16] parameter(0)\n  ROOT r = f32[8,16] broadcast(v), dimensions={1}"),
    ("reshape", "", P + "  ROOT r = f32[128] reshape(p)"),
    ("transpose", "", P + "  ROOT r = f32[16,8] transpose(p), dimensions={1,0}"),
    ("transpose-bitcast", "", "  p = f32[1,16] parameter(0)\n  ROOT r = f32[16,1] transpose(p), dimensions={1,0}"),
    ("bitcast", "", P + "  ROOT r = f32[128] bitcast(p)"),
    ("iota", "", "  ROOT r = s32[8,16] iota(), iota_dimension=1"),
    ("constant", "", "  ROOT r = f32[3] constant({1, 2, 3})"),
    ("slice", "", P + "  ROOT r = f32[4,8] slice(p), slice={[0:8:2], [0:8]}"),
    ("dynamic-slice", "", P + "  a = s32[] parameter(1)\n  b = s32[] parameter(2)\n  ROOT r = f32[2,4] dynamic-slice(p, a, b), dynamic_slice_sizes={2,4}"),
    ("dynamic-update-slice", "", P + "  u = f32[2,4] parameter(1)\n  a = s32[] parameter(2)\n  b = s32[] parameter(3)\n  ROOT r = f32[8,16] dynamic-update-slice(p, u, a, b)"),
    ("pad", "", P + "  z = f32[] parameter(1)\n  ROOT r = f32[10,20] pad(p, z), padding=1_1x2_2"),
    ("concatenate", "", P + Q + "  ROOT r = f32[8,32] concatenate(p, q), dimensions={1}"),
    ("reverse", "", P + "  ROOT r = f32[8,16] reverse(p), dimensions={0}"),
    ("dot", "", P + "  w = f32[16,4] parameter(1)\n  ROOT r = f32[8,4] dot(p, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    ("dot-batch", "", "  a = f32[3,8,16] parameter(0)\n  b = f32[3,16,4] parameter(1)\n  ROOT r = f32[3,8,4] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}"),
    ("convolution", "", "  x = f32[2,3,8,8] parameter(0)\n  k = f32[4,3,3,3] parameter(1)\n  ROOT r = f32[2,4,8,8] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=bf01_oi01->bf01"),
    ("convolution-strided", "", "  x = f32[2,8,8,3] parameter(0)\n  k = f32[3,3,3,6] parameter(1)\n  ROOT r = f32[2,4,4,6] convolution(x, k), window={size=3x3 stride=2x2 pad=1_1x1_1 rhs_dilate=1x1}, dim_labels=b01f_01io->b01f"),
    ("convolution-grouped", "", "  x = f32[2,8,8,4] parameter(0)\n  k = f32[3,3,2,4] parameter(1)\n  ROOT r = f32[2,8,8,4] convolution(x, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, feature_group_count=2"),
    ("reduce", ADD, P + "  z = f32[] constant(0)\n  ROOT r = f32[8] reduce(p, z), dimensions={1}, to_apply=add"),
    ("reduce-all", ADD, P + "  z = f32[] constant(0)\n  ROOT r = f32[] reduce(p, z), dimensions={0,1}, to_apply=add"),
    ("reduce-variadic", CMP2.replace("cmp2", "unused") + "argmax {\n  a = f32[] parameter(0)\n  i = s32[] parameter(1)\n  b = f32[] parameter(2)\n  j = s32[] parameter(3)\n  g = pred[] compare(a, b), direction=GE\n  m = f32[] select(g, a, b)\n  k = s32[] select(g, i, j)\n  ROOT t = (f32[], s32[]) tuple(m, k)\n}\n",
     P + "  ii = s32[8,16] iota(), iota_dimension=1\n  z = f32[] constant(0)\n  zi = s32[] constant(0)\n  ROOT r = (f32[8], s32[8]) reduce(p, ii, z, zi), dimensions={1}, to_apply=argmax"),
    ("reduce-window", MAXR, P + "  z = f32[] constant(0)\n  ROOT r = f32[4,8] reduce-window(p, z), window={size=2x2 stride=2x2}, to_apply=mx"),
    ("reduce-window-cumsum", ADD, P + "  z = f32[] constant(0)\n  ROOT r = f32[8,16] reduce-window(p, z), window={size=1x16 pad=0_0x15_0}, to_apply=add"),
    ("select-and-scatter", GE + ADD, P + "  s = f32[4,8] parameter(1)\n  z = f32[] constant(0)\n  ROOT r = f32[8,16] select-and-scatter(p, s, z), window={size=2x2 stride=2x2}, select=ge, scatter=add"),
    ("map", EXPC, P + "  ROOT r = f32[8,16] map(p), dimensions={0,1}, to_apply=ex"),
    ("sort", CMP2.replace("cmp2", "lt1").replace("  c = s32[] parameter(2)\n  d = s32[] parameter(3)\n", ""), P + "  ROOT r = f32[8,16] sort(p), dimensions={1}, to_apply=lt1"),
    ("sort-pair", CMP2, P + "  ii = s32[8,16] parameter(1)\n  ROOT r = (f32[8,16], s32[8,16]) sort(p, ii), dimensions={1}, to_apply=cmp2"),
    ("topk", "", P + "  ROOT r = (f32[8,3], s32[8,3]) topk(p), k=3, largest=true"),
    ("gather", "", P + "  ix = s32[5,1] parameter(1)\n  ROOT r = f32[5,16] gather(p, ix), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}"),
    ("scatter", ADD, P + "  ix = s32[5,1] parameter(1)\n  u = f32[5,16] parameter(2)\n  ROOT r = f32[8,16] scatter(p, ix, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add"),
    ("fft", "", "  c = c64[8,16] parameter(0)\n  ROOT r = c64[8,16] fft(c), fft_type=FFT, fft_length={16}"),
    ("rng-bit-generator", "", "  s = u64[2] parameter(0)\n  ROOT r = (u64[2], u32[8,16]) rng-bit-generator(s), algorithm=rng_default"),
    ("tuple-gte", "", P + Q + "  t = (f32[8,16], f32[8,16]) tuple(p, q)\n  ROOT g = f32[8,16] get-tuple-element(t), index=1"),
    ("opt-barrier", "", P + Q + "  t = (f32[8,16], f32[8,16]) tuple(p, q)\n  ROOT o = (f32[8,16], f32[8,16]) opt-barrier(t)"),
    ("custom-call", "", P + "  ROOT r = f32[8,16] custom-call(p), custom_call_target=\"foo\""),
    ("call", "sub {\n  a = f32[8,16] parameter(0)\n  e = f32[8,16] exponential(a)\n  ROOT m = f32[8,16] multiply(e, a)\n}\n",
     P + "  ROOT r = f32[8,16] call(p), to_apply=sub"),
    ("while", "body {\n  t = (s32[], f32[8,16]) parameter(0)\n  i = s32[] get-tuple-element(t), index=0\n  x = f32[8,16] get-tuple-element(t), index=1\n  one = s32[] constant(1)\n  i2 = s32[] add(i, one)\n  y = f32[8,16] tanh(x)\n  ROOT o = (s32[], f32[8,16]) tuple(i2, y)\n}\ncond {\n  t = (s32[], f32[8,16]) parameter(0)\n  i = s32[] get-tuple-element(t), index=0\n  n = s32[] constant(5)\n  ROOT c = pred[] compare(i, n), direction=LT\n}\n",
     P + "  z = s32[] constant(0)\n  t = (s32[], f32[8,16]) tuple(z, p)\n  w = (s32[], f32[8,16]) while(t), condition=cond, body=body\n  ROOT g = f32[8,16] get-tuple-element(w), index=1"),
    ("conditional", "br0 {\n  a = f32[8,16] parameter(0)\n  ROOT e = f32[8,16] exponential(a)\n}\nbr1 {\n  a = f32[8,16] parameter(0)\n  n = f32[8,16] negate(a)\n  ROOT m = f32[8,16] multiply(n, a)\n}\n",
     P + "  b = s32[] parameter(1)\n  ROOT r = f32[8,16] conditional(b, p, p), branch_computations={br0, br1}"),
    ("fusion-loop", "fused {\n  a = f32[8,16] parameter(0)\n  b = f32[16] parameter(1)\n  bb = f32[8,16] broadcast(b), dimensions={1}\n  e = f32[8,16] exponential(a)\n  ROOT m = f32[8,16] multiply(e, bb)\n}\n",
     P + "  v = f32[16] parameter(1)\n  ROOT r = f32[8,16] fusion(p, v), kind=kLoop, calls=fused"),
    ("fusion-slices", "fused {\n  a = f32[8,16] parameter(0)\n  sa = f32[4,16] slice(a), slice={[0:4], [0:16]}\n  sb = f32[4,16] slice(a), slice={[4:8], [0:16]}\n  ROOT m = f32[4,16] add(sa, sb)\n}\n",
     P + "  ROOT r = f32[4,16] fusion(p), kind=kLoop, calls=fused"),
    ("fusion-dus", "fused {\n  a = f32[8,16] parameter(0)\n  u = f32[2,16] parameter(1)\n  i = s32[] parameter(2)\n  z = s32[] constant(0)\n  ROOT d = f32[8,16] dynamic-update-slice(a, u, i, z)\n}\n",
     P + "  u = f32[2,16] parameter(1)\n  i = s32[] parameter(2)\n  ROOT r = f32[8,16] fusion(p, u, i), kind=kLoop, calls=fused"),
    ("fusion-multi-output", ADD + "fused {\n  a = f32[8,16] parameter(0)\n  c = f32[3] constant({1, 2, 3})\n  e = f32[8,16] exponential(a)\n  z = f32[] constant(0)\n  r = f32[8] reduce(e, z), dimensions={1}, to_apply=add\n  ROOT t = (f32[8], f32[8,16]) tuple(r, e)\n}\n",
     P + "  ROOT r = (f32[8], f32[8,16]) fusion(p), kind=kInput, calls=fused"),
    ("all-reduce", ADD, P + "  ROOT r = f32[8,16] all-reduce(p), replica_groups={{0,1}}, to_apply=add"),
    ("all-gather", "", P + "  ROOT r = f32[16,16] all-gather(p), dimensions={0}, replica_groups={{0,1}}"),
    ("reduce-scatter", ADD, P + "  ROOT r = f32[4,16] reduce-scatter(p), dimensions={0}, replica_groups={{0,1}}, to_apply=add"),
    ("all-to-all", "", P + "  ROOT r = f32[8,16] all-to-all(p), dimensions={0}, replica_groups={{0,1}}"),
    ("collective-permute", "", P + "  ROOT r = f32[8,16] collective-permute(p), source_target_pairs={{0,1},{1,0}}"),
    ("all-reduce-start", ADD, P + "  s = f32[8,16] all-reduce-start(p), replica_groups={{0,1}}, to_apply=add\n  ROOT d = f32[8,16] all-reduce-done(s)"),
    ("all-gather-start", "", P + "  s = (f32[8,16], f32[16,16]) all-gather-start(p), dimensions={0}, replica_groups={{0,1}}\n  ROOT d = f32[16,16] all-gather-done(s)"),
    ("cp-start", "", P + "  s = (f32[8,16], f32[8,16], u32[], u32[]) collective-permute-start(p), source_target_pairs={{0,1},{1,0}}\n  ROOT d = f32[8,16] collective-permute-done(s)"),
    ("async-reduce-scatter", ADD + "rs {\n  a = f32[8,16] parameter(0)\n  ROOT r = f32[4,16] reduce-scatter(a), dimensions={0}, replica_groups={{0,1}}, to_apply=add\n}\n",
     P + "  s = ((f32[8,16]), f32[4,16]) async-start(p), calls=rs\n  ROOT d = f32[4,16] async-done(s)"),
    # collectives of several operands, async wrappers, pre-SPMD sharding custom calls, LAPACK-level opcodes
    ("ar-tuple", ADD, P+Q+"  ROOT r = (f32[8,16], f32[8,16]) all-reduce(p, q), replica_groups={{0,1}}, to_apply=add"),
    ("ag-tuple", "", P+Q+"  ROOT r = (f32[16,16], f32[16,16]) all-gather(p, q), dimensions={0}, replica_groups={{0,1}}"),
    ("a2a-tuple", "", P+Q+"  ROOT r = (f32[8,16], f32[8,16]) all-to-all(p, q), replica_groups={{0,1}}"),
    ("rs-tuple", ADD, P+Q+"  ROOT r = (f32[4,16], f32[4,16]) reduce-scatter(p, q), dimensions={0}, replica_groups={{0,1}}, to_apply=add"),
    ("cbcast", "", P+"  ROOT r = f32[8,16] collective-broadcast(p), replica_groups={{0,1}}"),
    ("ragged", "", P+"  o = f32[8,16] parameter(1)\n  a = s32[2] parameter(2)\n  b = s32[2] parameter(3)\n  c = s32[2] parameter(4)\n  d = s32[2] parameter(5)\n  ROOT r = f32[8,16] ragged-all-to-all(p, o, a, b, c, d), replica_groups={{0,1}}"),
    ("sharding-cc", "", P+"  ROOT r = f32[8,16] custom-call(p), custom_call_target=\"Sharding\", sharding={devices=[2,1]<=[2]}"),
    ("spmd-full-to-shard", "", P+"  ROOT r = f32[4,16] custom-call(p), custom_call_target=\"SPMDFullToShardShape\", sharding={manual}"),
    ("cholesky-op", "", "  a = f32[3,8,8] parameter(0)\n  ROOT r = f32[3,8,8] cholesky(a), lower=true"),
    ("trsm-op", "", "  a = f32[3,8,8] parameter(0)\n  b = f32[3,8,2] parameter(1)\n  ROOT r = f32[3,8,2] triangular-solve(a, b), left_side=true, lower=true, transpose_a=NO_TRANSPOSE"),
    ("send-recv", "", P+"  t = token[] after-all()\n  s = (f32[8,16], u32[], token[]) send(p, t), channel_id=1\n  sd = token[] send-done(s), channel_id=1\n  rv = (f32[8,16], u32[], token[]) recv(t), channel_id=2\n  rd = (f32[8,16], token[]) recv-done(rv), channel_id=2\n  ROOT g = f32[8,16] get-tuple-element(rd), index=0"),
    ("rng", "", "  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[8,16] rng(a, b), distribution=rng_uniform"),
    ("cc-with-comp", ADD, P+"  ROOT r = f32[8,16] custom-call(p), custom_call_target=\"foo\", called_computations={add}"),
    ("ag-start-tuple", "", P+Q+"  s = ((f32[8,16], f32[8,16]), (f32[16,16], f32[16,16])) all-gather-start(p, q), dimensions={0}, replica_groups={{0,1}}\n  ROOT d = (f32[16,16], f32[16,16]) all-gather-done(s)"),
    ("ar-start-tuple", ADD, P+Q+"  s = (f32[8,16], f32[8,16]) all-reduce-start(p, q), replica_groups={{0,1}}, to_apply=add\n  ROOT d = (f32[8,16], f32[8,16]) all-reduce-done(s)"),
    ("async-ar", ADD + "arc {\n  a = f32[8,16] parameter(0)\n  ROOT r = f32[8,16] all-reduce(a), replica_groups={{0,1}}, to_apply=add\n}\n", P+"  s = ((f32[8,16]), f32[8,16]) async-start(p), calls=arc\n  ROOT d = f32[8,16] async-done(s)"),
    ("async-cc", "cc {\n  a = f32[8,16] parameter(0)\n  ROOT r = f32[8,16] custom-call(a), custom_call_target=\"foo\"\n}\n", P+"  s = ((f32[8,16]), f32[8,16]) async-start(p), calls=cc\n  ROOT d = f32[8,16] async-done(s)"),
    ("copy-start", "", P+"  s = (f32[8,16], f32[8,16], u32[]) copy-start(p)\n  ROOT d = f32[8,16] copy-done(s)"),
    ("stochastic-convert", "", P+"  u = u32[8,16] parameter(1)\n  ROOT r = bf16[8,16] stochastic-convert(p, u)"),
    ("dot-int8", "", "  a = s8[8,16] parameter(0)\n  b = s8[16,4] parameter(1)\n  ROOT r = s32[8,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
    ("conv-batch-group", "", "  x = f32[4,8,8,2] parameter(0)\n  k = f32[3,3,2,4] parameter(1)\n  ROOT r = f32[1,6,6,4] convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f, batch_group_count=4"),
    ("while-collective", ADD+"body {\n  t = (s32[], f32[8,16]) parameter(0)\n  i = s32[] get-tuple-element(t), index=0\n  x = f32[8,16] get-tuple-element(t), index=1\n  one = s32[] constant(1)\n  i2 = s32[] add(i, one)\n  y = f32[8,16] all-reduce(x), replica_groups={{0,1}}, to_apply=add\n  ROOT o = (s32[], f32[8,16]) tuple(i2, y)\n}\ncond {\n  t = (s32[], f32[8,16]) parameter(0)\n  i = s32[] get-tuple-element(t), index=0\n  n = s32[] constant(5)\n  ROOT c = pred[] compare(i, n), direction=LT\n}\n",
     P+"  z = s32[] constant(0)\n  t = (s32[], f32[8,16]) tuple(z, p)\n  w = (s32[], f32[8,16]) while(t), condition=cond, body=body, backend_config={\"known_trip_count\":{\"n\":\"5\"}}\n  ROOT g = f32[8,16] get-tuple-element(w), index=1"),
    ("partition-id", "", "  ROOT r = u32[] partition-id()"),
    ("after-all", "", "  a = token[] after-all()\n  ROOT r = token[] after-all(a)"),
]


def _check(text: str, ours) -> None:
    xla = cost_analysis(text)
    assert ours.xla_flops == xla.get("flops", 0.0)
    assert ours.transcendentals == xla.get("transcendentals", 0.0)
    ref = xla.get("bytes accessed", 0.0)
    assert ours.xla_bytes == pytest.approx(ref, rel=0.05, abs=1e-9)


@pytest.mark.parametrize("name,computations,body", CASES, ids=[c[0] for c in CASES])
def test_opcode_matches_xla(name, computations, body):
    text = "HloModule m\n\n" + computations + "ENTRY e {\n" + body + "\n}\n"
    _check(text, CostAnalysis().computation_cost(hlo.parse(text).entry))


#: The corpus and the SPMD programs (pre-partitioning modules with Sharding custom calls, DP and FSDP steps).
ALL_ENTRIES = [*corpus_texts(), *extra_corpus_texts()]


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=lambda e: e.id)
def test_corpus_module_matches_xla(entry):
    _check(entry.text, module_cost(hlo.parse(entry.text)))


def test_opaque_custom_call_counts_like_xla():
    text = "HloModule m\n\nENTRY e {\n" + P + "  ROOT r = f32[8,16] custom-call(p), custom_call_target=\"foo\"\n}\n"
    cost = module_cost(hlo.parse(text))
    assert cost.flops == 0 and cost.opaque == 1 and cost.bytes_accessed == 1024
    assert cost.xla_flops == -1 and cost.xla_bytes == -1


def _cli_cost_totals(path: str) -> dict:
    """`hlopt cost --json PATH`'s "total" object, run in-process."""
    from hlopt.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["cost", "--json", path]) == 0
    return json.loads(out.getvalue())["total"]


@pytest.mark.parametrize("entry", ALL_ENTRIES, ids=lambda e: e.id)
def test_cli_cost_totals_match_xla(entry, tmp_path):
    """What a user reads from `hlopt cost --json` is XLA's HloCostAnalysis: flops exact, bytes within 5%,
    on modules with Sharding / LAPACK custom calls and collectives as on the rest."""
    path = tmp_path / "m.hlo"
    path.write_text(entry.text)
    total = _cli_cost_totals(str(path))
    xla = cost_analysis(entry.text)
    assert total["flops"] == xla.get("flops", 0.0)
    assert total["transcendentals"] == xla.get("transcendentals", 0.0)
    assert total["bytes_accessed"] == pytest.approx(xla.get("bytes accessed", 0.0), rel=0.05, abs=1e-9)
    opaque = sum(i.opcode == "custom-call" for i in hlo.parse(entry.text).instructions())
    assert total["opaque_instructions"] == opaque


def test_extra_corpus_has_the_program_shapes():
    """The pre-SPMD module carries Sharding custom calls and xla.sdy attributes; the optimized DP/FSDP
    steps carry collectives; the LAPACK program LAPACK custom calls."""
    texts = {e.id: e.text for e in ALL_ENTRIES}
    pre = texts["sharded_jit_constraints"]
    assert 'custom_call_target="Sharding"' in pre and "xla.sdy.sharding" in pre
    assert " all-reduce(" in texts["data_parallel_step.opt"]
    assert " all-gather(" in texts["fsdp_step.opt"] and " all-reduce(" in texts["fsdp_step.opt"]
    for target in ("lapack_spotrf_ffi", "lapack_sgetrf_ffi", "lapack_strsm_ffi", "lapack_ssyevd_ffi"):
        assert target in texts["lapack_batched"]
    assert texts["dp_mlp_psum_per_layer"].count(" all-reduce(") >= 3
    assert texts["transformer_24_gradient_all_reduces"].count(" all-reduce(") >= 24
