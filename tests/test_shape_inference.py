"""Shape inference: XLA's own parser as the oracle where XLA infers shapes, and per-family checks elsewhere.

Where XLA's HLO parser infers a result shape left out of the text, our parse (which infers it too) must
print to the same canonical module, layouts included. Opcodes XLA cannot infer (the result type or size is
not determined by the operands, or collectives) are checked with written shapes: valid ones pass
`check_shape`, broken ones fail with a message saying what is wrong.
"""

from __future__ import annotations

import pytest
from hlopt.hlo.builder import Builder
from hlopt.hlo.opcodes import OPCODES
from hlopt.hlo.shape import Shape, TupleShape
from hlopt.hlo.shape_inference import (
    INFERENCE_RULES,
    ShapeInferenceError,
    check_shape,
    expected_shape,
    infer_shape,
    rule_for,
    shapes_compatible,
)

from hlopt import hlo

CALLEES = """
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
ge {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = pred[] compare(x, y), direction=GE
}
lt {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT s = pred[] compare(x, y), direction=LT
}
argmax {
  x = f32[] parameter(0)
  i = s32[] parameter(1)
  y = f32[] parameter(2)
  j = s32[] parameter(3)
  c = pred[] compare(x, y), direction=GE
  m = f32[] select(c, x, y)
  k = s32[] select(c, i, j)
  ROOT t = (f32[], s32[]) tuple(m, k)
}
neg8 {
  x = f32[8] parameter(0)
  ROOT n = f32[8] negate(x)
}
cond {
  c = s32[] parameter(0)
  k = s32[] constant(4)
  ROOT lt = pred[] compare(c, k), direction=LT
}
body {
  b = s32[] parameter(0)
  one = s32[] constant(1)
  ROOT n = s32[] add(b, one)
}
"""


def _module(lines: list[str], header: str = "") -> hlo.Module:
    body = "\n  ".join(lines[:-1] + ["ROOT " + lines[-1]])
    return hlo.parse(f"HloModule t{header}\n{CALLEES}\nENTRY main {{\n  {body}\n}}\n")


# ----------------------------------------------------------------------------- XLA's parser as the oracle

