"""block-scaling-rewriter: block-scaled quantize / dequantize / dot custom calls to plain HLO or cuDNN.

XLA's BlockScalingRewriter (xla/backends/gpu/transforms/block_scaling_rewriter.cc), an op expander:
each `__op$quantize`, `__op$dequantize` and `__op$block_scaled_dot` custom call becomes a `call` of a new
computation (named after the custom call). Without `cudnn_version` (or below 9.10) everything is expanded
to plain HLO:

    %r = f32[4,16,32] custom-call(%lhs, %rhs, %lhs_scale, %rhs_scale, %g),
        custom_call_target="__op$block_scaled_dot"            // f8e4m3fn[4,16,256] x f8e4m3fn[4,32,256]
  =>
    %r = f32[4,16,32] call(%lhs, %rhs, %lhs_scale, %rhs_scale, %g), to_apply=%r.1
    %r.1 {  // per side: convert(x) * reshape(broadcast(convert(scale)))  ([4,16,8] -> [4,16,8,32] -> [4,16,256])
      ... %dot = f32[4,16,32] dot(%lhs_dq, %rhs_dq), lhs_batch_dims={0}, lhs_contracting_dims={2}, ...
      ROOT %m = f32[4,16,32] multiply(%dot, f32[4,16,32] broadcast(%global_scale), dimensions={})
    }

With `cudnn_version >= 9.10` and a pair cuDNN supports (MXFP8 e4m3/e5m2 with e8m0 scales and block 32,
or NVFP4 e2m1 with e4m3 scales and block 16; default layouts; K a multiple of the block):

    %r.1 {  // f8e4m3fn[128,96] x f8e4m3fn[120,96], scales f8e8m0fnu[128,3] / [120,3]
      %rhs_pad = f8e4m3fn[128,96] pad(%rhs, %zero), padding=0_8x0_0
      %ls = f8e8m0fnu[128,4] pad(%lhs_scale, %zero.1), padding=0_0x0_1       // then the swizzle:
      %lr = f8e8m0fnu[1,1,4,32,1,4] reshape(%ls)
      %lt = f8e8m0fnu[1,1,1,32,4,4]{5,2,3,4,1,0} transpose(%lr), dimensions={0,1,4,3,2,5}
      %lsw = f8e8m0fnu[128,4] reshape(%lt)                                     // (same for the rhs scale)
      %cc = (f16[128,128], u8[0]) custom-call(%lhs, %rhs_pad, %lsw, %rsw),
          custom_call_target="__cudnn$blockScaledDot"
      %gte = f16[128,128] get-tuple-element(%cc), index=0
      ROOT %s = f16[128,120] slice(%gte), slice={[0:128], [0:120]}
    }

A global scale (5th operand) goes into the cuDNN call for cuDNN >= 9.13 and is multiplied after it (before the
slice) for older versions. `xla.scaled_dot` composites (`jax.lax.scaled_dot`) that meet the same cuDNN
conditions (contracting dimension last, batch dimension 0) get the same cuDNN sequence; other composites stay.
Every matched instruction is checked before anything changes: a malformed call raises BlockScalingError and
leaves the module as it was. docs/notes/block-scaling-rewriter.md has the full semantics and the deviations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NoReturn

import ml_dtypes
import numpy as np
from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Computation, Instruction, Module
from hlopt.hlo.literal import Literal
from hlopt.hlo.shape import DTYPES, AnyShape, Layout, Shape, TupleShape, default_layout
from hlopt.passes.framework.base import ExpanderPass, module_opcodes, non_fusion_computations
from hlopt.passes.framework.registry import PassOptionError, register

__all__ = [
    "BlockScalingRewriter", "BlockScalingError", "parse_cudnn_version", "QUANTIZE", "DEQUANTIZE",
    "BLOCK_SCALED_DOT", "CUDNN_BLOCK_SCALED_DOT", "SCALED_DOT_COMPOSITE", "CUDNN_SUPPORTS_BLOCK_SCALED_DOT",
    "CUDNN_SUPPORTS_GLOBAL_SCALE",
]

QUANTIZE = "__op$quantize"
DEQUANTIZE = "__op$dequantize"
BLOCK_SCALED_DOT = "__op$block_scaled_dot"
CUDNN_BLOCK_SCALED_DOT = "__cudnn$blockScaledDot"
SCALED_DOT_COMPOSITE = "xla.scaled_dot"
_TARGETS = (QUANTIZE, DEQUANTIZE, BLOCK_SCALED_DOT)

#: cuDNN versions (major, minor): block-scaled dot at all, and with the global scale inside the graph.
CUDNN_SUPPORTS_BLOCK_SCALED_DOT = (9, 10)
CUDNN_SUPPORTS_GLOBAL_SCALE = (9, 13)
BLOCK_SIZE_MXFP8 = 32
BLOCK_SIZE_NVFP4 = 16
_ROW_TILE = 128  # cuDNN: rows (non-contracting) of data and scales padded to a multiple of this
_BLOCK_TILE = 4  # cuDNN: scale blocks (contracting) padded to a multiple of this

#: (data type, scale type, block size) -> cuDNN's name for one side of a block-scaled dot.
_MX_TYPES = {
    ("f8e4m3fn", "f8e8m0fnu", BLOCK_SIZE_MXFP8): "mxfp8_e4m3fn",
    ("f8e5m2", "f8e8m0fnu", BLOCK_SIZE_MXFP8): "mxfp8_e5m2",
    ("f4e2m1fn", "f8e4m3fn", BLOCK_SIZE_NVFP4): "nvfp4",
}
#: Pairs cuDNN runs (e5m2 x e5m2 is not one of them).
_CUDNN_PAIRS = {
    ("mxfp8_e4m3fn", "mxfp8_e4m3fn"), ("mxfp8_e4m3fn", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8_e4m3fn"),
    ("nvfp4", "nvfp4"),
}


class BlockScalingError(ValueError):
    """A block-scaling custom call (or composite) that does not have the form XLA requires."""


def parse_cudnn_version(text: str | None) -> tuple[int, ...]:
    """`"9.13"` -> (9, 13); None means no cuDNN, (0, 0) (XLA's `VersionInfo{}`)."""
    if text is None:
        return (0, 0)
    parts = str(text).strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise PassOptionError(f"block-scaling-rewriter: cudnn_version={text!r} is not a version like 9.13")
    nums = tuple(int(p) for p in parts)
    return nums + (0,) * (2 - len(nums)) if len(nums) < 2 else nums


# ----------------------------------------------------------------------------- shape checks


def _target(inst: Instruction) -> str:
    return str(inst.get("custom_call_target", "")).strip('"')


def _fail(inst: Instruction, message: str) -> NoReturn:
    what = _target(inst) or str(inst.frontend_attributes.get("composite.name", inst.opcode)).strip('"')
    raise BlockScalingError(f"%{inst.name} ({what}): {message}")


def _kind(dtype: str) -> str:
    return DTYPES[dtype].kind if dtype in DTYPES else "opaque"


def _array(inst: Instruction, shape: AnyShape, what: str, float_only: bool = False) -> Shape:
    """`shape` as an array of a numeric type (a float type with `float_only`), else a clear error."""
    if shape.is_tuple or _kind(shape.dtype) not in ("float", "sint", "uint"):
        _fail(inst, f"{what} must be a numeric array, got {shape}")
    if float_only and _kind(shape.dtype) != "float":
        _fail(inst, f"{what} must have a floating-point type, got {shape}")
    return shape


def _is_default_layout(shape: Shape) -> bool:
    """XLA's IsMonotonicWithDim0Major (no layout counts as the default one)."""
    return shape.layout is None or shape.layout.minor_to_major == tuple(range(shape.rank - 1, -1, -1))


def _inferred_block(data: Shape, scale: Shape) -> int | None:
    """XLA's GetBlockSize: same rank >= 1, scale blocks > 0 dividing K; None when that fails."""
    if data.rank < 1 or data.rank != scale.rank:
        return None
    k, n = data.dims[-1], scale.dims[-1]
    return k // n if k > 0 and n > 0 and k % n == 0 else None


def _block_size(inst: Instruction, data: Shape, scale: Shape, what: str) -> int:
    block = _inferred_block(data, scale)
    if block is None:
        _fail(inst, f"cannot infer the block size of {what}: scale {scale} must have the rank of {data} and "
                    "a last dimension dividing its last dimension")
    return block


def _explicit_block_size(inst: Instruction) -> int | None:
    """backend_config's `block_scaled_dot_backend_config.block_size` (XLA's GpuBackendConfig field)."""
    text = (inst.backend_config or "").strip()
    if text.startswith('"'):
        from hlopt.hlo.attributes import unquote

        text = unquote(text)
    section = re.search(r'"?block_scaled_dot_backend_config"?\s*:\s*\{([^{}]*)\}', text)
    if section is None:
        return None
    value = re.search(r'"?block_size"?\s*:\s*"?(-?\d+)', section.group(1))
    block = int(value.group(1)) if value else 0  # proto default
    if block <= 0:
        _fail(inst, f"backend_config block_size must be positive, got {block}")
    return block


# ----------------------------------------------------------------------------- plans (all checks)


@dataclass(frozen=True)
class _Side:
    """One block-scaled dot operand: data [B,]rows,K and its scale [B,]rows',blocks' (maybe pre-padded)."""

    data: Shape
    scale: Shape
    block: int

    @property
    def rows(self) -> int:
        """Non-contracting size of the data."""
        return self.data.dims[-2]

    @property
    def blocks(self) -> int:
        """Scale blocks that cover K (the last one may be partial with an explicit block size)."""
        return -(-self.data.dims[-1] // self.block)

    def mx_type(self) -> str | None:
        """cuDNN's type of this side (XLA's GetCudnnMxType), None when cuDNN cannot take it."""
        if not (_is_default_layout(self.data) and _is_default_layout(self.scale)) or self.data.dims[-1] % self.block:
            return None
        return _MX_TYPES.get((self.data.dtype, self.scale.dtype, self.block))

    def cudnn_rows(self) -> tuple[int, int, int]:
        """(data rows, scale rows, scale blocks) cuDNN gets: padded to 128 / 128 / 4 when needed."""
        scale_rows, scale_blocks = self.scale.dims[-2:]
        if self.rows % _ROW_TILE == 0 and scale_blocks % _BLOCK_TILE == 0:
            return self.rows, scale_rows, scale_blocks
        padded = -(-self.rows // _ROW_TILE) * _ROW_TILE
        return padded, padded, -(-scale_blocks // _BLOCK_TILE) * _BLOCK_TILE


@dataclass(frozen=True)
class _DotPlan:
    """A checked block-scaled dot: its sides, result type, global scale and the path it takes."""

    rank: int
    dtype: str
    lhs: _Side
    rhs: _Side | None
    has_global: bool
    cudnn: bool
    global_inside: bool


def _side(inst: Instruction, data: Shape, scale_shape: AnyShape, explicit: int | None, what: str) -> _Side:
    """Check a data/scale pair as XLA does (scales may have extra rows, or extra blocks with an explicit block)."""
    scale = _array(inst, scale_shape, f"the {what} scale")
    if scale.rank != data.rank:
        _fail(inst, f"the {what} scale {scale} must have the rank of {data}")
    if data.rank == 3 and scale.dims[0] != data.dims[0]:
        _fail(inst, f"the {what} scale {scale} and {data} have different batch sizes")
    if scale.dims[-2] < data.dims[-2]:
        _fail(inst, f"the {what} scale {scale} has fewer rows than {data}")
    if explicit is None:
        return _Side(data, scale, _block_size(inst, data, scale, f"the {what}"))
    if data.dims[-1] > explicit * scale.dims[-1]:
        _fail(inst, f"the {what} scale {scale} with block size {explicit} does not cover K={data.dims[-1]}")
    return _Side(data, scale, explicit)


def _check_dot_shapes(inst: Instruction, lhs: Shape, rhs: Shape, result: AnyShape) -> Shape:
    """Fixed dimension numbers (contracting last, batch 0 for rank 3): the result must be their dot's shape."""
    if lhs.rank not in (2, 3) or rhs.rank != lhs.rank:
        _fail(inst, f"lhs {lhs} and rhs {rhs} must both have rank 2 or both rank 3")
    if lhs.dims[-1] != rhs.dims[-1]:
        _fail(inst, f"contracting (last) dimensions differ: {lhs} vs {rhs}")
    if lhs.rank == 3 and lhs.dims[0] != rhs.dims[0]:
        _fail(inst, f"batch (first) dimensions differ: {lhs} vs {rhs}")
    out = _array(inst, result, "the result", float_only=True)
    expected = lhs.dims[:-1] + rhs.dims[-2:-1]
    if out.dims != expected:
        _fail(inst, f"result {out} should have dimensions {list(expected)}")
    return out


def _cudnn_fits(side: _Side) -> bool:
    """The padded scale must tile into 128 x 4 (pre-padded scales with odd sizes do not)."""
    _, scale_rows, scale_blocks = side.cudnn_rows()
    return scale_rows % _ROW_TILE == 0 and scale_blocks % _BLOCK_TILE == 0


def _choose_path(lhs: _Side, rhs: _Side | None, version: tuple[int, ...]) -> bool:
    """XLA's decision: cuDNN >= 9.10, both sides scaled and a supported type pair."""
    if version < CUDNN_SUPPORTS_BLOCK_SCALED_DOT or rhs is None:
        return False
    return (lhs.mx_type(), rhs.mx_type()) in _CUDNN_PAIRS


def _plan_dot(inst: Instruction, version: tuple[int, ...]) -> _DotPlan:
    """Every check XLA makes on `__op$block_scaled_dot`, and the path it takes."""
    n = inst.operand_count
    if not 3 <= n <= 5:
        _fail(inst, f"takes 3 to 5 operands (lhs, rhs, lhs_scale[, rhs_scale[, global_scale]]), got {n}")
    lhs = _array(inst, inst.operand(0).shape, "lhs")
    rhs = _array(inst, inst.operand(1).shape, "rhs")
    out = _check_dot_shapes(inst, lhs, rhs, inst.shape)
    if n == 4 and not inst.operand(3).shape.is_tuple and inst.operand(3).shape.rank == 0:
        _fail(inst, "operand 3 is the rhs scale; a global scale is the 5th operand (after the rhs scale)")
    if n == 5:
        g = inst.operand(4).shape
        if g.is_tuple or g.rank != 0 or g.dtype != out.dtype:
            _fail(inst, f"the global scale must be a scalar of the result type {out.dtype}, got {g}")
    explicit = _explicit_block_size(inst)
    lhs_side = _side(inst, lhs, inst.operand(2).shape, explicit, "lhs")
    rhs_side = _side(inst, rhs, inst.operand(3).shape, explicit, "rhs") if n >= 4 else None
    cudnn = _choose_path(lhs_side, rhs_side, version)
    if cudnn and not (_cudnn_fits(lhs_side) and _cudnn_fits(rhs_side)):
        _fail(inst, "pre-padded scales do not tile into 128 x 4 for cuDNN")
    return _DotPlan(lhs.rank, out.dtype, lhs_side, rhs_side, n == 5, cudnn,
                    n == 5 and version >= CUDNN_SUPPORTS_GLOBAL_SCALE)


def _plan_quantize(inst: Instruction) -> int:
    """Checks of `__op$quantize`; the block size."""
    if inst.operand_count != 1:
        _fail(inst, f"takes one operand, got {inst.operand_count}")
    shape = inst.shape
    x = _array(inst, inst.operand(0).shape, "the input", float_only=True)
    if not shape.is_tuple or len(shape.elements) != 2:
        _fail(inst, f"returns (quantized, scale), got {shape}")
    q = _array(inst, shape.elements[0], "the quantized result", float_only=True)
    s = _array(inst, shape.elements[1], "the scale result", float_only=True)
    if q.dims != x.dims:
        _fail(inst, f"the quantized result {q} must have the dimensions of the input {x}")
    if q.rank != s.rank or q.dims[:-1] != s.dims[:-1]:
        _fail(inst, f"quantized {q} and scale {s} dimensions must match except the last")
    if DTYPES[q.dtype].numpy is None:
        _fail(inst, f"no numeric limits for {q.dtype}")
    return _block_size(inst, q, s, "the quantized result")


def _plan_dequantize(inst: Instruction) -> int:
    """Checks of `__op$dequantize`; the block size."""
    if inst.operand_count != 2:
        _fail(inst, f"takes (data, scale), got {inst.operand_count} operands")
    data = _array(inst, inst.operand(0).shape, "the data")
    scale = _array(inst, inst.operand(1).shape, "the scale")
    out = _array(inst, inst.shape, "the result", float_only=True)
    if out.dims != data.dims:
        _fail(inst, f"the result {out} must have the dimensions of the data {data}")
    if data.rank != scale.rank or data.dims[:-1] != scale.dims[:-1]:
        _fail(inst, f"data {data} and scale {scale} dimensions must match except the last")
    return _block_size(inst, data, scale, "the data")


# ----------------------------------------------------------------------------- composites


def _composite_dimension_numbers(inst: Instruction) -> list:
    """`dimension_numbers` of an `xla.scaled_dot` composite: [[lc, rc], [lb, rb]]."""
    attrs = inst.frontend_attributes.get("composite.attributes")
    if attrs is None:
        _fail(inst, "composite.attributes is not set")
    text = str(attrs)
    start = re.search(r"dimension_numbers\s*=\s*\[", text)
    if start is None:
        _fail(inst, "dimension_numbers are not set in composite.attributes")
    depth, i = 0, start.end() - 1
    for i in range(start.end() - 1, len(text)):
        depth += {"[": 1, "]": -1}.get(text[i], 0)
        if depth == 0:
            break
    try:
        dnums = json.loads(text[start.end() - 1:i + 1])
        (lc, rc), (lb, rb) = dnums
        return [[list(lc), list(rc)], [list(lb), list(rb)]]
    except (ValueError, TypeError):
        _fail(inst, f"cannot read dimension_numbers from {text!r}")


def _is_scaled_dot_composite(inst: Instruction) -> bool:
    name = str(inst.frontend_attributes.get("composite.name", "")).strip('"')
    return inst.opcode == "call" and inst.get("is_composite") is True and name == SCALED_DOT_COMPOSITE


def _plan_composite(inst: Instruction, version: tuple[int, ...]) -> _DotPlan | None:
    """An `xla.scaled_dot` composite that cuDNN can run, as a dot plan; None when it stays as it is."""
    if version < CUDNN_SUPPORTS_BLOCK_SCALED_DOT or inst.operand_count != 4:
        return None
    (lc, rc), (lb, rb) = _composite_dimension_numbers(inst)
    shapes = [op.shape for op in inst.operands]
    if any(s.is_tuple for s in shapes) or inst.shape.is_tuple or len({s.rank for s in shapes}) != 1:
        return None
    rank = shapes[0].rank
    if rank not in (2, 3) or lc != [rank - 1] or rc != [rank - 1] or lb != rb or lb != ([0] if rank == 3 else []):
        return None
    lhs, rhs, lhs_scale, rhs_scale = shapes
    if lhs.dims[-1] != rhs.dims[-1] or inst.shape.dims != lhs.dims[:-1] + rhs.dims[-2:-1]:
        return None
    sides = []
    for data, scale in ((lhs, lhs_scale), (rhs, rhs_scale)):
        block = _inferred_block(data, scale)
        if block is None or scale.dims[:-1] != data.dims[:-1]:
            return None
        sides.append(_Side(data, scale, block))
    if not _choose_path(sides[0], sides[1], version):
        return None
    return _DotPlan(rank, inst.shape.dtype, sides[0], sides[1], False, True, False)


# ----------------------------------------------------------------------------- building blocks


class _Params:
    """The new computation's parameters, created on first use (so the order reads like XLA's)."""

    def __init__(self, builder: Builder, module: Module, shapes: Sequence[AnyShape], names: Sequence[str]):
        self.builder, self.module, self.shapes, self.names = builder, module, shapes, names
        self.made: dict[int, Instruction] = {}

    def __getitem__(self, i: int) -> Instruction:
        if i not in self.made:
            name = self.module.unique_name(self.names[i])
            self.made[i] = self.builder.parameter(i, self.shapes[i], name=name)
        return self.made[i]

    def create_all(self) -> None:
        """Make sure every parameter exists (a computation keeps its full signature)."""
        for i in range(len(self.shapes)):
            _ = self[i]


def _new_computation(inst: Instruction, names: Sequence[str]) -> tuple[Computation, Builder, _Params]:
    module = inst.parent.module
    comp = Computation(module.unique_name(inst.name))
    module.add_computation(comp, before=inst.parent)
    b = Builder(comp)
    return comp, b, _Params(b, module, [op.shape for op in inst.operands], names)


def _scalar_constant(b: Builder, value: float, dtype: str) -> Instruction:
    """A scalar constant holding `value` rounded to `dtype`. f8e8m0fnu has no zero: XLA's Zero(F8E8M0FNU) is
    the all-zero bit pattern, 2^-127 (jaxlib 0.10.2's XLA:GPU prints `constant(5.9e-39)` for the scale pads),
    where ml_dtypes rounds 0 to NaN."""
    np_type = DTYPES[dtype].numpy
    if value == 0 and dtype == "f8e8m0fnu" and np_type is not None:
        rounded = np.zeros((), np.uint8).view(np_type)
    else:
        rounded = np.asarray(value, np.float32).astype(np_type) if np_type is not None else np.asarray(value)
    shape = Shape(dtype, ())
    return b.op("constant", shape=shape, literal=Literal.from_numpy(rounded, shape))


def _broadcast_layouts(source: Shape, rank: int) -> tuple[Layout, Layout]:
    """XLA's layout fix for broadcast(convert) -> reshape when the convert has a non-default layout."""
    m2m = source.layout.minor_to_major
    last = m2m[-1]
    broadcast = tuple(idx + (idx >= last) for idx in m2m) + (last,)
    return Layout(broadcast[:rank]), source.layout


def _expand_blocks(b: Builder, scale: Instruction, block: int, k: int) -> Instruction:
    """[..., n] -> broadcast [..., n, block] -> reshape [..., n * block] (-> slice to K for a partial block)."""
    lead = scale.shape.dims
    expanded = b.broadcast(scale, lead + (block,), range(len(lead)))
    flat = b.reshape(expanded, lead[:-1] + (lead[-1] * block,))
    if not _is_default_layout(scale.shape):
        bc_layout, rs_layout = _broadcast_layouts(scale.shape, len(lead) + 1)
        expanded.shape = expanded.shape.with_layout(bc_layout)
        flat.shape = flat.shape.with_layout(rs_layout)
    if lead[-1] * block != k:
        flat = b.slice(flat, [0] * len(lead), lead[:-1] + (k,))
    return flat


def _dequantized(b: Builder, data: Instruction, scale: Instruction, block: int, dtype: str) -> Instruction:
    """convert(data) * expand(convert(scale)), in `dtype`."""
    x = b.convert(data, dtype)
    s = b.convert(scale, dtype)
    return b.multiply(x, _expand_blocks(b, s, block, data.shape.dims[-1]))


def _trimmed_scale(b: Builder, side: _Side, scale: Instruction) -> Instruction:
    """Pre-padded scales sliced to (data rows, blocks covering K)."""
    want = side.scale.dims[:-2] + (side.rows, side.blocks)
    if want == side.scale.dims:
        return scale
    return b.slice(scale, [0] * len(want), want)


def _call_replacing(inst: Instruction, comp: Computation, inherit: bool) -> Instruction:
    """A `call` of `comp` with inst's shape, operands and metadata, inserted before inst.

    `inherit`: also its frontend attributes and sharding (what XLA's ReplaceInstruction carries over; not
    for composites, whose attributes describe the composite)."""
    call = Instruction("call", inst.shape, inst.operands, name=inst.parent.module.unique_name("call"), to_apply=comp)
    if inst.metadata is not None:
        call.metadata = inst.metadata.copy()
    if inherit and inst.frontend_attributes:
        call.attrs["frontend_attributes"] = dict(inst.frontend_attributes)
    if inherit and inst.sharding is not None:
        call.attrs["sharding"] = inst.sharding
    return Builder(inst.parent, before=inst).insert(call)


# ----------------------------------------------------------------------------- quantize / dequantize


def _amax_computation(inst: Instruction, dtype: str) -> Computation:
    """(a, b) -> max(|a|, |b|) over scalars of `dtype`."""
    module = inst.parent.module
    comp = Computation(module.unique_name("amax"))
    module.add_computation(comp, before=inst.parent)
    b = Builder(comp)
    x = b.parameter(0, Shape(dtype, ()), name=module.unique_name("a"))
    y = b.parameter(1, Shape(dtype, ()), name=module.unique_name("b"))
    comp.set_root(b.maximum(b.op("abs", x, shape=x.shape), b.op("abs", y, shape=y.shape)))
    return comp


def _max_exponent(dtype: str) -> int:
    """C++ numeric_limits<T>::max_exponent (XLA's OverflowExponent): log2 of the largest finite value + 1."""
    return int(np.floor(np.log2(float(ml_dtypes.finfo(DTYPES[dtype].numpy).max)))) + 1


def _expand_quantize(inst: Instruction) -> Instruction:
    block = _plan_quantize(inst)
    q_shape, s_shape = inst.shape.elements
    comp, b, params = _new_computation(inst, ["input"])
    x = params[0]
    dtype = x.shape.dtype
    blocks = b.reshape(x, s_shape.dims + (block,))
    zero = _scalar_constant(b, 0.0, dtype)
    amax = b.reduce(blocks, zero, [s_shape.rank], _amax_computation(inst, dtype))
    emax = _scalar_constant(b, 2.0 ** (_max_exponent(q_shape.dtype) - 1), dtype)
    norm = b.divide(amax, b.broadcast(emax, amax.shape.dims, ()))
    scale = b.convert(norm, s_shape.dtype)
    wide = _expand_blocks(b, b.convert(scale, dtype), block, x.shape.dims[-1])
    quantized = b.convert(b.divide(x, wide), q_shape.dtype)
    comp.set_root(b.tuple(quantized, scale))
    return _call_replacing(inst, comp, inherit=True)


def _expand_dequantize(inst: Instruction) -> Instruction:
    block = _plan_dequantize(inst)
    comp, b, params = _new_computation(inst, ["input", "scale"])
    comp.set_root(_dequantized(b, params[0], params[1], block, inst.shape.dtype))
    return _call_replacing(inst, comp, inherit=True)


# ----------------------------------------------------------------------------- block-scaled dot


_DOT_PARAMS = ["lhs", "rhs", "lhs_scale", "rhs_scale", "global_scale"]


def _dims(rank: int) -> dict[str, tuple[int, ...]]:
    batch = (0,) if rank == 3 else ()
    return {"lhs_contracting": (rank - 1,), "rhs_contracting": (rank - 1,), "lhs_batch": batch, "rhs_batch": batch}


def _global_multiply(b: Builder, out: Instruction, g: Instruction) -> Instruction:
    return b.multiply(out, b.broadcast(g, out.shape.dims, ()))


def _build_expanded_dot(b: Builder, p: _Params, plan: _DotPlan) -> Instruction:
    """Dequantize each scaled side in the result type, dot, times the global scale."""
    lhs = _dequantized(b, p[0], _trimmed_scale(b, plan.lhs, p[2]), plan.lhs.block, plan.dtype)
    rhs = p[1]
    if plan.rhs is not None:
        rhs = _dequantized(b, p[1], _trimmed_scale(b, plan.rhs, p[3]), plan.rhs.block, plan.dtype)
    out = b.dot(lhs, rhs, dtype=plan.dtype, **_dims(plan.rank))
    return _global_multiply(b, out, p[4]) if plan.has_global else out


def _pad_high(b: Builder, x: Instruction, high: Sequence[int]) -> Instruction:
    zero = _scalar_constant(b, 0.0, x.shape.dtype)
    return b.pad(x, zero, [(0, h, 0) for h in high])


def _cudnn_data(b: Builder, side: _Side, data: Instruction) -> Instruction:
    """Data rows padded with zeros to cuDNN's row tile."""
    rows, _, _ = side.cudnn_rows()
    if rows == side.rows:
        return data
    return _pad_high(b, data, [0] * (side.data.rank - 2) + [rows - side.rows, 0])


def _swizzle(b: Builder, scale: Instruction) -> Instruction:
    """[B?,R,C] -> [batch, R/128, 4, 32, C/4, 4] -> transpose {0,1,4,3,2,5} -> [B?,R,C] (128x4 tiles)."""
    dims = scale.shape.dims
    rows, cols = dims[-2:]
    batch = dims[0] if len(dims) == 3 else 1
    tiled = b.reshape(scale, (batch, rows // _ROW_TILE, 4, 32, cols // _BLOCK_TILE, _BLOCK_TILE))
    perm = (0, 1, 4, 3, 2, 5)
    layout = Layout(tuple(perm.index(d) for d in default_layout(6).minor_to_major))  # a bitcast, as in XLA
    t_dims = tuple(tiled.shape.dims[d] for d in perm)
    moved = b.op("transpose", tiled, shape=Shape(scale.shape.dtype, t_dims, (), layout), dimensions=perm)
    return b.reshape(moved, dims)


def _cudnn_scale(b: Builder, side: _Side, scale: Instruction) -> Instruction:
    """Scale padded to (rows, blocks) multiples of (128, 4) when needed, then swizzled."""
    _, rows, blocks = side.cudnn_rows()
    have_rows, have_blocks = side.scale.dims[-2:]
    if (rows, blocks) != (have_rows, have_blocks):
        scale = _pad_high(b, scale, [0] * (side.scale.rank - 2) + [rows - have_rows, blocks - have_blocks])
    return _swizzle(b, scale)


def _build_cudnn_dot(b: Builder, p: _Params, plan: _DotPlan) -> Instruction:
    """pad / swizzle, `__cudnn$blockScaledDot` -> (result, u8[0]), global scale, slice back."""
    lhs, rhs = plan.lhs, plan.rhs
    operands = [_cudnn_data(b, lhs, p[0]), _cudnn_data(b, rhs, p[1]),
                _cudnn_scale(b, lhs, p[2]), _cudnn_scale(b, rhs, p[3])]
    if plan.global_inside:
        operands.append(p[4])
    lead = lhs.data.dims[:1] if plan.rank == 3 else ()
    padded = lead + (lhs.cudnn_rows()[0], rhs.cudnn_rows()[0])
    result = Shape(plan.dtype, padded, (), default_layout(len(padded)))
    call_shape = TupleShape((result, Shape("u8", (0,), (), default_layout(1))))
    call = b.op("custom-call", *operands, shape=call_shape, custom_call_target=CUDNN_BLOCK_SCALED_DOT)
    out = b.get_tuple_element(call, 0)
    if plan.has_global and not plan.global_inside:
        out = _global_multiply(b, out, p[4])  # cuDNN < 9.13 gives wrong results with the scale inside
    wanted = lead + (lhs.rows, rhs.rows)
    if wanted != padded:
        out = b.slice(out, [0] * len(wanted), wanted)
    return out


def _expand_dot_plan(inst: Instruction, plan: _DotPlan) -> Computation:
    comp, b, params = _new_computation(inst, _DOT_PARAMS)
    comp.set_root((_build_cudnn_dot if plan.cudnn else _build_expanded_dot)(b, params, plan))
    params.create_all()
    return comp


# ----------------------------------------------------------------------------- the pass


def _remove_unused(module: Module, comps: Sequence[Computation]) -> None:
    """Remove computations nothing calls any more (and then their callees, likewise)."""
    work = list(comps)
    while work:
        comp = work.pop()
        if comp.module is module and comp is not module.entry and not module.callers(comp):
            callees = comp.called_computations()
            module.remove_computation(comp)
            work.extend(callees)


@register
@dataclass(frozen=True)
class BlockScalingRewriter(ExpanderPass):
    """Expand block-scaled quantize / dequantize / dot custom calls (XLA's BlockScalingRewriter).

    `cudnn_version` ("9.10", "9.13", ...; None = no cuDNN): from 9.10 on, dots of a pair cuDNN supports
    become `__cudnn$blockScaledDot` calls (also `xla.scaled_dot` composites); from 9.13 on the global scale
    is passed to cuDNN instead of multiplied afterwards."""

    name: ClassVar[str] = "block-scaling-rewriter"
    opcodes: ClassVar[frozenset[str]] = frozenset({"custom-call", "call"})  # what instruction_matches takes
    cudnn_version: str | None = None

    def __post_init__(self) -> None:
        parse_cudnn_version(self.cudnn_version)  # reject a malformed version early

    @property
    def version(self) -> tuple[int, ...]:
        """cudnn_version as (major, minor[, patch])."""
        return parse_cudnn_version(self.cudnn_version)

    def instruction_matches(self, inst: Instruction) -> bool:
        if inst.opcode == "custom-call":
            return _target(inst) in _TARGETS
        return self.version >= CUDNN_SUPPORTS_BLOCK_SCALED_DOT and _is_scaled_dot_composite(inst)

    def carries_annotations(self, old: Instruction) -> bool:
        """Not a composite's: its frontend attributes describe the composite (`_call_replacing` keeps its
        metadata)."""
        return old.opcode != "call"

    def expand(self, inst: Instruction) -> Instruction | None:
        if inst.opcode == "call":
            plan = _plan_composite(inst, self.version)
            return None if plan is None else _call_replacing(inst, _expand_dot_plan(inst, plan), False)
        target = _target(inst)
        if target == QUANTIZE:
            return _expand_quantize(inst)
        if target == DEQUANTIZE:
            return _expand_dequantize(inst)
        plan = _plan_dot(inst, self.version)
        return _call_replacing(inst, _expand_dot_plan(inst, plan), inherit=True)

    def _check_all(self, module: Module) -> list[Computation]:
        """Run every check first (nothing changes if one fails); the composites' decompositions."""
        decompositions = []
        for comp in non_fusion_computations(module):
            for inst in comp.instructions:
                if not self.instruction_matches(inst):
                    continue
                target = _target(inst)
                if inst.opcode == "call":
                    if _plan_composite(inst, self.version) is not None:
                        decompositions.extend(inst.called_computations)
                elif target == QUANTIZE:
                    _plan_quantize(inst)
                elif target == DEQUANTIZE:
                    _plan_dequantize(inst)
                else:
                    _plan_dot(inst, self.version)
        return decompositions

    def run(self, module: Module) -> bool:
        if self.opcodes.isdisjoint(module_opcodes(module)):
            return False  # no custom-call or call: nothing to check, expand or remove
        decompositions = self._check_all(module)
        changed = super().run(module)
        _remove_unused(module, decompositions)
        return changed
