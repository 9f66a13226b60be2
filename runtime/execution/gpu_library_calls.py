"""XLA:GPU's library calls lowered back to plain HLO, so that XLA:CPU can run an XLA:GPU-stage module.

XLA:GPU rewrites convolutions into cuDNN custom calls (`__cudnn$convForward`, `$convBackwardFilter`,
`$convBackwardInput`) and, with Triton GEMMs off, dots into cuBLAS calls (`__cublas$gemm`,
`__cublas$lt$matmul`). Each returns a tuple (result, scratch). `lower_library_calls` replaces each call by
the convolution or dot it computes (the scratch by an empty constant), for the numerics check of
`runtime.xla_gpu_path.reemit`: XLA's stage module and our rewrite of it compute the same on XLA:CPU.

The custom call of a backward convolution carries the window and dim_labels of the FORWARD convolution
(input, filter -> output), whatever its operands are (see XLA's conv_rewriter.cc); the plain convolution
is rebuilt from them:
- filter gradient of `y = conv(x, w)`: `conv(x, dy)` contracting over the batch, the window the output's
  spatial size, stride = forward rhs dilation, rhs dilation = forward stride;
- input gradient: `conv(dy, reversed w)` with lhs dilation = forward stride and the padding that gives the
  input's size back.
GEMM epilogues BIAS, RELU and BIAS_RELU are lowered; other fused epilogues (GELU, convolutions with bias,
activation or side input, scales other than 1) are refused (ValueError).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hlopt.hlo.attributes import Window, WindowDim
from hlopt.hlo.builder import Builder
from hlopt.hlo.ir import Instruction, Module
from hlopt.hlo.shape import Shape

__all__ = ["lower_library_calls", "LIBRARY_TARGETS"]

_CONV = {"__cudnn$convForward": "forward", "__cudnn$convBackwardFilter": "filter",
         "__cudnn$convBackwardInput": "input"}
_GEMM = {"__cublas$gemm", "__cublas$lt$matmul"}
_EPILOGUES = frozenset({"DEFAULT", "BIAS", "RELU", "BIAS_RELU"})
#: Custom-call targets `lower_library_calls` knows.
LIBRARY_TARGETS = frozenset(_CONV) | _GEMM


def _config(call: Instruction, key: str) -> dict[str, Any]:
    cfg = call.backend_config_json() or {}
    return cfg.get(key) or {} if isinstance(cfg, dict) else {}


def _plain_conv_or_refuse(call: Instruction) -> None:
    cfg = _config(call, "cudnn_conv_backend_config")
    plain = (cfg.get("activation_mode", "kNone") == "kNone" and float(cfg.get("conv_result_scale", 1)) == 1
             and float(cfg.get("side_input_scale", 0)) == 0 and len(call.operands) == 2)
    if not plain or int(call.get("feature_group_count", 1)) != 1 or int(call.get("batch_group_count", 1)) != 1:
        raise ValueError(f"cannot lower {call.name} ({call.get('custom_call_target')}): fused epilogue or "
                         "grouped convolution")


def _labels(call: Instruction) -> tuple[str, str, str]:
    lhs_rhs, out = str(call.get("dim_labels")).split("->")
    lhs, rhs = lhs_rhs.split("_")
    return lhs, rhs, out


def _swap(labels: str, mapping: dict[str, str]) -> str:
    return "".join(mapping.get(c, c) for c in labels)


def _spatial_size(shape: Shape, labels: str, j: int) -> int:
    return shape.dims[labels.index(str(j))]


def _filter_grad_window(call: Instruction, x: Instruction, dy: Instruction) -> Window:
    lhs, _, out = _labels(call)
    dims = []
    for j, d in enumerate(call.get("window").dims):
        if d.lhs_dilate != 1 or d.reversal:
            raise ValueError(f"cannot lower {call.name}: lhs-dilated or reversed forward window")
        size_in, size_out = _spatial_size(x.shape, lhs, j), _spatial_size(dy.shape, out, j)
        high = (d.size - 1) * d.rhs_dilate + (size_out - 1) * d.stride + 1 - size_in - d.pad_low
        dims.append(WindowDim(size=size_out, stride=d.rhs_dilate, pad_low=d.pad_low, pad_high=high,
                              rhs_dilate=d.stride))
    return Window(tuple(dims))


def _input_grad_window(call: Instruction, dy: Instruction, result: Shape) -> Window:
    lhs, _, out = _labels(call)
    dims = []
    for j, d in enumerate(call.get("window").dims):
        if d.lhs_dilate != 1 or d.reversal:
            raise ValueError(f"cannot lower {call.name}: lhs-dilated or reversed forward window")
        size_in, size_out = _spatial_size(result, lhs, j), _spatial_size(dy.shape, out, j)
        low = (d.size - 1) * d.rhs_dilate - d.pad_low
        high = size_in - (size_out - 1) * d.stride - 1 + d.pad_low
        dims.append(replace(d, stride=1, pad_low=low, pad_high=high, lhs_dilate=d.stride, reversal=True))
    return Window(tuple(dims))


def _convolution(b: Builder, call: Instruction, result: Shape) -> Instruction:
    _plain_conv_or_refuse(call)
    kind = _CONV[str(call.get("custom_call_target"))]
    a, c = call.operands
    lhs, rhs, out = _labels(call)
    if kind == "forward":
        window, labels, operands = call.get("window"), f"{lhs}_{rhs}->{out}", (a, c)
    elif kind == "filter":  # operands: input x, output gradient dy
        window = _filter_grad_window(call, a, c)
        labels = (f"{_swap(lhs, {'b': 'f', 'f': 'b'})}_{_swap(out, {'b': 'i', 'f': 'o'})}->"
                  f"{_swap(rhs, {'o': 'f', 'i': 'b'})}")
        operands = (a, c)
    else:  # operands: output gradient dy, filter w
        window = _input_grad_window(call, a, result)
        labels = f"{out}_{_swap(rhs, {'o': 'i', 'i': 'o'})}->{lhs}"
        operands = (a, c)
    return b.op("convolution", *operands, shape=result, window=window, dim_labels=labels)


def _gemm(b: Builder, call: Instruction, result: Shape) -> Instruction:
    cfg = _config(call, "gemm_backend_config")
    alpha, beta = float(cfg.get("alpha_real", 1)), float(cfg.get("beta", 0))
    epilogue = str(cfg.get("epilogue", "DEFAULT"))
    if epilogue not in _EPILOGUES or float(cfg.get("alpha_imag", 0)) or beta not in (0, 1):
        raise ValueError(f"cannot lower {call.name}: gemm with epilogue {epilogue}, beta {beta}")
    dims = cfg.get("dot_dimension_numbers") or {}

    def ints(key: str) -> tuple[int, ...]:
        return tuple(int(x) for x in dims.get(key, []))

    attrs: dict[str, Any] = {"lhs_contracting_dims": ints("lhs_contracting_dimensions"),
                             "rhs_contracting_dims": ints("rhs_contracting_dimensions")}
    if ints("lhs_batch_dimensions"):
        attrs["lhs_batch_dims"] = ints("lhs_batch_dimensions")
        attrs["rhs_batch_dims"] = ints("rhs_batch_dimensions")
    out = b.op("dot", call.operand(0), call.operand(1), shape=result, **attrs)
    if alpha != 1:
        out = b.multiply(out, b.broadcast(b.constant(alpha, result.dtype), result, ()))
    if beta == 1:
        out = b.add(out, call.operand(2))
    if "BIAS" in epilogue:  # a vector along the last output dimension, after the accumulator operand
        bias = call.operand(3 if beta == 1 else 2)
        out = b.add(out, b.broadcast(bias, result, (result.rank - 1,)))
    if "RELU" in epilogue:
        out = b.maximum(out, b.broadcast(b.constant(0, result.dtype), result, ()))
    return out


def _lower(call: Instruction) -> None:
    comp = call.parent
    shape = call.shape
    result = shape.elements[0] if shape.is_tuple else shape
    b = Builder(comp, before=call)
    target = str(call.get("custom_call_target"))
    value = _convolution(b, call, result) if target in _CONV else _gemm(b, call, result)
    if shape.is_tuple:
        scratch = [b.broadcast(b.constant(0, e.dtype), e, ()) for e in shape.elements[1:]]
        value = b.tuple(value, *scratch)
    call.replace_all_uses_with(value)
    comp.remove(call)


def lower_library_calls(module: Module) -> Module:
    """A copy of `module` with every cuDNN convolution and cuBLAS GEMM call replaced by plain HLO
    (ValueError for calls it cannot lower); the module itself when it has none."""
    calls = [i for i in module.instructions() if i.opcode == "custom-call"
             and str(i.get("custom_call_target")) in LIBRARY_TARGETS]
    if not calls:
        return module
    out = module.clone()
    for inst in [i for i in out.instructions() if i.opcode == "custom-call"
                 and str(i.get("custom_call_target")) in LIBRARY_TARGETS]:
        _lower(inst)
    return out
