"""block-scaling-rewriter on XLA's own test cases: the structure XLA's FileCheck expects, then numerics on XLA:CPU.

The cases of ../shared/xla_cases/block_scaling_rewriter/ (expected structure: INDEX.md there) plus the other
inputs of XLA's block_scaling_rewriter_test.cc (quantized lhs only, non-default layouts, padded scales on the
cuDNN path), written inline.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from block_scaling_reference import block_scaled_dot, dequantize, quantize
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.passes.framework.registry import create_pass

from hlopt import hlo, runtime

CASES = {
    "ExpandQuantizeCustomCall", "ExpandDequantizeCustomCall", "ExpandBlockScaledDotGlobalScale",
    "ExpandBlockScaledDotExplicitBlockSize", "CudnnScaledDotSimple", "CudnnScaledDotTransforms",
}


def _case_dir(shared_dir: Path) -> Path:
    path = shared_dir / "xla_cases" / "block_scaling_rewriter"
    if not path.is_dir():
        pytest.skip(f"{path} is not present")
    return path


def _rewrite(text: str, cudnn_version: str | None = None) -> Module:
    module = hlo.parse(text)
    assert create_pass("block-scaling-rewriter", cudnn_version=cudnn_version).run(module)
    hlo.verify(module)
    return module


def _load(shared_dir: Path, name: str, cudnn_version: str | None = None) -> Module:
    return _rewrite((_case_dir(shared_dir) / f"{name}.hlo").read_text(), cudnn_version)


def _body(module: Module) -> Computation:
    """The computation the entry's root now calls (XLA: the custom call becomes a call)."""
    root = module.entry.root
    assert root.opcode == "call" and not any(i.opcode == "custom-call" and "__op$" in str(i.get("custom_call_target"))
                                              for i in module.instructions())
    return root.attrs["to_apply"]


def _ops(comp: Computation) -> list[tuple[str, str]]:
    """(opcode, shape without layout) of every non-parameter instruction, in order."""
    return [(i.opcode, _shape(i)) for i in comp.instructions if i.opcode != "parameter"]


def _shape(inst: Instruction) -> str:
    return inst.shape.to_text(layout=False) if not inst.shape.is_tuple else str(inst.shape.without_layout())


def _one(comp: Computation, opcode: str, **where: object) -> Instruction:
    found = [i for i in comp.instructions if i.opcode == opcode and all(_attr(i, k) == v for k, v in where.items())]
    assert len(found) == 1, f"{opcode} {where}: {found}"
    return found[0]


def _attr(inst: Instruction, key: str) -> object:
    if key == "shape":
        return _shape(inst)
    value = inst.get(key)
    return value.to_text() if hasattr(value, "to_text") else value


def _dequantize_ops(dtype: str, data: str, scale: str, blocks: str, sliced: str | None = None) -> list[tuple[str, str]]:
    """XLA's per-operand sequence: [slice], convert, convert, broadcast [..., n, b], reshape, multiply."""
    head = [("slice", sliced)] if sliced else []
    return head + [("convert", f"{dtype}[{data}]"), ("convert", f"{dtype}[{scale}]"),
                   ("broadcast", f"{dtype}[{blocks}]"), ("reshape", f"{dtype}[{data}]"),
                   ("multiply", f"{dtype}[{data}]")]


def _dot_checks(dot: Instruction, batch: bool = True) -> None:
    contracting = (2,) if batch else (1,)
    assert dot.attrs["lhs_contracting_dims"] == contracting and dot.attrs["rhs_contracting_dims"] == contracting
    assert dot.attrs.get("lhs_batch_dims", ()) == ((0,) if batch else ())
    assert dot.attrs.get("rhs_batch_dims", ()) == ((0,) if batch else ())


def test_all_shared_cases_are_covered(shared_dir: Path) -> None:
    assert {p.stem for p in _case_dir(shared_dir).glob("*.hlo")} == CASES


# ----------------------------------------------------------------------------- expansion cases (VersionInfo{})


