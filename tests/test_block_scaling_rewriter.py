"""block-scaling-rewriter (expansion path): XLA's cases, jax's scaled_matmul, numerics, round trips, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hlo
import runtime
from passes.block_scaling_rewriter import BlockScalingError, reference_block_scaled_dot
from passes.pipeline import run_pipeline

PASS = "block-scaling-rewriter"


def _case(shared_dir, name):
    return hlo.parse_file(shared_dir / "xla_cases" / "block_scaling_rewriter" / f"{name}.hlo")


def _callee_ops(m):
    root = m.entry.root
    assert root.opcode == "call"
    return [i.opcode for i in root.attrs["to_apply"].instructions if i.opcode != "parameter"]


def test_xla_expand_quantize(shared_dir):
    m = _case(shared_dir, "ExpandQuantizeCustomCall")
    assert run_pipeline(m, PASS).changed
    ops = _callee_ops(m)
    assert ops[0] == "reshape" and "reduce" in ops and ops[-1] == "tuple"
    body = m.entry.root.attrs["to_apply"]
    limit = next(i for i in body.instructions if i.opcode == "constant" and i.attrs["literal"].scalar() == 256)
    assert limit.shape.dtype == "f32"  # 2^(maxexp(f8e4m3fn) - 1)
    reduce = next(i for i in body.instructions if i.opcode == "reduce")
    assert reduce.attrs["dimensions"] == (2,) and reduce.shape.dims == (10, 8)
    assert body.root.shape.elements[1].dtype == "f8e5m2"


def test_xla_expand_dequantize(shared_dir):
    m = _case(shared_dir, "ExpandDequantizeCustomCall")
    assert run_pipeline(m, PASS).changed
    assert _callee_ops(m) == ["convert", "convert", "broadcast", "reshape", "multiply"]


@pytest.mark.parametrize("name", ["ExpandBlockScaledDotGlobalScale", "ExpandBlockScaledDotExplicitBlockSize"])
def test_xla_expand_block_scaled_dot(shared_dir, name):
    m = _case(shared_dir, name)
    assert run_pipeline(m, PASS).changed
    ops = _callee_ops(m)
    dot = next(i for i in m.entry.root.attrs["to_apply"].instructions if i.opcode == "dot")
    assert dot.attrs["lhs_batch_dims"] == (0,) and dot.attrs["lhs_contracting_dims"] == (2,)
    assert dot.attrs["rhs_batch_dims"] == (0,) and dot.attrs["rhs_contracting_dims"] == (2,)
    if "GlobalScale" in name:
        assert ops[-2:] == ["broadcast", "multiply"]
    else:
        assert ops.count("slice") == 2  # padded [..,8] scales cut to the 7 blocks of K=224
    inputs = runtime.random_inputs(m, seed=3)
    out = runtime.execute(m, inputs)[0]
    ref = reference_block_scaled_dot(*inputs[:4], inputs[4] if len(inputs) > 4 else None, block=32)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def _scaled_matmul_module(data_type, scale_type, block, batch=2, m=16, n=8, k=64, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, m, k)).astype(data_type)
    b = rng.standard_normal((batch, n, k)).astype(data_type)
    sa = np.exp2(rng.integers(-3, 3, (batch, m, k // block))).astype(scale_type)
    sb = np.exp2(rng.integers(-3, 3, (batch, n, k // block))).astype(scale_type)

    def f(a, b, sa, sb):
        return jax.nn.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.float32)

    text = jax.jit(f).trace(a, b, sa, sb).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")
    return hlo.parse(text), [a, b, sa, sb]


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_jax_scaled_matmul_expands_and_matches_reference(fmt):
    if fmt == "mxfp8":
        module, inputs = _scaled_matmul_module(ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, 32)
    else:
        module, inputs = _scaled_matmul_module(ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e4m3fn, 16)
    assert any(str(i.get("custom_call_target")) == "__op$block_scaled_dot" for i in module.instructions())
    assert run_pipeline(module, PASS).changed
    assert not any(i.opcode == "custom-call" for i in module.instructions())
    out = runtime.execute(module, inputs)[0]
    np.testing.assert_allclose(out, reference_block_scaled_dot(*inputs), rtol=1e-5, atol=1e-4)


def test_quantize_dequantize_round_trip_within_format_bound():
    text = """HloModule q
ENTRY %main (x: f32[4,128]) -> f32[4,128] {
  %x = f32[4,128] parameter(0)
  %q = (f8e4m3fn[4,128], f8e8m0fnu[4,4]) custom-call(%x), custom_call_target="__op$quantize"
  %d = f8e4m3fn[4,128] get-tuple-element(%q), index=0
  %s = f8e8m0fnu[4,4] get-tuple-element(%q), index=1
  ROOT %r = f32[4,128] custom-call(%d, %s), custom_call_target="__op$dequantize"
}"""
    m = hlo.parse(text)
    assert run_pipeline(m, PASS).changed
    x = np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32)
    y = runtime.execute(m, [x])[0]
    blocks = np.abs(x).reshape(4, 4, 32).max(-1, keepdims=True)
    # e4m3 keeps 3 mantissa bits (relative step 2^-3); the e8m0 scale may round amax/256 up to 2x
    bound = np.repeat(blocks, 32, axis=-1).reshape(4, 128) * 2.0 ** -3
    assert (np.abs(y - x) <= bound + 1e-6).all()


@pytest.mark.parametrize("change, message", [
    ("%lhs_scale = f8e5m2[4,16,8]", "%lhs_scale = f8e5m2[4,15,8]"),
    ("f32[4,16,32] custom-call", "f32[4,16,31] custom-call"),
])
def test_malformed_calls_raise(shared_dir, change, message):
    text = (shared_dir / "xla_cases" / "block_scaling_rewriter" / "ExpandBlockScaledDotGlobalScale.hlo").read_text()
    m = hlo.parse(text.replace(change, message))
    from passes.pipeline import PassFailure

    with pytest.raises(PassFailure, match="BlockScalingError"):
        run_pipeline(m, PASS, verify_each=False)
    with pytest.raises(BlockScalingError):
        from passes.registry import create_pass

        create_pass(PASS).run(hlo.parse(text.replace(change, message)))
