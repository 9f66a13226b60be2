"""block-scaling-rewriter on what jax produces: numerics on XLA:CPU, the cuDNN path, composites, errors.

Numerics: the expansion of real `jax.nn.scaled_matmul` modules (lowered for CUDA) run on XLA:CPU equals the
independent numpy reference (tests/block_scaling_reference.py) and `jax.lax.scaled_dot` on the same inputs.
The cuDNN path cannot run here: its structure is checked, and its pad/swizzle part is run on XLA:CPU against
the reference's tile layout.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from block_scaling_reference import (
    FORMATS,
    BlockFormat,
    block_scaled_dot,
    cudnn_pad,
    cudnn_swizzle,
    format_error_bound,
    quantize,
    quantize_error_bound,
    random_block_scaled_operands,
)
from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Instruction, Module
from hlopt.passes.block_scaling_rewriter import BlockScalingError, BlockScalingRewriter
from hlopt.passes.framework.pipeline import PassFailure, parse_pipeline, run_pipeline
from hlopt.passes.framework.registry import PassOptionError, create_pass
from jax import lax
from jax._src.cudnn.scaled_matmul_stablehlo import _scaled_matmul

from hlopt import hlo, runtime

PASS = "block-scaling-rewriter"
MIXED = BlockFormat("mxfp8_mixed", ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, 32)  # rhs made e5m2 below


# ----------------------------------------------------------------------------- helpers


def _lower(fn, *args) -> Module:
    """fn lowered for CUDA (works without a GPU), parsed."""
    return hlo.parse(jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo"))


def _scaled_matmul_module(args: list[np.ndarray], padded: bool = False) -> Module:
    """jax.nn.scaled_matmul (or, for pre-padded scales, the primitive behind it) on these arguments."""
    if padded:
        return _lower(lambda a, b, sa, sb: _scaled_matmul(a, b, sa, sb, preferred_element_type=np.dtype("float32")),
                      *args)
    return _lower(lambda a, b, sa, sb: jax.nn.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.float32),
                  *args)


def _lax_scaled_dot(args: list[np.ndarray]) -> np.ndarray:
    """jax.lax.scaled_dot of [B,M,K] x [B,N,K], run by jax on the CPU."""
    dims = (((2,), (2,)), ((0,), (0,)))
    fn = jax.jit(lambda a, b, sa, sb: lax.scaled_dot(a, b, lhs_scale=sa, rhs_scale=sb, dimension_numbers=dims,
                                                     preferred_element_type=jnp.float32))
    return np.asarray(fn(*args))


def _operands(fmt: BlockFormat, batch: int, m: int, n: int, k: int, seed: int) -> list[np.ndarray]:
    args = random_block_scaled_operands(fmt, batch, m, n, k, seed=seed)
    if fmt is MIXED:
        args[1] = args[1].astype(np.float32).astype(ml_dtypes.float8_e5m2)
    return args


def _custom_call(module: Module, target: str) -> Instruction:
    found = [i for i in module.instructions() if i.opcode == "custom-call" and i.get("custom_call_target") == target]
    assert len(found) == 1, found
    return found[0]


def _with_global_scale(module: Module) -> Module:
    """The jax module with a 5th operand: an f32[] global scale passed to the custom call."""
    dot = _custom_call(module, "__op$block_scaled_dot")
    module.config.pop("entry_computation_layout", None)
    entry, inner = module.entry, dot.parent
    outer = Builder(entry, before=entry.root).parameter(4, hlo.parse_shape("f32[]"), name="global_scale")
    inner_param = Builder(inner, before=dot).parameter(4, hlo.parse_shape("f32[]"), name="inner_global_scale")
    entry.root.add_operand(outer)
    dot.add_operand(inner_param)
    constraints = str(dot.attrs["operand_layout_constraints"])  # one per operand, as XLA requires
    dot.attrs["operand_layout_constraints"] = hlo.Raw(constraints[:-1] + ", f32[]}")
    hlo.verify(module)
    return module


def _block_config(block: int) -> str:
    """An explicit block size, as XLA's GpuBackendConfig writes it."""
    return json.dumps({"block_scaled_dot_backend_config": {"block_size": block}})