def test_expand_quantize_structure(shared_dir: Path) -> None:
    body = _body(_load(shared_dir, "ExpandQuantizeCustomCall"))
    assert _ops(body) == [
        ("reshape", "f32[10,8,32]"), ("constant", "f32[]"), ("reduce", "f32[10,8]"), ("constant", "f32[]"),
        ("broadcast", "f32[10,8]"), ("divide", "f32[10,8]"), ("convert", "f8e5m2[10,8]"), ("convert", "f32[10,8]"),
        ("broadcast", "f32[10,8,32]"), ("reshape", "f32[10,256]"), ("divide", "f32[10,256]"),
        ("convert", "f8e4m3fn[10,256]"), ("tuple", "(f8e4m3fn[10,256], f8e5m2[10,8])"),
    ]
    reduce = _one(body, "reduce")
    assert reduce.attrs["dimensions"] == (2,) and reduce.operand(1).attrs["literal"].scalar() == 0
    amax = reduce.attrs["to_apply"]
    assert amax.root.opcode == "maximum" and [o.opcode for o in amax.root.operands] == ["abs", "abs"]
    emax = [i for i in body.instructions if i.opcode == "constant"][1]
    assert emax.attrs["literal"].scalar() == 256  # 2^(max_exponent(f8e4m3fn) - 1)
    assert _one(body, "broadcast", shape="f32[10,8]").attrs["dimensions"] == ()
    assert _one(body, "broadcast", shape="f32[10,8,32]").attrs["dimensions"] == (0, 1)
    scale = _one(body, "convert", shape="f8e5m2[10,8]")
    assert body.root.operands[1] is scale and body.root.operands[0].opcode == "convert"
    assert _one(body, "divide", shape="f32[10,256]").operand(0).opcode == "parameter"


def test_expand_dequantize_structure(shared_dir: Path) -> None:
    body = _body(_load(shared_dir, "ExpandDequantizeCustomCall"))
    assert _ops(body) == _dequantize_ops("f32", "10,256", "10,8", "10,8,32")
    assert _one(body, "broadcast").attrs["dimensions"] == (0, 1)
    assert body.root.opcode == "multiply" and body.root.operand(0).operand(0).opcode == "parameter"


def test_expand_block_scaled_dot_global_scale_structure(shared_dir: Path) -> None:
    body = _body(_load(shared_dir, "ExpandBlockScaledDotGlobalScale"))
    assert _ops(body) == (_dequantize_ops("f32", "4,16,256", "4,16,8", "4,16,8,32")
                          + _dequantize_ops("f32", "4,32,256", "4,32,8", "4,32,8,32")
                          + [("dot", "f32[4,16,32]"), ("broadcast", "f32[4,16,32]"), ("multiply", "f32[4,16,32]")])
    _dot_checks(_one(body, "dot"))
    bc = _one(body, "broadcast", shape="f32[4,16,32]")
    assert bc.attrs["dimensions"] == () and bc.operand(0).attrs["parameter_number"] == 4
    assert body.root.opcode == "multiply" and body.root.operand(0).opcode == "dot"


def test_expand_block_scaled_dot_explicit_block_size_structure(shared_dir: Path) -> None:
    body = _body(_load(shared_dir, "ExpandBlockScaledDotExplicitBlockSize"))
    assert _ops(body) == (
        _dequantize_ops("f32", "4,16,224", "4,16,7", "4,16,7,32", sliced="f8e5m2[4,16,7]")
        + _dequantize_ops("f32", "4,32,224", "4,32,7", "4,32,7,32", sliced="f8e5m2[4,32,7]")
        + [("dot", "f32[4,16,32]")])
    for s in (i for i in body.instructions if i.opcode == "slice"):
        assert s.operand(0).opcode == "parameter" and all(st == 0 for st, _, _ in s.attrs["slice"])
    _dot_checks(body.root)


