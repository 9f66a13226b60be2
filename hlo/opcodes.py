"""Every HLO opcode as XLA spells it, with the categories passes and shape inference use."""

from __future__ import annotations

__all__ = [
    "OPCODES", "UNARY_ELEMENTWISE", "BINARY_ELEMENTWISE", "TERNARY_ELEMENTWISE", "ELEMENTWISE",
    "COLLECTIVES", "SYNC_COLLECTIVES", "CHANNEL_OPCODES", "ASYNC_PAIRS", "is_known_opcode", "async_base",
]

UNARY_ELEMENTWISE = frozenset(
    {
        "abs", "acos", "acosh", "asin", "asinh", "atanh", "cbrt", "ceil", "count-leading-zeros", "copy", "cosh",
        "cosine", "erf", "exponential", "exponential-minus-one", "floor", "sinh",
        "imag", "is-finite", "log", "log-plus-one", "logistic", "negate", "not", "popcnt", "real",
        "round-nearest-afz", "round-nearest-even", "rsqrt", "sign", "sine", "sqrt", "tan", "tanh",
        "convert", "bitcast-convert", "reduce-precision",
    }
)
BINARY_ELEMENTWISE = frozenset(
    {
        "add", "atan2", "and", "complex", "compare", "divide", "maximum", "minimum", "mulhi", "multiply", "or",
        "power", "remainder", "shift-left", "shift-right-arithmetic", "shift-right-logical", "subtract", "xor",
        "stochastic-convert",
    }
)
TERNARY_ELEMENTWISE = frozenset({"clamp", "select"})
ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE | {"map"}

COLLECTIVES = frozenset(
    {
        "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute",
        "collective-broadcast", "all-reduce-start", "all-gather-start", "collective-permute-start",
    }
)

#: The collectives in their synchronous form (what an `async-start` may wrap).
SYNC_COLLECTIVES = frozenset(op for op in COLLECTIVES if not op.endswith("-start"))
#: Instructions that talk across devices through a channel: the collectives and send/recv.
CHANNEL_OPCODES = COLLECTIVES | {"send", "recv", "send-done", "recv-done"}

#: Opcodes with dedicated start/done forms.
ASYNC_PAIRS = {
    "all-reduce-start": "all-reduce-done",
    "all-gather-start": "all-gather-done",
    "collective-permute-start": "collective-permute-done",
    "copy-start": "copy-done",
    "async-start": "async-done",
    "send": "send-done",
    "recv": "recv-done",
}

OPCODES = frozenset(
    ELEMENTWISE
    | {
        "add-dependency", "after-all", "all-gather", "all-gather-done", "all-gather-start", "all-reduce",
        "all-reduce-done", "all-reduce-start", "all-to-all", "async-done", "async-start", "async-update",
        "batch-norm-grad", "batch-norm-inference", "batch-norm-training", "bitcast", "broadcast", "call",
        "cholesky", "collective-broadcast", "collective-permute", "collective-permute-done",
        "collective-permute-start", "concatenate", "conditional", "constant", "convolution", "copy-done",
        "copy-start", "custom-call", "domain", "dot", "dynamic-reshape", "dynamic-slice", "dynamic-update-slice",
        "fft", "fusion", "gather", "get-dimension-size", "get-tuple-element", "infeed", "iota", "opt-barrier",
        "outfeed", "pad", "parameter", "partition-id", "ragged-all-to-all", "ragged-dot", "recv", "recv-done",
        "reduce", "reduce-scatter", "reduce-window", "replica-id", "reshape", "reverse", "rng",
        "rng-bit-generator", "rng-get-and-update-state", "scatter", "select-and-scatter", "send", "send-done",
        "scan", "set-dimension-size", "slice", "sort", "topk", "transpose", "triangular-solve", "tuple", "while",
        "scaled-dot",
    }
)


def async_base(opcode: str) -> str | None:
    """For async sugar such as `call-start` / `custom-call-done`, the wrapped opcode; else None."""
    for suffix in ("-start", "-update", "-done"):
        if opcode.endswith(suffix):
            base = opcode[: -len(suffix)]
            if base in OPCODES and opcode not in OPCODES:
                return base
    return None


def is_known_opcode(opcode: str) -> bool:
    """True for every opcode XLA's parser accepts (async sugar included)."""
    return opcode in OPCODES or async_base(opcode) is not None