#: name -> (declarations with shapes, instructions without shapes, root). XLA's parser infers these shapes.
XLA_INFERS = {
    "unary": (["p0 = f32[2,3] parameter(0)"],
              ["a = exponential(p0)", "b = abs(a)", "c = is-finite(b)", "d = not(c)", "e = floor(p0)",
               "f = sinh(p0)"], "tuple(a,b,c,d,e,f)"),
    "complex": (["p0 = f32[4] parameter(0)"],
                ["c = complex(p0, p0)", "r = real(c)", "i = imag(c)", "a = abs(c)"], "tuple(c,r,i,a)"),
    "integer": (["p0 = s32[3] parameter(0)"],
                ["a = add(p0, p0)", "b = shift-left(a, p0)", "c = compare(a, b), direction=LT", "d = and(a, b)",
                 "e = select(c, a, b)", "f = clamp(p0, a, b)", "g = count-leading-zeros(a)", "h = popcnt(a)"],
                "tuple(a,b,c,d,e,f,g,h)"),
    "transpose": (["p0 = f32[2,3,4] parameter(0)"], ["t = transpose(p0), dimensions={2,0,1}"], "t"),
    "transpose_layout": (["p0 = f32[2,3,4]{0,1,2} parameter(0)"], ["t = transpose(p0), dimensions={1,2,0}"], "t"),
    "pad": (["p0 = f32[3,4] parameter(0)", "z = f32[] constant(0)"], ["p = pad(p0, z), padding=1_2_1x0_-1"], "p"),
    "concatenate": (["p0 = f32[3,4] parameter(0)", "p1 = f32[3,2] parameter(1)"],
                    ["c = concatenate(p0, p1, p0), dimensions={1}"], "c"),
    "reverse": (["p0 = f32[3,4] parameter(0)"], ["r = reverse(p0), dimensions={0,1}"], "r"),
    "dot_batch": (["p0 = f32[2,3,4] parameter(0)", "p1 = f32[2,4,5] parameter(1)"],
                  ["d = dot(p0, p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, "
                   "rhs_contracting_dims={1}"], "d"),
    "dot_outer": (["p0 = f32[3] parameter(0)", "p1 = f32[5,2] parameter(1)"], ["d = dot(p0, p1)"], "d"),
    "reduce": (["p0 = f32[4,5,6] parameter(0)", "z = f32[] constant(0)"],
               ["r = reduce(p0, z), dimensions={0,2}, to_apply=add"], "r"),
    "reduce_variadic": (["p0 = f32[4,5] parameter(0)", "p1 = s32[4,5] parameter(1)", "z = f32[] constant(0)",
                         "zi = s32[] constant(0)"], ["r = reduce(p0, p1, z, zi), dimensions={1}, to_apply=argmax"], "r"),
    "reduce_window": (["p0 = f32[4,9] parameter(0)", "z = f32[] constant(0)"],
                      ["r = reduce-window(p0, z), window={size=2x3 stride=2x2 pad=0_1x1_1 lhs_dilate=1x2}, "
                       "to_apply=add"], "r"),
    "select_and_scatter": (["p0 = f32[4,6] parameter(0)", "s = f32[2,3] parameter(1)", "z = f32[] constant(0)"],
                           ["r = select-and-scatter(p0, s, z), window={size=2x2 stride=2x2}, select=ge, scatter=add"],
                           "r"),
    "convolution": (["p0 = f32[2,8,8,3] parameter(0)", "p1 = f32[3,3,3,16] parameter(1)"],
                    ["c = convolution(p0, p1), window={size=3x3 stride=2x1 pad=1_1x0_0 rhs_dilate=1x2}, "
                     "dim_labels=b01f_01io->bf01"], "c"),
    "convolution_feature_groups": (["p0 = f32[2,6,10] parameter(0)", "p1 = f32[3,2,12] parameter(1)"],
                                   ["c = convolution(p0, p1), window={size=3}, dim_labels=bf0_0io->b0f, "
                                    "feature_group_count=3"], "c"),
    "convolution_batch_groups": (["p0 = f32[4,6,10] parameter(0)", "p1 = f32[6,4,3] parameter(1)"],
                                 ["c = convolution(p0, p1), window={size=3}, dim_labels=bf0_io0->bf0, "
                                  "batch_group_count=2"], "c"),
    "gather": (["p0 = f32[10,9,8] parameter(0)", "i = s32[5,2] parameter(1)"],
               ["g = gather(p0, i), offset_dims={1,2}, collapsed_slice_dims={0}, start_index_map={0,2}, "
                "index_vector_dim=1, slice_sizes={1,4,3}"], "g"),
    "gather_batching": (["p0 = f32[4,10,8] parameter(0)", "i = s32[4,5] parameter(1)"],
                        ["g = gather(p0, i), offset_dims={2}, collapsed_slice_dims={1}, operand_batching_dims={0}, "
                         "start_indices_batching_dims={0}, start_index_map={1}, index_vector_dim=2, "
                         "slice_sizes={1,1,8}"], "g"),
    "scatter": (["p0 = f32[10,8] parameter(0)", "i = s32[5,1] parameter(1)", "u = f32[5,8] parameter(2)"],
                ["s = scatter(p0, i, u), update_window_dims={1}, inserted_window_dims={0}, "
                 "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add"], "s"),
    "sort": (["p0 = f32[4,5] parameter(0)", "p1 = s32[4,5] parameter(1)"], ["s = sort(p0, p1), dimensions={1}, to_apply=lt"],
             "s"),
    "fft": (["p0 = f32[3,8] parameter(0)"],
            ["r = fft(p0), fft_type=RFFT, fft_length={8}", "c = fft(r), fft_type=IFFT, fft_length={5}",
             "i = fft(r), fft_type=IRFFT, fft_length={8}"], "tuple(r,c,i)"),
    "fft_2d": (["p0 = f64[2,4,6] parameter(0)"],
               ["r = fft(p0), fft_type=RFFT, fft_length={4,6}", "i = fft(r), fft_type=IRFFT, fft_length={4,6}"],
               "tuple(r,i)"),
    "cholesky_triangular_solve": (["p0 = f32[2,4,4] parameter(0)", "b = f32[2,4,3] parameter(1)"],
                                  ["c = cholesky(p0), lower=true",
                                   "t = triangular-solve(c, b), left_side=true, lower=true, transpose_a=NO_TRANSPOSE"],
                                  "tuple(c,t)"),
    "triangular_solve_right": (["p0 = f32[4,4] parameter(0)", "b = f32[3,4] parameter(1)"],
                               ["t = triangular-solve(p0, b), left_side=false, lower=true, transpose_a=TRANSPOSE"], "t"),
    "topk": (["p0 = f32[4,10] parameter(0)"], ["t = topk(p0), k=3, largest=true"], "t"),
    "tuples": (["p0 = (f32[2], s32[3]) parameter(0)"], ["a = get-tuple-element(p0), index=1", "t = tuple(a, p0)"], "t"),
    "batch_norm": (["p0 = f32[2,3,4] parameter(0)", "s = f32[3] parameter(1)"],
                   ["t = batch-norm-training(p0, s, s), epsilon=0.001, feature_index=1",
                    "i = batch-norm-inference(p0, s, s, s, s), epsilon=0.001, feature_index=1",
                    "g = batch-norm-grad(p0, s, s, s, p0), epsilon=0.001, feature_index=1"], "tuple(t,i,g)"),
    "dimension_sizes": (["p0 = f32[4,6] parameter(0)"],
                        ["d = get-dimension-size(p0), dimensions={1}", "s = set-dimension-size(p0, d), dimensions={0}"],
                        "tuple(d,s)"),
    "map": (["p0 = f32[4] parameter(0)"], ["m = map(p0, p0), dimensions={0}, to_apply=add"], "m"),
    "tokens_and_ids": ([], ["r = replica-id()", "p = partition-id()", "t = after-all()", "d = add-dependency(r, t)"],
                       "tuple(r,p,t,d)"),
    "while_call_conditional": (["p0 = s32[] parameter(0)", "f = f32[8] parameter(1)", "b = pred[] parameter(2)"],
                               ["w = while(p0), condition=cond, body=body", "c = call(f), to_apply=neg8",
                                "k = conditional(b, f, f), true_computation=neg8, false_computation=neg8"],
                               "tuple(w,c,k)"),
}