def _assert_close(out: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def _cudnn_operand_module(module: Module) -> Module:
    """The module cut at the cuDNN call: it returns the call's operands (the padded data, swizzled scales)."""
    run_pipeline(module, "call-inliner")
    call = _custom_call(module, "__cudnn$blockScaledDot")
    entry = module.entry
    old = entry.root
    entry.set_root(Builder(entry).tuple(*call.operands))
    entry.remove_dead(old)
    module.config.pop("entry_computation_layout", None)
    return module


def _pad_rows(x: np.ndarray, rows: int, blocks: int | None = None, value: float = 0.0) -> np.ndarray:
    """x padded at the high end of dim -2 (to `rows`) and dim -1 (to `blocks`) with `value` in x's type."""
    pad = [(0, 0)] * (x.ndim - 2) + [(0, rows - x.shape[-2]), (0, (blocks or x.shape[-1]) - x.shape[-1])]
    fill = np.asarray(value, np.float32).astype(x.dtype)
    if value == 0 and x.dtype == ml_dtypes.float8_e8m0fnu:
        fill = np.zeros((), np.uint8).view(x.dtype)  # no zero: XLA's Zero is the all-zero bits, 2^-127
    return np.pad(x, pad, constant_values=fill)


# ----------------------------------------------------------------------------- numerics of the expansion


@pytest.mark.parametrize("fmt", [FORMATS["mxfp8"], MIXED, FORMATS["nvfp4"]], ids=lambda f: f.name)
@pytest.mark.parametrize("batch", [1, 3])
def test_scaled_matmul_expansion_matches_reference_and_lax(fmt: BlockFormat, batch: int) -> None:
    args = _operands(fmt, batch, 16, 24, 64, seed=batch)
    module = _scaled_matmul_module(args)
    _custom_call(module, "__op$block_scaled_dot")
    assert run_pipeline(module, PASS).changed
    assert not any(i.opcode == "custom-call" for i in module.instructions())
    out = runtime.execute(module, args)[0]
    _assert_close(out, block_scaled_dot(*args))
    _assert_close(out, _lax_scaled_dot(args))


@pytest.mark.parametrize("fmt", [FORMATS["mxfp8"], FORMATS["nvfp4"]], ids=lambda f: f.name)
def test_global_scale_operand(fmt: BlockFormat) -> None:
    args = _operands(fmt, 2, 16, 8, 64, seed=7)
    module = _with_global_scale(_scaled_matmul_module(args))
    assert run_pipeline(module, PASS).changed
    g = np.float32(0.3)
    out = runtime.execute(module, [*args, g])[0]
    _assert_close(out, block_scaled_dot(*args, global_scale=g))
    _assert_close(out, _lax_scaled_dot(args) * g)


@pytest.mark.parametrize("fmt", [FORMATS["mxfp8"], FORMATS["nvfp4"]], ids=lambda f: f.name)
def test_prepadded_scales(fmt: BlockFormat) -> None:
    """Scales padded to cuDNN's tiles (rows to 128, blocks to a multiple of 4) are cut back on expansion."""
    args = _operands(fmt, 2, 100, 24, 3 * fmt.block, seed=3)
    junk = 1024.0  # NaN in f8e4m3fn: any use of the padding would show
    padded = [args[0], args[1]] + [_pad_rows(s, 128, 4, junk) for s in args[2:]]
    module = _scaled_matmul_module(padded, padded=True)
    call = _custom_call(module, "__op$block_scaled_dot")
    call.attrs["backend_config"] = hlo.attributes.Raw(_block_config(fmt.block))
    assert run_pipeline(module, PASS).changed
    body = [c for c in module.computations if any(i.opcode == "dot" for i in c.instructions)][0]
    assert [i.shape.dims for i in body.instructions if i.opcode == "slice"] == [(2, 100, 3), (2, 24, 3)]
    out = runtime.execute(module, padded)[0]
    _assert_close(out, block_scaled_dot(*padded, block=fmt.block))
    _assert_close(out, _lax_scaled_dot(args))


def test_partial_last_block_with_explicit_block_size() -> None:
    """K=80 with block 32: three scales, the last one covering 16 elements (XLA would re-infer block 26)."""
    fmt = FORMATS["mxfp8"]
    args = _operands(fmt, 1, 8, 8, 80, seed=5)
    text = _dot_text("f8e4m3fn[1,8,80]", "f8e4m3fn[1,8,80]", "f8e8m0fnu[1,8,3]", "f8e8m0fnu[1,8,3]", "f32[1,8,8]",
                     backend_config=_block_config(32))
    module = hlo.parse(text)
    assert run_pipeline(module, PASS).changed
    _assert_close(runtime.execute(module, args)[0], block_scaled_dot(*args, block=32))


def _round_trip_text(fmt: BlockFormat, rows: int, k: int) -> str:
    data = hlo.shape.dtype_of_numpy(np.dtype(fmt.data))
    scale = hlo.shape.dtype_of_numpy(np.dtype(fmt.scale))
    d, s = f"{data}[{rows},{k}]", f"{scale}[{rows},{k // fmt.block}]"
    return f"""HloModule round_trip
ENTRY main {{
  %x = f32[{rows},{k}] parameter(0)
  %q = ({d}, {s}) custom-call(%x), custom_call_target="__op$quantize"
  %d = {d} get-tuple-element(%q), index=0
  %s = {s} get-tuple-element(%q), index=1
  %r = f32[{rows},{k}] custom-call(%d, %s), custom_call_target="__op$dequantize"
  ROOT %t = ({d}, {s}, f32[{rows},{k}]) tuple(%d, %s, %r)
}}"""


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_quantize_dequantize_round_trip(fmt: BlockFormat) -> None:
    rng = np.random.default_rng(11)
    low = -4 if fmt.name == "nvfp4" else -12  # e4m3 scales of NVFP4 have a narrow range
    x = (rng.standard_normal((16, 256)) * np.exp2(rng.integers(low, 8, (16, 1)))).astype(np.float32)
    module = hlo.parse(_round_trip_text(fmt, 16, 256))
    assert run_pipeline(module, PASS).changed
    q, s, y = runtime.execute(module, [x])
    want_q, want_s = quantize(x, fmt.data, fmt.scale, fmt.block)
    np.testing.assert_array_equal(q.astype(np.float32), want_q.astype(np.float32))
    np.testing.assert_array_equal(s.astype(np.float32), want_s.astype(np.float32))
    error = np.abs(y.astype(np.float64) - x)
    assert (error <= quantize_error_bound(x, s, fmt.data, fmt.block) * (1 + 1e-6)).all()
    assert (error <= format_error_bound(x, fmt.data, fmt.block)).all()


# ----------------------------------------------------------------------------- the cuDNN path


def _dot_text(lhs: str, rhs: str, lhs_scale: str, rhs_scale: str | None, result: str, global_scale: bool = False,
              backend_config: str | None = None) -> str:
    names = ["lhs", "rhs", "lhs_scale"] + (["rhs_scale"] if rhs_scale else []) + (["g"] if global_scale else [])
    shapes = [lhs, rhs, lhs_scale] + ([rhs_scale] if rhs_scale else []) + (["f32[]"] if global_scale else [])
    params = "\n".join(f"  %{n} = {s} parameter({i})" for i, (n, s) in enumerate(zip(names, shapes, strict=True)))
    config = f", backend_config={backend_config}" if backend_config else ""
    return (f"HloModule t\nENTRY main {{\n{params}\n  ROOT %r = {result} custom-call("
            + ", ".join(f"%{n}" for n in names) + f'), custom_call_target="__op$block_scaled_dot"{config}\n}}')


@pytest.mark.parametrize("fmt", [FORMATS["mxfp8"], MIXED, FORMATS["nvfp4"]], ids=lambda f: f.name)
def test_cudnn_path_pads_and_swizzles(fmt: BlockFormat) -> None:
    """jax's module with cuDNN 9.10: padded data, scales in 128x4 tiles (checked by running that part)."""
    args = _operands(fmt, 2, 100, 8, 3 * fmt.block, seed=13)
    module = _scaled_matmul_module(args)
    assert run_pipeline(module, f"{PASS}{{cudnn_version=9.10}}").changed
    call = _custom_call(module, "__cudnn$blockScaledDot")
    assert str(call.shape.without_layout()) == "(f32[2,128,128], u8[0])"
    body = call.parent
    assert body.root.opcode == "slice" and body.root.shape.dims == (2, 100, 8)
    assert body.root.operand(0).opcode == "get-tuple-element"
    outs = runtime.execute(_cudnn_operand_module(module), args)
    data_shape, scale_shape = cudnn_pad(args[0].shape, args[2].shape)
    assert (data_shape, scale_shape) == ((2, 128, 3 * fmt.block), (2, 128, 4))
    zero = 0.0  # in the scale type: 2^-127 for f8e8m0fnu (it has no zero), as XLA's pad value
    for got, x in zip(outs[:2], args[:2], strict=True):
        np.testing.assert_array_equal(got.astype(np.float32), _pad_rows(x, 128).astype(np.float32))
    for got, s in zip(outs[2:], args[2:], strict=True):
        want = cudnn_swizzle(_pad_rows(s, 128, 4, zero))
        assert got.dtype == s.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
        assert not np.isnan(got.astype(np.float32)).any()  # XLA:GPU pads e8m0 scales with 2^-127, not NaN


def _global_module(version: str | None, fmt: BlockFormat = FORMATS["nvfp4"]) -> Module:
    args = _operands(fmt, 2, 100, 8, 64, seed=1)
    module = _with_global_scale(_scaled_matmul_module(args))
    run_pipeline(module, PASS if version is None else f"{PASS}{{cudnn_version={version}}}")
    return module


@pytest.mark.parametrize("version, cudnn, inside", [
    (None, False, False), ("9.9", False, False), ("9.10", True, False), ("9.12.1", True, False),
    ("9.13", True, True), ("10", True, True),
])
def test_version_gating_and_global_scale(version: str | None, cudnn: bool, inside: bool) -> None:
    module = _global_module(version)
    calls = [i for i in module.instructions() if i.opcode == "custom-call"]
    if not cudnn:
        assert not calls and any(i.opcode == "dot" for i in module.instructions())
        return
    (call,) = calls
    assert call.operand_count == (5 if inside else 4)
    gte = call.users[0]
    if inside:
        assert call.operand(4).opcode == "parameter" and call.operand(4).shape.dtype == "f32"
        assert [u.opcode for u in gte.users] == ["slice"]
    else:  # cuDNN < 9.13: multiplied outside the call, before the slice
        (mul,) = gte.users
        assert mul.opcode == "multiply" and mul.operand(1).opcode == "broadcast"
        assert mul.operand(1).operand(0).opcode == "parameter" and mul.operand(1).attrs["dimensions"] == ()
        assert [u.opcode for u in mul.users] == ["slice"]


@pytest.mark.parametrize("lhs, rhs, scale, k, config, cudnn", [
    ("f8e4m3fn", "f8e4m3fn", "f8e8m0fnu", 64, None, True),
    ("f8e5m2", "f8e4m3fn", "f8e8m0fnu", 64, None, True),
    ("f8e5m2", "f8e5m2", "f8e8m0fnu", 64, None, False),  # the one MXFP8 pair cuDNN lacks
    ("f8e4m3fn", "f8e4m3fn", "f8e5m2", 64, None, False),  # scale type
    ("f4e2m1fn", "f4e2m1fn", "f8e4m3fn", 32, None, True),  # NVFP4: block 16
    ("f4e2m1fn", "f4e2m1fn", "f8e4m3fn", 64, None, False),  # block 32 is not NVFP4's
    ("f8e4m3fn", "f8e4m3fn", "f8e8m0fnu", 80, 32, False),  # K not a multiple of the block
    ("f8e4m3fn", "f8e4m3fn", "f8e8m0fnu", 96, 32, True),  # explicit block, 4 blocks given for 3
])
def test_cudnn_type_gating(lhs: str, rhs: str, scale: str, k: int, config: int | None, cudnn: bool) -> None:
    blocks = 4 if config else 2
    bc = _block_config(config) if config else None
    text = _dot_text(f"{lhs}[128,{k}]", f"{rhs}[128,{k}]", f"{scale}[128,{blocks}]", f"{scale}[128,{blocks}]",
                     "bf16[128,128]", backend_config=bc)
    module = hlo.parse(text)
    assert run_pipeline(module, f"{PASS}{{cudnn_version=9.13}}").changed
    assert any(i.opcode == "custom-call" for i in module.instructions()) == cudnn


def test_non_default_layout_and_single_scale_are_not_cudnn() -> None:
    text = _dot_text("f8e4m3fn[128,64]{0,1}", "f8e4m3fn[128,64]", "f8e8m0fnu[128,2]", "f8e8m0fnu[128,2]",
                     "f32[128,128]")
    module = hlo.parse(text)
    run_pipeline(module, f"{PASS}{{cudnn_version=9.13}}")
    assert not any(i.opcode == "custom-call" for i in module.instructions())
    module = hlo.parse(_dot_text("f8e4m3fn[128,64]", "f32[128,64]", "f8e8m0fnu[128,2]", None, "f32[128,128]"))
    run_pipeline(module, f"{PASS}{{cudnn_version=9.13}}")
    assert not any(i.opcode == "custom-call" for i in module.instructions())


# ----------------------------------------------------------------------------- xla.scaled_dot composites


def _composite_module(fmt: BlockFormat, m: int = 100, dims=(((2,), (2,)), ((0,), (0,)))) -> tuple[Module, list]:
    args = _operands(fmt, 2, m, 8, 64, seed=4)
    if dims[0][1] == (1,):  # rhs [B,K,N]
        args[1], args[3] = np.swapaxes(args[1], 1, 2), np.swapaxes(args[3], 1, 2)
    fn = lambda a, b, sa, sb: lax.scaled_dot(a, b, lhs_scale=sa, rhs_scale=sb, dimension_numbers=dims,  # noqa: E731
                                             preferred_element_type=jnp.float32)
    return _lower(fn, *args), args


@pytest.mark.parametrize("fmt", [FORMATS["mxfp8"], MIXED, FORMATS["nvfp4"]], ids=lambda f: f.name)
def test_composite_takes_the_cudnn_path(fmt: BlockFormat) -> None:
    module, args = _composite_module(fmt)
    decomposition = module.entry.root.attrs["to_apply"]
    assert run_pipeline(module, f"{PASS}{{cudnn_version=9.10}}").changed
    root = module.entry.root
    assert root.opcode == "call" and "is_composite" not in root.attrs and not root.frontend_attributes
    assert decomposition not in module.computations
    call = _custom_call(module, "__cudnn$blockScaledDot")
    assert call.parent is root.attrs["to_apply"] and root.attrs["to_apply"].root.shape.dims == (2, 100, 8)
    outs = runtime.execute(_cudnn_operand_module(module), args)
    for got, s in zip(outs[2:], args[2:], strict=True):
        np.testing.assert_array_equal(got.astype(np.float32), cudnn_swizzle(_pad_rows(s, 128, 4)).astype(np.float32))


@pytest.mark.parametrize("version, dims, fmt", [
    (None, (((2,), (2,)), ((0,), (0,))), "mxfp8"),  # no cuDNN: composites are not this pass's business
    ("9.10", (((2,), (1,)), ((0,), (0,))), "mxfp8"),  # rhs contracting dimension not last
    ("9.13", (((2,), (2,)), ((0,), (0,))), "mxfp8_e5m2"),  # e5m2 x e5m2
])
def test_composite_left_alone(version: str | None, dims, fmt: str) -> None:
    module, args = _composite_module(FORMATS[fmt], m=16, dims=dims)
    before = module.to_text()
    spec = PASS if version is None else f"{PASS}{{cudnn_version={version}}}"
    assert not run_pipeline(module, spec).changed
    assert module.to_text() == before


# ----------------------------------------------------------------------------- malformed calls


_GOOD = _dot_text("f8e4m3fn[2,16,64]", "f8e4m3fn[2,8,64]", "f8e8m0fnu[2,16,2]", "f8e8m0fnu[2,8,2]", "f32[2,16,8]",
                  global_scale=True)


@pytest.mark.parametrize("old, new, message", [
    (", %g)", ", %g, %g)", "takes 3 to 5 operands"),
    ("(%lhs, %rhs, %lhs_scale, %rhs_scale, %g)", "(%lhs, %rhs)", "takes 3 to 5 operands"),
    ("(%lhs, %rhs, %lhs_scale, %rhs_scale, %g)", "(%lhs, %rhs, %lhs_scale, %g)", "global scale is the 5th"),
    ("%lhs_scale = f8e8m0fnu[2,16,2]", "%lhs_scale = f8e8m0fnu[2,15,2]", "fewer rows"),
    ("%rhs_scale = f8e8m0fnu[2,8,2]", "%rhs_scale = f8e8m0fnu[2,8,3]", "cannot infer the block size"),
    ("%rhs_scale = f8e8m0fnu[2,8,2]", "%rhs_scale = f8e8m0fnu[3,8,2]", "different batch sizes"),
    ("%rhs_scale = f8e8m0fnu[2,8,2]", "%rhs_scale = f8e8m0fnu[16,2]", "must have the rank"),
    ("%rhs = f8e4m3fn[2,8,64]", "%rhs = f8e4m3fn[2,8,32]", "contracting (last) dimensions differ"),
    ("%rhs = f8e4m3fn[2,8,64]", "%rhs = f8e4m3fn[8,64]", "both rank 3"),
    ("ROOT %r = f32[2,16,8]", "ROOT %r = f32[2,16,9]", "should have dimensions"),
    ("ROOT %r = f32[2,16,8]", "ROOT %r = s32[2,16,8]", "floating-point"),
    ("%g = f32[]", "%g = f16[]", "global scale must be a scalar"),
    ("%lhs_scale = f8e8m0fnu[2,16,2]", "%lhs_scale = pred[2,16,2]", "numeric array"),
    ('"__op$block_scaled_dot"', '"__op$block_scaled_dot", backend_config={"block_scaled_dot_backend_config":{}}',
     "block_size must be positive"),
    ('"__op$block_scaled_dot"',
     '"__op$block_scaled_dot", backend_config={"block_scaled_dot_backend_config":{"block_size":16}}',
     "does not cover K"),
])
def test_malformed_block_scaled_dot(old: str, new: str, message: str) -> None:
    assert old in _GOOD
    _assert_rejected(_GOOD.replace(old, new), message)


_QUANTIZE = """HloModule q
ENTRY main {
  %x = f32[4,128] parameter(0)
  ROOT %q = (f8e4m3fn[4,128], f8e8m0fnu[4,4]) custom-call(%x), custom_call_target="__op$quantize"
}"""
_DEQUANTIZE = """HloModule d
ENTRY main {
  %x = f8e4m3fn[4,128] parameter(0)
  %s = f8e8m0fnu[4,4] parameter(1)
  ROOT %d = f32[4,128] custom-call(%x, %s), custom_call_target="__op$dequantize"
}"""


@pytest.mark.parametrize("text, old, new, message", [
    (_QUANTIZE, "custom-call(%x)", "custom-call(%x, %x)", "takes one operand"),
    (_QUANTIZE, "(f8e4m3fn[4,128], f8e8m0fnu[4,4])", "f8e4m3fn[4,128]", "returns (quantized, scale)"),
    (_QUANTIZE, "f8e8m0fnu[4,4])", "f8e8m0fnu[4,3])", "cannot infer the block size"),
    (_QUANTIZE, "f8e8m0fnu[4,4])", "f8e8m0fnu[2,4])", "must match except the last"),
    (_QUANTIZE, "(f8e4m3fn[4,128],", "(f8e4m3fn[4,64],", "dimensions of the input"),
    (_QUANTIZE, "(f8e4m3fn[4,128],", "(s8[4,128],", "floating-point"),
    (_DEQUANTIZE, "custom-call(%x, %s)", "custom-call(%x)", "takes (data, scale)"),
    (_DEQUANTIZE, "%s = f8e8m0fnu[4,4]", "%s = f8e8m0fnu[4,5]", "cannot infer the block size"),
    (_DEQUANTIZE, "ROOT %d = f32[4,128]", "ROOT %d = f32[4,64]", "dimensions of the data"),
])
def test_malformed_quantize_and_dequantize(text: str, old: str, new: str, message: str) -> None:
    assert old in text
    _assert_rejected(text.replace(old, new), message)


def _assert_rejected(text: str, message: str) -> None:
    """The pass raises BlockScalingError, the module is left as it was, and a pipeline names the pass."""
    module = hlo.parse(text)
    before = module.to_text()
    with pytest.raises(BlockScalingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        create_pass(PASS).run(module)
    assert module.to_text() == before
    with pytest.raises(PassFailure, match=PASS):
        run_pipeline(hlo.parse(text), PASS, verify_each=False)


def test_nothing_changes_when_one_call_is_malformed() -> None:
    """All calls are checked before any is rewritten."""
    text = _QUANTIZE.replace("ROOT %q", "%q").replace("}", "") + (
        '  %bad = f32[4,128] custom-call(%x), custom_call_target="__op$dequantize"\n'
        "  ROOT %t = ((f8e4m3fn[4,128], f8e8m0fnu[4,4]), f32[4,128]) tuple(%q, %bad)\n}")
    module = hlo.parse(text)
    before = module.to_text()
    with pytest.raises(BlockScalingError, match="takes \\(data, scale\\)"):
        create_pass(PASS).run(module)
    assert module.to_text() == before


def test_composite_without_attributes_is_an_error_on_the_cudnn_path() -> None:
    module, _ = _composite_module(FORMATS["mxfp8"], m=16)
    del module.entry.root.attrs["frontend_attributes"]["composite.attributes"]
    with pytest.raises(BlockScalingError, match="composite.attributes is not set"):
        create_pass(PASS, cudnn_version="9.10").run(module)


# ----------------------------------------------------------------------------- options


def test_cudnn_version_option() -> None:
    (p,) = parse_pipeline(f"{PASS}{{cudnn_version=9.13}}")
    assert isinstance(p, BlockScalingRewriter) and p.cudnn_version == "9.13" and p.version == (9, 13)
    assert p.describe() == f"{PASS}{{cudnn_version=9.13}}"
    assert create_pass(PASS).version == (0, 0) and create_pass(PASS, cudnn_version="9").version == (9, 0)
    assert create_pass(PASS, cudnn_version="9.10").version > (9, 9)  # 9.10 is not 9.1
    with pytest.raises(PassOptionError, match="not a version"):
        create_pass(PASS, cudnn_version="nine")


def test_prepadded_scales_that_do_not_tile_for_cudnn() -> None:
    text = _dot_text("f8e4m3fn[128,96]", "f8e4m3fn[128,96]", "f8e8m0fnu[130,4]", "f8e8m0fnu[128,4]", "f32[128,128]",
                     backend_config=_block_config(32))
    with pytest.raises(BlockScalingError, match="do not tile into 128 x 4"):
        create_pass(PASS, cudnn_version="9.10").run(hlo.parse(text))
    assert create_pass(PASS).run(hlo.parse(text))  # the expansion takes them


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
@pytest.mark.parametrize("batch, m, n, k", [(1, 128, 128, 256), (4, 100, 72, 512), (2, 1, 256, 1024)])
def test_larger_shapes(fmt: BlockFormat, batch: int, m: int, n: int, k: int) -> None:
    args = _operands(fmt, batch, m, n, k, seed=m + k)
    module = _scaled_matmul_module(args)
    assert run_pipeline(module, PASS).changed
    out = runtime.execute(module, args)[0]
    _assert_close(out, block_scaled_dot(*args))
    _assert_close(out, _lax_scaled_dot(args))
    cudnn = _scaled_matmul_module(args)
    run_pipeline(cudnn, f"{PASS}{{cudnn_version=9.13}}")
    supported = fmt.name != "mxfp8_e5m2"
    assert any(i.opcode == "custom-call" for i in cudnn.instructions()) == supported
