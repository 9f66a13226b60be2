"""block-scaling-rewriter: expand block-scaled quantize / dequantize / dot custom calls into plain HLO.

XLA's BlockScalingRewriter, expansion path (the path XLA takes when cuDNN cannot run the call). The
custom call is replaced by a `call` of a new computation:

    %r = f32[4,16,32] custom-call(%lhs, %rhs, %lhs_scale, %rhs_scale, %g), custom_call_target="__op$block_scaled_dot"
=>
    %r = f32[4,16,32] call(%lhs, %rhs, %lhs_scale, %rhs_scale, %g), to_apply=%block_scaled_dot
    with, per side: convert(x) * reshape(broadcast(convert(scale)))   (each scale covers `block` elements of K)
    then dot (batch dim 0, contracting the last dim) and, with a global scale, * broadcast(global_scale).

`__op$quantize`: amax per block (reduce of max(|a|, |b|)), scale = amax / 2^(maxexp(quantized type) - 1)
rounded to the scale type, data divided by the broadcast scale and converted; `__op$dequantize`: data
times the broadcast scale. The block size comes from the shapes (K / scale blocks) or, for padded scales,
from backend_config `block_size`; padded scales are sliced first. Malformed calls raise
BlockScalingError. Not yet: the cuDNN path (`cudnn_version` >= 9.10, `__cudnn$blockScaledDot` with
padding and swizzled scales) and `xla.scaled_dot` composites: with any `cudnn_version` the calls are
still expanded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import ml_dtypes
import numpy as np

from hlo.builder import Builder
from hlo.ir import Computation, Instruction
from hlo.literal import Literal
from hlo.shape import DTYPES, Shape, default_layout
from passes.base import ExpanderPass
from passes.registry import register

__all__ = ["BlockScalingRewriter", "BlockScalingError", "QUANTIZE", "DEQUANTIZE", "BLOCK_SCALED_DOT"]

QUANTIZE = "__op$quantize"
DEQUANTIZE = "__op$dequantize"
BLOCK_SCALED_DOT = "__op$block_scaled_dot"
_TARGETS = {QUANTIZE, DEQUANTIZE, BLOCK_SCALED_DOT}


class BlockScalingError(ValueError):
    """A block-scaling custom call that does not have the form XLA requires."""


def _target(inst: Instruction) -> str:
    return str(inst.get("custom_call_target", ""))


def _explicit_block_size(inst: Instruction) -> int | None:
    text = inst.backend_config or ""
    m = re.search(r"block_size\"?\s*:\s*\"?(\d+)", text)
    return int(m.group(1)) if m else None


def _array(shape: Shape, dims: list[int] | tuple[int, ...]) -> Shape:
    return Shape(shape.dtype, tuple(dims), (), default_layout(len(dims)))


def _block_size(inst: Instruction, data: Shape, scale: Shape) -> int:
    if data.rank != scale.rank or data.dims[:-1] != scale.dims[:-1]:
        raise BlockScalingError(f"%{inst.name}: scale {scale} does not match data {data} outside the last dimension")
    explicit = _explicit_block_size(inst)
    k, blocks = data.dims[-1], scale.dims[-1]
    if explicit is not None:
        if explicit <= 0 or -(-k // explicit) > blocks:
            raise BlockScalingError(f"%{inst.name}: block size {explicit} needs more than {blocks} scale blocks")
        return explicit
    if blocks == 0 or k % blocks:
        raise BlockScalingError(f"%{inst.name}: K={k} is not a multiple of the {blocks} scale blocks")
    return k // blocks


def _dequantized(b: Builder, inst: Instruction, data: Instruction, scale: Instruction, dtype: str) -> Instruction:
    """convert(data) * reshape(broadcast(convert(scale))), in `dtype`."""
    block = _block_size(inst, data.shape, scale.shape)
    k = data.shape.dims[-1]
    blocks = -(-k // block)
    if scale.shape.dims[-1] != blocks:  # pre-padded scales: keep the blocks K needs
        starts = [0] * scale.shape.rank
        limits = list(scale.shape.dims[:-1]) + [blocks]
        scale = b.slice(scale, starts, limits)
    x = b.convert(data, dtype) if data.shape.dtype != dtype else data
    s = b.convert(scale, dtype) if scale.shape.dtype != dtype else scale
    lead = list(data.shape.dims[:-1])
    expanded = b.broadcast(s, _array(s.shape.with_dtype(dtype), lead + [blocks, block]),
                           list(range(len(lead) + 1)))
    s_full = b.reshape(expanded, lead + [blocks * block])
    if blocks * block != k:
        s_full = b.slice(s_full, [0] * (len(lead) + 1), lead + [k])
    return b.multiply(x, s_full)


def _new_computation(inst: Instruction, name: str) -> tuple[Computation, Builder, list[Instruction]]:
    module = inst.parent.module
    comp = Computation(module.unique_name(name))
    module.add_computation(comp, before=inst.parent)
    b = Builder(comp)
    params = [b.parameter(i, op.shape, name=module.unique_name(f"{name}_p{i}")) for i, op in enumerate(inst.operands)]
    return comp, b, params


def _expand_dequantize(inst: Instruction) -> Computation:
    if inst.operand_count != 2 or inst.shape.is_tuple:
        raise BlockScalingError(f"%{inst.name}: {DEQUANTIZE} takes (data, scale) and returns an array")
    comp, b, (data, scale) = _new_computation(inst, "dequantize")
    comp.root = _dequantized(b, inst, data, scale, inst.shape.dtype)
    return comp


def _amax_computation(inst: Instruction, dtype: str) -> Computation:
    module = inst.parent.module
    comp = Computation(module.unique_name("amax"))
    module.add_computation(comp, before=inst.parent)
    b = Builder(comp)
    x = b.parameter(0, Shape(dtype, ()), name=module.unique_name("amax_a"))
    y = b.parameter(1, Shape(dtype, ()), name=module.unique_name("amax_b"))
    comp.root = b.maximum(b.op("abs", x, shape=x.shape), b.op("abs", y, shape=y.shape))
    return comp


def _max_exponent_scale(dtype: str) -> float:
    np_type = DTYPES[dtype].numpy
    if np_type is None:
        raise BlockScalingError(f"no numeric limits for {dtype}")
    return float(2.0 ** (ml_dtypes.finfo(np_type).maxexp - 1))


def _expand_quantize(inst: Instruction) -> Computation:
    shape = inst.shape
    if inst.operand_count != 1 or not shape.is_tuple or len(shape.elements) != 2:
        raise BlockScalingError(f"%{inst.name}: {QUANTIZE} takes (data) and returns (quantized, scale)")
    q_shape, s_shape = shape.elements
    comp, b, (data,) = _new_computation(inst, "quantize")
    block = _block_size(inst, data.shape, s_shape)
    dtype = data.shape.dtype
    lead = list(data.shape.dims[:-1])
    blocks = s_shape.dims[-1]
    if blocks * block != data.shape.dims[-1]:
        raise BlockScalingError(f"%{inst.name}: quantize needs K divisible into {blocks} blocks")
    blocked = b.reshape(data, lead + [blocks, block])
    zero = b.constant(0, dtype)
    amax = b.reduce(blocked, zero, [len(lead) + 1], _amax_computation(inst, dtype))
    limit = b.constant(_max_exponent_scale(q_shape.dtype), dtype)
    norm = b.divide(amax, b.broadcast(limit, amax.shape, []))
    scale = b.convert(norm, s_shape.dtype)
    s = b.convert(scale, dtype)
    s_full = b.reshape(b.broadcast(s, _array(s.shape, lead + [blocks, block]), list(range(len(lead) + 1))),
                       list(data.shape.dims))
    quantized = b.convert(b.divide(data, s_full), q_shape.dtype)
    comp.root = b.tuple(quantized, scale)
    return comp


def _expand_dot(inst: Instruction) -> Computation:
    n = inst.operand_count
    if n not in (3, 4, 5) or inst.shape.is_tuple:
        raise BlockScalingError(f"%{inst.name}: {BLOCK_SCALED_DOT} takes 3 to 5 operands "
                                "(lhs, rhs, lhs_scale[, rhs_scale][, global_scale]), got {n}")
    lhs_s, rhs_s = inst.operand(0).shape, inst.operand(1).shape
    if lhs_s.rank != 3 or rhs_s.rank != 3 or lhs_s.dims[0] != rhs_s.dims[0] or lhs_s.dims[2] != rhs_s.dims[2]:
        raise BlockScalingError(f"%{inst.name}: expects [B,M,K] x [B,N,K] (batch first, K last), got "
                                f"{lhs_s} and {rhs_s}")
    expected = (lhs_s.dims[0], lhs_s.dims[1], rhs_s.dims[1])
    if inst.shape.dims != expected:
        raise BlockScalingError(f"%{inst.name}: result {inst.shape} should have dims {list(expected)}")
    comp, b, params = _new_computation(inst, "block_scaled_dot")
    dtype = inst.shape.dtype
    has_global = n in (4, 5) and params[-1].shape.rank == 0
    scales = params[2:-1] if has_global else params[2:]
    if not scales or len(scales) > 2:
        raise BlockScalingError(f"%{inst.name}: needs one or two block scales")
    lhs = _dequantized(b, inst, params[0], scales[0], dtype)
    if len(scales) == 2:
        rhs = _dequantized(b, inst, params[1], scales[1], dtype)
    else:
        rhs = b.convert(params[1], dtype) if params[1].shape.dtype != dtype else params[1]
    out = b.dot(lhs, rhs, [2], [2], [0], [0], dtype=dtype)
    if has_global:
        g = params[-1] if params[-1].shape.dtype == dtype else b.convert(params[-1], dtype)
        out = b.multiply(out, b.broadcast(g, out.shape, []))
    comp.root = out
    return comp


@register
@dataclass(frozen=True)
class BlockScalingRewriter(ExpanderPass):
    """Expand `__op$quantize`, `__op$dequantize` and `__op$block_scaled_dot` into plain HLO."""

    name: ClassVar[str] = "block-scaling-rewriter"
    cudnn_version: str | None = None

    def instruction_matches(self, inst: Instruction) -> bool:
        return inst.opcode == "custom-call" and _target(inst) in _TARGETS

    def expand(self, inst: Instruction) -> Instruction:
        target = _target(inst)
        comp = {QUANTIZE: _expand_quantize, DEQUANTIZE: _expand_dequantize, BLOCK_SCALED_DOT: _expand_dot}[target](inst)
        call = Instruction("call", inst.shape, inst.operands, name=inst.parent.module.unique_name(
            comp.name), to_apply=comp)
        if inst.metadata is not None:
            call.metadata = inst.metadata.copy()
        return Builder(inst.parent, before=inst).insert(call)


def reference_block_scaled_dot(lhs, rhs, lhs_scale, rhs_scale=None, global_scale=None, block=None):
    """numpy reference: dequantize each side by its block scales, batched matmul over K, times the scale."""
    def deq(x, s):
        x = np.asarray(x, np.float32)
        s = np.asarray(s, np.float32)
        bs = block or x.shape[-1] // s.shape[-1]
        s = np.repeat(s, bs, axis=-1)[..., : x.shape[-1]]
        return x * s

    a = deq(lhs, lhs_scale)
    bm = deq(rhs, rhs_scale) if rhs_scale is not None else np.asarray(rhs, np.float32)
    out = np.einsum("bmk,bnk->bmn", a, bm)
    return out * np.float32(global_scale) if global_scale is not None else out


_ = Literal