def _f8(shape: tuple[int, ...], dtype: type, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _scales(shape: tuple[int, ...], dtype: type, rng: np.random.Generator) -> np.ndarray:
    return np.exp2(rng.integers(-4, 4, shape)).astype(np.float32).astype(dtype)


def test_expansion_cases_run_on_cpu(shared_dir: Path) -> None:
    rng = np.random.default_rng(0)
    e4m3, e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2

    x = (rng.standard_normal((10, 256)) * np.exp2(rng.integers(-6, 6, (10, 1)))).astype(np.float32)
    q, s = runtime.execute(_load(shared_dir, "ExpandQuantizeCustomCall"), [x])
    want_q, want_s = quantize(x, e4m3, e5m2, 32)
    assert q.dtype == e4m3 and s.dtype == e5m2
    np.testing.assert_array_equal(q.astype(np.float32), want_q.astype(np.float32))
    np.testing.assert_array_equal(s.astype(np.float32), want_s.astype(np.float32))

    data, scale = _f8((10, 256), e4m3, rng), _scales((10, 8), e5m2, rng)
    out = runtime.execute(_load(shared_dir, "ExpandDequantizeCustomCall"), [data, scale])[0]
    np.testing.assert_array_equal(out, dequantize(data, scale))

    for name, k, g in [("ExpandBlockScaledDotGlobalScale", 256, np.float32(0.375)),
                       ("ExpandBlockScaledDotExplicitBlockSize", 224, None)]:
        args = [_f8((4, 16, k), e4m3, rng), _f8((4, 32, k), e4m3, rng),
                _scales((4, 16, 8), e5m2, rng), _scales((4, 32, 8), e5m2, rng)] + ([g] if g is not None else [])
        out = runtime.execute(_load(shared_dir, name), args)[0]
        want = block_scaled_dot(*args[:4], global_scale=g, block=32)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# ----------------------------------------------------------------------------- cuDNN cases (9.10)


def _swizzle_ops(scale: str, tiled: str, moved: str, padded: str | None = None) -> list[tuple[str, str]]:
    head = [("constant", "f8e8m0fnu[]"), ("pad", padded)] if padded else []
    return head + [("reshape", f"f8e8m0fnu[{tiled}]"), ("transpose", f"f8e8m0fnu[{moved}]"),
                   ("reshape", f"f8e8m0fnu[{scale}]")]


def _swizzled(reshape: Instruction) -> Instruction:
    """What the swizzle reshape(transpose(reshape(x))) starts from."""
    assert [reshape.opcode, reshape.operand(0).opcode, reshape.operand(0).operand(0).opcode] == [
        "reshape", "transpose", "reshape"]
    return reshape.operand(0).operand(0).operand(0)


def _check_transposes(body: Computation) -> None:
    for t in (i for i in body.instructions if i.opcode == "transpose"):
        assert t.attrs["dimensions"] == (0, 1, 4, 3, 2, 5)
        assert t.shape.layout.minor_to_major == (5, 2, 3, 4, 1, 0)  # XLA: a bitcast-like transpose


def test_cudnn_scaled_dot_simple(shared_dir: Path) -> None:
    body = _body(_load(shared_dir, "CudnnScaledDotSimple", "9.10"))
    assert _ops(body) == (_swizzle_ops("4,128,4", "4,1,4,32,1,4", "4,1,1,32,4,4") * 2
                          + [("custom-call", "(f16[4,128,128], u8[0])"), ("get-tuple-element", "f16[4,128,128]")])
    _check_transposes(body)
    call = _one(body, "custom-call")
    assert call.attrs["custom_call_target"] == "__cudnn$blockScaledDot"
    assert [o.opcode for o in call.operands] == ["parameter", "parameter", "reshape", "reshape"]
    assert [_swizzled(o).attrs["parameter_number"] for o in call.operands[2:]] == [2, 3]
    assert body.root.opcode == "get-tuple-element" and body.root.attrs["index"] == 0


def test_cudnn_scaled_dot_transforms(shared_dir: Path) -> None:
    body = _body(_load(shared_dir, "CudnnScaledDotTransforms", "9.10"))
    assert _ops(body) == (
        [("constant", "f8e4m3fn[]"), ("pad", "f8e4m3fn[128,96]")]
        + _swizzle_ops("128,4", "1,1,4,32,1,4", "1,1,1,32,4,4", padded="f8e8m0fnu[128,4]") * 2
        + [("custom-call", "(f16[128,128], u8[0])"), ("get-tuple-element", "f16[128,128]"),
           ("slice", "f16[128,120]")])
    _check_transposes(body)
    pads = [i for i in body.instructions if i.opcode == "pad"]
    assert [p.attrs["padding"].to_text() for p in pads] == ["0_8x0_0", "0_0x0_1", "0_8x0_1"]
    call = _one(body, "custom-call")
    assert call.operand(0).opcode == "parameter" and call.operand(1) is pads[0]
    assert body.root.attrs["slice"] == ((0, 128, 1), (0, 120, 1))


@pytest.mark.parametrize("name", ["CudnnScaledDotSimple", "CudnnScaledDotTransforms"])
def test_cudnn_cases_expand_without_cudnn(shared_dir: Path, name: str) -> None:
    """VersionInfo{} (and anything below 9.10): plain HLO, which runs on XLA:CPU."""
    for version in (None, "9.9"):
        module = _load(shared_dir, name, version)
        assert _one(_body(module), "dot").shape.dtype == "f16"
        assert not any(i.opcode == "custom-call" for i in module.instructions())


# ----------------------------------------------------------------------------- XLA's other tests (inline)

_NON_DEFAULT_LAYOUT = """HloModule test
ENTRY main {
  %lhs = f8e4m3fn[4,16,256]{2,0,1} parameter(0)
  %rhs = f8e4m3fn[4,32,256]{0,1,2} parameter(1)
  %lhs_scale = f8e5m2[4,16,8]{2,0,1} parameter(2)
  %rhs_scale = f8e5m2[4,32,8]{0,1,2} parameter(3)
  ROOT %result = f32[4,16,32] custom-call(%lhs, %rhs, %lhs_scale, %rhs_scale),
      custom_call_target="__op$block_scaled_dot"
}"""

_QUANTIZED_LHS = """HloModule test
ENTRY main {
  %lhs = f8e4m3fn[16,256] parameter(0)
  %rhs = f16[32,256] parameter(1)
  %lhs_scale = f8e5m2[16,8] parameter(2)
  ROOT %result = f16[16,32] custom-call(%lhs, %rhs, %lhs_scale),
      custom_call_target="__op$block_scaled_dot"
}"""

_PADDED_SCALES = """HloModule test
ENTRY main {
  %lhs = f8e4m3fn[4,120,96] parameter(0)
  %rhs = f8e4m3fn[4,120,96] parameter(1)
  %lhs_scale = f8e8m0fnu[4,128,4] parameter(2)
  %rhs_scale = f8e8m0fnu[4,128,4] parameter(3)
  ROOT %result = f16[4,120,120] custom-call(%lhs, %rhs, %lhs_scale, %rhs_scale),
      custom_call_target="__op$block_scaled_dot",
      backend_config={"block_scaled_dot_backend_config":{block_size:32}}
}"""


def _layout(inst: Instruction) -> tuple[int, ...]:
    return inst.shape.layout.minor_to_major


def test_expand_non_default_layout() -> None:
    body = _body(_rewrite(_NON_DEFAULT_LAYOUT))
    converts = [i for i in body.instructions if i.opcode == "convert"]
    assert [_layout(c) for c in converts] == [(2, 0, 1), (2, 0, 1), (0, 1, 2), (0, 1, 2)]
    assert [_layout(b) for b in body.instructions if b.opcode == "broadcast"] == [(3, 0, 2, 1), (0, 1, 3, 2)]
    assert [_layout(r) for r in body.instructions if r.opcode == "reshape"] == [(2, 0, 1), (0, 1, 2)]
    assert _layout(body.root) == (2, 1, 0) and body.root.opcode == "dot"


def test_expand_quantized_lhs_only() -> None:
    body = _body(_rewrite(_QUANTIZED_LHS, "9.13"))  # one scale: never cuDNN
    assert _ops(body) == _dequantize_ops("f16", "16,256", "16,8", "16,8,32") + [("dot", "f16[16,32]")]
    assert body.root.operand(1).opcode == "parameter" and body.root.operand(1).shape.dtype == "f16"
    _dot_checks(body.root, batch=False)


def test_cudnn_padded_scales() -> None:
    body = _body(_rewrite(_PADDED_SCALES, "9.10"))
    pads = [i for i in body.instructions if i.opcode == "pad"]
    assert [(p.attrs["padding"].to_text(), _shape(p)) for p in pads] == [("0_0x0_8x0_0", "f8e4m3fn[4,128,96]")] * 2
    assert [_shape(i) for i in body.instructions if i.opcode == "transpose"] == ["f8e8m0fnu[4,1,1,32,4,4]"] * 2
    call = _one(body, "custom-call")
    assert list(call.operands[:2]) == pads and _shape(call) == "(f16[4,128,128], u8[0])"
    assert [_swizzled(o).opcode for o in call.operands[2:]] == ["parameter", "parameter"]  # not padded
    assert body.root.attrs["slice"] == ((0, 4, 1), (0, 120, 1), (0, 120, 1))


def test_non_default_layout_and_quantized_lhs_run_on_cpu() -> None:
    rng = np.random.default_rng(1)
    e4m3, e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
    args = [_f8((4, 16, 256), e4m3, rng), _f8((4, 32, 256), e4m3, rng),
            _scales((4, 16, 8), e5m2, rng), _scales((4, 32, 8), e5m2, rng)]
    out = runtime.execute(_rewrite(_NON_DEFAULT_LAYOUT), args)[0]
    want = block_scaled_dot(*args)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

    args = [_f8((16, 256), e4m3, rng), rng.standard_normal((32, 256)).astype(np.float16),
            np.exp2(rng.integers(-2, 2, (16, 8))).astype(np.float32).astype(e5m2)]
    out = runtime.execute(_rewrite(_QUANTIZED_LHS), args)[0]
    want = block_scaled_dot(args[0], args[1], args[2], dtype=np.float16)
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=0.1)


def test_padded_scales_expansion_runs_on_cpu() -> None:
    rng = np.random.default_rng(2)
    e4m3, e8m0 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu
    args = [_f8((4, 120, 96), e4m3, rng), _f8((4, 120, 96), e4m3, rng),
            _scales((4, 128, 4), e8m0, rng), _scales((4, 128, 4), e8m0, rng)]
    module = _rewrite(_PADDED_SCALES)
    assert [_shape(i) for i in _body(module).instructions if i.opcode == "slice"] == ["f8e8m0fnu[4,120,3]"] * 2
    out = runtime.execute(module, args)[0]
    want = block_scaled_dot(*args, block=32, dtype=np.float16)
    np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-2)
