"""Flops, transcendentals and bytes accessed per instruction, in the manner of XLA's HloCostAnalysis.

Elementwise ops count one flop per output element (transcendental ones count a transcendental instead);
dot and convolution count 2 flops per multiply-add; reduce counts the reducer's flops per combined
element; fusions count what their fused instructions do, while their bytes are their external operands
and outputs only; while loops count their body once (as XLA does).
"""

from __future__ import annotations

from dataclasses import dataclass

from hlo.ir import Computation, Instruction
from hlo.opcodes import BINARY_ELEMENTWISE, TERNARY_ELEMENTWISE, UNARY_ELEMENTWISE

__all__ = ["Cost", "instruction_cost", "TRANSCENDENTAL", "NO_DATA"]

TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "tanh", "sine", "cosine", "tan",
    "rsqrt", "sqrt", "cbrt", "power", "atan2", "erf",
})
#: Instructions that move no data and do no work of their own.
NO_DATA = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
                     "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"})
_FREE_FLOPS = frozenset({"convert", "bitcast-convert", "copy", "reduce-precision", "real", "imag"})


@dataclass
class Cost:
    """What one instruction does."""

    flops: float = 0.0
    transcendentals: float = 0.0
    bytes_accessed: float = 0.0

    def __iadd__(self, other: Cost) -> Cost:
        self.flops += other.flops
        self.transcendentals += other.transcendentals
        self.bytes_accessed += other.bytes_accessed
        return self


def _numel(shape) -> int:
    return sum(s.numel for s in shape.leaves()) if shape.is_tuple else shape.numel


def _bytes(shape) -> int:
    return max(shape.byte_size, 0)


def _io_bytes(inst: Instruction) -> float:
    return float(sum(_bytes(op.shape) for op in inst.operands) + _bytes(inst.shape))


def _computation_flops(comp: Computation) -> Cost:
    total = Cost()
    for inst in comp.instructions:
        total += instruction_cost(inst, count_bytes=False)
    return total


def _dot_flops(inst: Instruction) -> float:
    lhs = inst.operand(0).shape
    contracting = 1
    for d in inst.attrs.get("lhs_contracting_dims", ()):
        contracting *= lhs.dims[d]
    return 2.0 * inst.shape.numel * contracting


def _conv_flops(inst: Instruction) -> float:
    kernel = inst.operand(1).shape
    labels = str(inst.attrs.get("dim_labels", ""))
    out_feature = 1
    if "->" in labels and "_" in labels:
        kernel_labels = labels.split("_")[1].split("->")[0]
        if "o" in kernel_labels:
            out_feature = kernel.dims[kernel_labels.index("o")]
    per_output = kernel.numel / max(out_feature, 1)
    return 2.0 * inst.shape.numel * per_output


def instruction_cost(inst: Instruction, count_bytes: bool = True) -> Cost:
    """The cost of one instruction (a fusion: its fused computation's flops, its external bytes)."""
    op = inst.opcode
    cost = Cost()
    if op in NO_DATA:
        return cost
    if op in TRANSCENDENTAL:
        cost.transcendentals = float(_numel(inst.shape))
    elif op in UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE:
        cost.flops = 0.0 if op in _FREE_FLOPS else float(_numel(inst.shape))
    elif op == "dot":
        cost.flops = _dot_flops(inst)
    elif op == "convolution":
        cost.flops = _conv_flops(inst)
    elif op in ("reduce", "reduce-window"):
        reducer = _computation_flops(inst.attrs["to_apply"])
        n_in = inst.operand(0).shape.numel
        combined = n_in - (inst.shape.numel if not inst.shape.is_tuple else inst.shape.leaves()[0].numel)
        if op == "reduce-window":
            window = inst.attrs.get("window")
            size = 1
            for d in (window.dims if window is not None else ()):
                size *= d.size
            combined = _numel(inst.shape) * max(size - 1, 0)
        cost.flops = reducer.flops * max(combined, 0)
        cost.transcendentals = reducer.transcendentals * max(combined, 0)
    elif op in ("fusion", "call"):
        inner = _computation_flops(inst.attrs["calls" if op == "fusion" else "to_apply"])
        cost.flops, cost.transcendentals = inner.flops, inner.transcendentals
    elif op == "while":
        inner = _computation_flops(inst.attrs["body"])
        inner += _computation_flops(inst.attrs["condition"])
        cost.flops, cost.transcendentals = inner.flops, inner.transcendentals
    if count_bytes:
        if op in ("dynamic-slice", "gather", "slice"):
            cost.bytes_accessed = 2.0 * _bytes(inst.shape)
        elif op in ("dynamic-update-slice", "scatter"):
            cost.bytes_accessed = 2.0 * _bytes(inst.operand(1).shape)
        elif op in ("while", "call", "conditional"):
            cost.bytes_accessed = 0.0
        else:
            cost.bytes_accessed = _io_bytes(inst)
    return cost