def _shapeless_text(name: str) -> str:
    decls, lines, root = XLA_INFERS[name]
    body = "\n  ".join(decls + lines + ["ROOT root = " + (root if "(" in root else f"tuple({root})")])
    return f"HloModule {name}\n{CALLEES}\nENTRY main {{\n  {body}\n}}\n"


@pytest.mark.parametrize("name", sorted(XLA_INFERS))
def test_inferred_shapes_match_xla_parser(name):
    runtime = pytest.importorskip("runtime")
    text = _shapeless_text(name)
    module = hlo.parse(text)
    assert runtime.xla_canonical_text(module.to_text()) == runtime.xla_canonical_text(text)
    for inst in module.instructions():
        assert check_shape(inst) is None, inst.to_text()


# ----------------------------------------------------------------------------- written shapes, per family

#: name -> instruction lines (the last is the root, named r where it matters); every shape is right.
VALID = {
    "convert": ["p = f32[2,3] parameter(0)", "r = s8[2,3] convert(p)"],
    "bitcast_convert_same_width": ["p = f32[4] parameter(0)", "r = s32[4] bitcast-convert(p)"],
    "bitcast_convert_narrower": ["p = f32[4] parameter(0)", "r = u16[4,2] bitcast-convert(p)"],
    "bitcast_convert_wider": ["p = f16[4,2] parameter(0)", "r = f32[4] bitcast-convert(p)"],
    "stochastic_convert": ["p = f32[4] parameter(0)", "q = u32[4] parameter(1)", "r = bf16[4] stochastic-convert(p, q)"],
    "reduce_precision": ["p = f32[8] parameter(0)", "r = f32[8] reduce-precision(p), exponent_bits=5, mantissa_bits=10"],
    "mulhi": ["p = u32[4] parameter(0)", "r = u32[4] mulhi(p, p)"],
    "clamp_scalar_bounds": ["p = f32[8] parameter(0)", "z = f32[] constant(0)", "r = f32[8] clamp(z, p, z)"],
    "compare_total_order": ["p = f32[8] parameter(0)", "r = pred[8] compare(p, p), direction=LT, type=TOTALORDER"],
    "broadcast": ["p = f32[3] parameter(0)", "r = f32[2,3,4] broadcast(p), dimensions={1}"],
    "reshape": ["p = f32[2,6] parameter(0)", "r = f32[3,4] reshape(p)"],
    "dynamic_reshape": ["p = f32[6] parameter(0)", "a = s32[] parameter(1)", "r = f32[<=2,3] dynamic-reshape(p, a, a)"],
    "bitcast": ["p = f32[2,6] parameter(0)", "r = f32[12] bitcast(p)"],
    "iota": ["r = s32[4,5] iota(), iota_dimension=1"],
    "slice": ["p = f32[10,8] parameter(0)", "r = f32[3,4] slice(p), slice={[1:9:3], [0:8:2]}"],
    "dynamic_slice": ["p = f32[10,8] parameter(0)", "i = s32[] parameter(1)",
                      "r = f32[2,3] dynamic-slice(p, i, i), dynamic_slice_sizes={2,3}"],
    "dynamic_update_slice": ["p = f32[10,8] parameter(0)", "u = f32[2,3] parameter(1)", "i = s32[] parameter(2)",
                             "r = f32[10,8] dynamic-update-slice(p, u, i, i)"],
    "rng": ["a = f32[] parameter(0)", "b = f32[] parameter(1)", "r = f32[3,2] rng(a, b), distribution=rng_uniform"],
    "rng_bit_generator": ["p = u64[2] parameter(0)", "r = (u64[2], u32[4,4]) rng-bit-generator(p), algorithm=rng_default"],
    "rng_state": ["r = u64[2] rng-get-and-update-state(), delta=1"],
    "custom_call": ["p = f32[8] parameter(0)", "r = (s32[], f32[2,2]) custom-call(p), custom_call_target=\"anything\""],
    "opt_barrier": ["p = f32[8] parameter(0)", "i = s32[] parameter(1)", "t = (f32[8], s32[]) tuple(p, i)",
                    "r = (f32[8], s32[]) opt-barrier(t)"],
    "domain": ["p = f32[8] parameter(0)",
               "r = f32[8] domain(p), domain={kind=\"sharding\", entry={maximal device=0}, exit={replicated}}"],
    "fusion": ["p = f32[8] parameter(0)", "r = f32[8] fusion(p), kind=kLoop, calls=neg8"],
    "conditional_indexed": ["i = s32[] parameter(0)", "p = f32[8] parameter(1)",
                            "r = f32[8] conditional(i, p, p, p), branch_computations={neg8, neg8, neg8}"],
    "ragged_dot_non_contracting": ["l = f32[11,5] parameter(0)", "g = f32[3,5,7] parameter(1)", "s = s32[3] parameter(2)",
                                   "r = f32[11,7] ragged-dot(l, g, s), lhs_contracting_dims={1}, "
                                   "rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}"],
    "ragged_dot_contracting": ["l = f32[11,5] parameter(0)", "g = f32[5,7] parameter(1)", "s = s32[3] parameter(2)",
                               "r = f32[3,11,7] ragged-dot(l, g, s), lhs_contracting_dims={1}, "
                               "rhs_contracting_dims={0}, lhs_ragged_dims={1}"],
    "scaled_dot": ["l = f8e4m3fn[4,32] parameter(0)", "x = f8e4m3fn[8,32] parameter(1)",
                   "ls = f8e8m0fnu[4,1] parameter(2)", "xs = f8e8m0fnu[8,1] parameter(3)",
                   "r = f32[4,8] scaled-dot(l, x, ls, xs), lhs_contracting_dims={1}, rhs_contracting_dims={1}"],
    "dot_preferred_type": ["a = bf16[4,5] parameter(0)", "b = bf16[5,3] parameter(1)",
                           "r = f32[4,3] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"],
    "all_reduce_tuple": ["p = f32[8] parameter(0)", "q = f32[4] parameter(1)",
                         "r = (f32[8], f32[4]) all-reduce(p, q), replica_groups={{0,1}}, to_apply=add"],
    "all_gather": ["p = f32[8,3] parameter(0)", "r = f32[16,3] all-gather(p), replica_groups={{0,1}}, dimensions={0}"],
    "all_gather_iota_groups": ["p = f32[8,3] parameter(0)",
                               "r = f32[8,12] all-gather(p), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}, "
                               "use_global_device_ids=true"],
    "reduce_scatter": ["p = f32[8,3] parameter(0)",
                       "r = f32[2,3] reduce-scatter(p), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add"],
    "all_to_all": ["p = f32[8,3] parameter(0)", "r = f32[8,3] all-to-all(p), replica_groups={{0,1}}, dimensions={0}"],
    "all_to_all_tuple": ["p = f32[4] parameter(0)", "r = (f32[4], f32[4]) all-to-all(p, p), replica_groups={{0,1}}"],
    "ragged_all_to_all": ["i = f32[8,4] parameter(0)", "o = f32[8,4] parameter(1)", "a = s64[2] parameter(2)",
                          "r = f32[8,4] ragged-all-to-all(i, o, a, a, a, a), replica_groups={{0,1}}"],
    "collective_permute": ["p = f32[8] parameter(0)", "r = f32[8] collective-permute(p), source_target_pairs={{0,1},{1,0}}"],
    "collective_broadcast": ["p = f32[4] parameter(0)", "r = f32[4] collective-broadcast(p), replica_groups={{0,1}}"],
    "collective_permute_start_done": ["p = f32[8] parameter(0)",
                                      "s = (f32[8], f32[8], u32[], u32[]) collective-permute-start(p), "
                                      "source_target_pairs={{0,1},{1,0}}",
                                      "r = f32[8] collective-permute-done(s)"],
    "all_gather_start_done": ["p = f32[8] parameter(0)",
                              "s = (f32[8], f32[16]) all-gather-start(p), replica_groups={{0,1}}, dimensions={0}",
                              "r = f32[16] all-gather-done(s)"],
    "all_reduce_start_done": ["p = f32[8] parameter(0)",
                              "s = f32[8] all-reduce-start(p), replica_groups={{0,1}}, to_apply=add",
                              "r = f32[8] all-reduce-done(s)"],
    "async_start_update_done": ["p = f32[8] parameter(0)", "s = ((f32[8]), f32[8], s32[]) async-start(p), calls=neg8",
                                "u = ((f32[8]), f32[8], s32[]) async-update(s)", "r = f32[8] async-done(u)"],
    "async_sugar": ["p = f32[8] parameter(0)",
                    "s = ((f32[8]), f32[2], s32[]) reduce-scatter-start(p), replica_groups={{0,1,2,3}}, "
                    "dimensions={0}, to_apply=add",
                    "r = f32[2] reduce-scatter-done(s)"],
    "copy_start_done": ["p = f32[8] parameter(0)", "s = (f32[8], f32[8], u32[]) copy-start(p)",
                        "r = f32[8] copy-done(s)"],
    "send_recv": ["p = f32[8] parameter(0)", "t = token[] after-all()",
                  "s = (f32[8], u32[], token[]) send(p, t), channel_id=1", "sd = token[] send-done(s), channel_id=1",
                  "v = (f32[8], u32[], token[]) recv(t), channel_id=2",
                  "vd = (f32[8], token[]) recv-done(v), channel_id=2", "r = (token[], (f32[8], token[])) tuple(sd, vd)"],
    "infeed_outfeed": ["t = token[] after-all()", "i = (f32[4], token[]) infeed(t)",
                       "d = f32[4] get-tuple-element(i), index=0", "o = token[] outfeed(d, t)",
                       "r = (f32[4], token[]) tuple(d, o)"],
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_written_shapes_pass(name):
    module = _module(VALID[name])
    for inst in module.instructions():
        assert check_shape(inst) is None, f"{inst.to_text()}: {check_shape(inst)}"


#: name -> (instruction lines, text the complaint about %r contains)
INVALID = {
    "result_dims": (["p = f32[4] parameter(0)", "r = f32[5] negate(p)"], "does not match the inferred f32[4]"),
    "implicit_broadcast": (["a = f32[4] parameter(0)", "b = f32[1] parameter(1)", "r = f32[4] add(a, b)"],
                           "implicit broadcast"),
    "mixed_types": (["a = f32[4] parameter(0)", "b = s32[4] parameter(1)", "r = f32[4] multiply(a, b)"],
                    "different element types"),
    "operand_count": (["a = f32[4] parameter(0)", "r = f32[4] add(a, a, a)"], "takes 2 operand(s), got 3"),
    "sine_of_integer": (["a = s32[4] parameter(0)", "r = s32[4] sine(a)"], "floating-point or complex"),
    "and_of_float": (["a = f32[4] parameter(0)", "r = f32[4] and(a, a)"], "pred or integral"),
    "compare_type": (["a = f32[4] parameter(0)", "r = pred[4] compare(a, a), direction=LT, type=SIGNED"],
                     "comparison type SIGNED"),
    "select_predicate": (["a = f32[4] parameter(0)", "r = f32[4] select(a, a, a)"], "predicate must be pred"),
    "clamp_bounds": (["a = f32[4] parameter(0)", "b = f32[2] parameter(1)", "r = f32[4] clamp(b, a, b)"],
                     "scalar or shaped like the operand"),
    "convert_dims": (["a = f32[4] parameter(0)", "r = s32[3] convert(a)"], "does not match the inferred s32[4]"),
    "bitcast_convert_ratio": (["a = f32[3] parameter(0)", "r = f64[] bitcast-convert(a)"], "last dimension"),
    "broadcast_dimension": (["a = f32[3] parameter(0)", "r = f32[2,4] broadcast(a), dimensions={1}"],
                            "maps to output dimension 1"),
    "reshape_elements": (["a = f32[2,3] parameter(0)", "r = f32[7] reshape(a)"], "cannot reshape"),
    "bitcast_size": (["a = f32[2,3] parameter(0)", "r = f32[7] bitcast(a)"], "cannot bitcast"),
    "transpose_permutation": (["a = f32[2,3] parameter(0)", "r = f32[3,2] transpose(a), dimensions={0,0}"],
                              "not a permutation"),
    "transpose_result": (["a = f32[2,3] parameter(0)", "r = f32[2,3] transpose(a), dimensions={1,0}"],
                         "does not match the inferred f32[3,2]"),
    "slice_bounds": (["a = f32[4] parameter(0)", "r = f32[2] slice(a), slice={[3:5]}"], "out of bounds"),
    "dynamic_slice_indices": (["a = f32[4,4] parameter(0)", "i = s32[] parameter(1)",
                               "r = f32[2,2] dynamic-slice(a, i), dynamic_slice_sizes={2,2}"], "start index"),
    "dynamic_slice_size": (["a = f32[4] parameter(0)", "i = s32[] parameter(1)",
                            "r = f32[5] dynamic-slice(a, i), dynamic_slice_sizes={5}"], "does not fit"),
    "dynamic_update_too_big": (["a = f32[4] parameter(0)", "u = f32[5] parameter(1)", "i = s32[] parameter(2)",
                                "r = f32[4] dynamic-update-slice(a, u, i)"], "does not fit"),
    "pad_negative": (["a = f32[2] parameter(0)", "z = f32[] constant(0)", "r = f32[0] pad(a, z), padding=-2_-1"],
                     "invalid"),
    "concatenate_mismatch": (["a = f32[2,3] parameter(0)", "b = f32[2,4] parameter(1)",
                              "r = f32[4,3] concatenate(a, b), dimensions={0}"], "outside dimension 0"),
    "iota_dimension": (["r = s32[4] iota(), iota_dimension=1"], "out of range"),
    "reduce_dimension": (["a = f32[4] parameter(0)", "z = f32[] constant(0)",
                          "r = f32[] reduce(a, z), dimensions={1}, to_apply=add"], "out of range"),
    "reduce_result": (["a = f32[4,5] parameter(0)", "z = f32[] constant(0)",
                       "r = f32[4] reduce(a, z), dimensions={0}, to_apply=add"], "does not match the inferred f32[5]"),
    "reduce_window_rank": (["a = f32[4,5] parameter(0)", "z = f32[] constant(0)",
                            "r = f32[2] reduce-window(a, z), window={size=2}, to_apply=add"], "must have 2 dimension"),
    "select_and_scatter_source": (["a = f32[4,6] parameter(0)", "s = f32[2,2] parameter(1)", "z = f32[] constant(0)",
                                   "r = f32[4,6] select-and-scatter(a, s, z), window={size=2x2 stride=2x2}, "
                                   "select=ge, scatter=add"], "source"),
    "dot_contracting": (["a = f32[2,3] parameter(0)", "b = f32[4,5] parameter(1)",
                         "r = f32[2,5] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"],
                        "contracting dimension sizes differ"),
    "dot_batch_count": (["a = f32[2,3] parameter(0)", "b = f32[3,5] parameter(1)",
                         "r = f32[2,5] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={1}, "
                         "rhs_contracting_dims={0}"], "as many batch"),
    "convolution_features": (["a = f32[2,8,3] parameter(0)", "k = f32[3,4,16] parameter(1)",
                              "r = f32[2,6,16] convolution(a, k), window={size=3}, dim_labels=b0f_0io->b0f"],
                             "input features"),
    "convolution_window": (["a = f32[2,8,3] parameter(0)", "k = f32[3,3,16] parameter(1)",
                            "r = f32[2,7,16] convolution(a, k), window={size=2}, dim_labels=b0f_0io->b0f"],
                           "window sizes"),
    "convolution_result": (["a = f32[2,8,3] parameter(0)", "k = f32[3,3,16] parameter(1)",
                            "r = f32[2,8,16] convolution(a, k), window={size=3}, dim_labels=b0f_0io->b0f"],
                           "does not match the inferred f32[2,6,16]"),
    "gather_dims": (["a = f32[10,8] parameter(0)", "i = s32[5,1] parameter(1)",
                     "r = f32[5,8] gather(a, i), offset_dims={1}, collapsed_slice_dims={}, start_index_map={0}, "
                     "index_vector_dim=1, slice_sizes={1,8}"], "every operand dimension"),
    "gather_slice_size": (["a = f32[10,8] parameter(0)", "i = s32[5,1] parameter(1)",
                           "r = f32[5,9] gather(a, i), offset_dims={1}, collapsed_slice_dims={0}, "
                           "start_index_map={0}, index_vector_dim=1, slice_sizes={1,9}"], "slice_sizes"),
    "scatter_updates": (["a = f32[10,8] parameter(0)", "i = s32[5,1] parameter(1)", "u = f32[4,8] parameter(2)",
                         "r = f32[10,8] scatter(a, i, u), update_window_dims={1}, inserted_window_dims={0}, "
                         "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add"], "updates"),
    "sort_operands": (["a = f32[4] parameter(0)", "b = s32[5] parameter(1)",
                       "r = (f32[4], s32[5]) sort(a, b), dimensions={0}, to_apply=lt"], "differs from operand 0"),
    "topk_k": (["a = f32[4] parameter(0)", "r = (f32[5], s32[5]) topk(a), k=5, largest=true"], "does not fit"),
    "rfft_length": (["a = f32[6] parameter(0)", "r = c64[5] fft(a), fft_type=RFFT, fft_length={8}"], "RFFT needs"),
    "cholesky_square": (["a = f32[3,4] parameter(0)", "r = f32[3,4] cholesky(a), lower=true"], "square"),
    "triangular_solve_shared": (["a = f32[4,4] parameter(0)", "b = f32[3,2] parameter(1)",
                                 "r = f32[3,2] triangular-solve(a, b), left_side=true, transpose_a=NO_TRANSPOSE"],
                                "does not match a"),
    "get_tuple_element_index": (["a = (f32[4]) parameter(0)", "r = f32[4] get-tuple-element(a), index=1"],
                                "out of range"),
    "all_gather_participants": (["p = f32[8,3] parameter(0)",
                                 "r = f32[24,3] all-gather(p), replica_groups={{0,1}}, dimensions={0}"],
                                "imply 3 participants but the groups have 2"),
    "reduce_scatter_split": (["p = f32[6,3] parameter(0)",
                              "r = f32[1,3] reduce-scatter(p), replica_groups={{0,1,2,3}}, dimensions={0}, "
                              "to_apply=add"], "participants"),
    "all_to_all_operands": (["p = f32[4] parameter(0)",
                             "r = (f32[4], f32[4], f32[4]) all-to-all(p, p, p), replica_groups={{0,1}}"],
                            "one operand per participant (2), got 3"),
    "all_gather_start_result": (["p = f32[8] parameter(0)",
                                 "r = (f32[8], f32[8]) all-gather-start(p), replica_groups={{0,1}}, dimensions={0}"],
                                "participants"),
    "async_done_operand": (["p = f32[8] parameter(0)", "r = f32[8] async-done(p)"], "must be a tuple"),
    "async_start_wrapped": (["p = f32[8] parameter(0)", "r = ((f32[8]), f32[4], s32[]) async-start(p), calls=neg8"],
                            "does not match the inferred"),
    "copy_done_result": (["p = f32[8] parameter(0)", "s = (f32[8], f32[8], u32[]) copy-start(p)",
                          "r = f32[4] copy-done(s)"], "does not match the inferred f32[8]"),
    "send_token": (["p = f32[8] parameter(0)", "r = (f32[8], u32[], token[]) send(p, p), channel_id=1"],
                   "must be a token"),
    "rng_bit_generator_state": (["p = u64[2] parameter(0)",
                                 "r = (u64[3], u32[4]) rng-bit-generator(p), algorithm=rng_default"],
                                "does not match the inferred"),
    "conditional_index": (["i = f32[] parameter(0)", "p = f32[8] parameter(1)",
                           "r = f32[8] conditional(i, p), branch_computations={neg8}"], "branch index"),
    "while_operand_count": (["a = s32[] parameter(0)", "r = s32[] while(a, a), condition=cond, body=body"],
                            "takes 1 operand(s)"),
    "call_result": (["p = f32[8] parameter(0)", "r = f32[4] call(p), to_apply=neg8"], "does not match the inferred f32[8]"),
    "after_all_operand": (["p = f32[8] parameter(0)", "r = token[] after-all(p)"], "must be a token"),
    "batch_norm_features": (["a = f32[2,3] parameter(0)", "s = f32[2] parameter(1)",
                             "r = (f32[2,3], f32[3], f32[3]) batch-norm-training(a, s, s), epsilon=0.001, "
                             "feature_index=1"], "must be f32[3]"),
    "dimension_size_dim": (["a = f32[2,3] parameter(0)", "r = s32[] get-dimension-size(a), dimensions={2}"],
                           "out of range"),
    "ragged_dot_dims": (["l = f32[11,5] parameter(0)", "g = f32[3,5,7] parameter(1)", "s = s32[3] parameter(2)",
                         "r = f32[11,7] ragged-dot(l, g, s), lhs_contracting_dims={1}, rhs_contracting_dims={1}, "
                         "lhs_ragged_dims={0,1}, rhs_group_dims={0}"], "exactly one lhs ragged dimension"),
    "map_result": (["p = f32[4] parameter(0)", "r = f32[5] map(p, p), dimensions={0}, to_apply=add"],
                   "does not match the inferred f32[4]"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_shapes_are_explained(name):
    lines, expected = INVALID[name]
    module = _module(lines)
    message = check_shape(module.entry.root)
    assert message is not None and expected in message, message


# ----------------------------------------------------------------------------- API


def test_every_opcode_has_a_rule():
    assert not sorted(OPCODES - set(INFERENCE_RULES))
    assert rule_for("reduce-scatter-start") is not None and rule_for("custom-call-done") is not None
    assert rule_for("no-such-op") is None


@pytest.mark.parametrize("line, what", [
    ("r = convert(p)", "convert"), ("r = broadcast(p), dimensions={0}", "broadcast"),
    ("r = reshape(p)", "reshape"), ("r = custom-call(p), custom_call_target=\"x\"", "custom-call"),
    ("r = bitcast-convert(p)", "bitcast-convert"),
])
def test_result_type_cannot_be_inferred(line, what):
    module = _module(["p = f32[4] parameter(0)", line.replace("r = ", "r = f32[4] ")])
    inst = module.entry.root
    with pytest.raises(ShapeInferenceError, match="cannot be inferred"):
        infer_shape(inst)
    assert shapes_compatible(expected_shape(inst, inst.shape), inst.shape) or what == "bitcast-convert"
    with pytest.raises(hlo.HloParseError, match="write its result shape"):
        hlo.parse(f"HloModule t\nENTRY e {{\n  p = f32[4] parameter(0)\n  ROOT {line}\n}}\n")


def test_dot_result_type_comes_from_the_written_shape():
    dot = _module(VALID["dot_preferred_type"]).entry.root
    assert infer_shape(dot) == Shape("bf16", (4, 3))  # without a written type: the operands' type
    assert expected_shape(dot, dot.shape) == Shape("f32", (4, 3))
    mixed = _module(["a = bf16[4,5] parameter(0)", "b = f32[5,3] parameter(1)",
                     "r = f32[4,3] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"]).entry.root
    assert check_shape(mixed) is None
    with pytest.raises(ShapeInferenceError, match="write the result type"):
        infer_shape(mixed)


def test_layouts_and_dynamic_markers_are_ignored():
    module = _module(["p = f32[2,3]{0,1} parameter(0)", "r = f32[2,3]{1,0} negate(p)"])
    assert check_shape(module.entry.root) is None
    assert shapes_compatible(Shape("f32", (4,), (True,)), Shape("f32", (4,)))
    assert not shapes_compatible(TupleShape((Shape("f32", (4,)),)), Shape("f32", (4,)))


def test_malformed_attributes_raise_inference_errors_only():
    module = _module(["p = f32[2,3] parameter(0)", "r = f32[2,3] concatenate(p, p), dimensions={0,1}"])
    with pytest.raises(ShapeInferenceError):
        infer_shape(module.entry.root)
    module.entry.root.attrs["slice"] = "garbage"
    module.entry.root.opcode = "slice"
    assert "slice" in check_shape(module.entry.root)


def test_builder_infers_shapes():
    module = _module(["p = f32[2,3] parameter(0)", "r = f32[2,3] negate(p)"])
    b = Builder(module.entry, before=module.entry.root)
    p = module.entry.parameter(0)
    t = b.op("transpose", p, dimensions=(1, 0))
    d = b.op("dot", t, p, lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    s = b.op("sort", d, dimensions=(0,), to_apply=module.computation("ge"))
    assert (t.shape.dims, d.shape.dims, s.shape.dims) == ((3, 2), (3, 3), (3, 3))
    with pytest.raises(ShapeInferenceError):
        b.op("add", p, t)
