"""Constant literals: kept as the text XLA printed, convertible to and from numpy on demand."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from hlopt.hlo.shape import DTYPES, AnyShape, Shape, TupleShape

__all__ = ["Literal", "LiteralError", "ElidedLiteralError", "elided_constants", "check_no_elided_constants"]

_TOKEN_RE = re.compile(r"-?(?:inf|nan(?:\([^)]*\))?)|true|false|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|0x[0-9a-fA-F]+")


class LiteralError(ValueError):
    """A literal that does not fit its shape."""


_PLAIN_LITERAL_RE = re.compile(r"[-+\w.{}, \t]*")
_BRACE_RE = re.compile(r"[{}]")


def plain_literal_end(text: str, pos: int) -> int | None:
    """Fast path of the parser for a literal of plain numbers in braces, as XLA prints large constants: the
    offset of its closing ')' (one regex and a walk over the braces, not over every value), or None when the
    general scanner must decide (strings, complex values, newlines, a top-level comma, unbalanced braces)."""
    end = _PLAIN_LITERAL_RE.match(text, pos).end()
    if not text.startswith(")", end):
        return None
    body = text[pos:end].strip()
    if "," not in body:
        return end if "{" not in body and "}" not in body or body == "{}" else None
    if not (body.startswith("{") and body.endswith("}")):
        return None
    depth = 0
    braces = _BRACE_RE.finditer(body)
    for m in braces:
        depth += 1 if m.group() == "{" else -1
        if depth <= 0:  # the outer brace closed: it must be the last character
            return end if m.end() == len(body) and depth == 0 else None
    return None


class ElidedLiteralError(LiteralError):
    """A module holds a constant whose values were elided (`{...}`): it cannot be run, compiled or re-emitted."""


ELIDED_HINT = ("a module printed with XLA's default options elides large constants; get the full module from "
               "an XLA dump made with --xla_dump_large_constants, or capture it with hlopt "
               "(hlopt.runtime.jax_integration.capture / capture_text, hlopt.runtime.jax_integration.hook, hlopt.runtime.jax_integration.jit)")


def elided_constants(module: Any) -> list[Any]:
    """The constant instructions of `module` whose literal is elided (`constant({...})`), in module order."""
    found = []
    for comp in module.computations:
        for inst in comp.instructions:
            literal = inst.attrs.get("literal") if inst.opcode == "constant" else None
            if literal is not None and literal.is_elided:
                found.append(inst)
    return found


def check_no_elided_constants(module: Any, action: str = "compile") -> None:
    """Raise ElidedLiteralError, naming the constants, if `module` holds an elided literal; `action` says what
    was refused (compile, execute, check, emit)."""
    found = elided_constants(module)
    if not found:
        return
    names = ", ".join(f"%{inst.name}" for inst in found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    raise ElidedLiteralError(f"cannot {action} module {getattr(module, 'name', '?')!r}: constant {names} has its "
                             f"values elided ({{...}}); {ELIDED_HINT}")


class Literal:
    """The value of a `constant(...)`: its text, and its shape."""

    __slots__ = ("text", "shape")

    def __init__(self, text: str, shape: AnyShape):
        self.text = text.strip()
        self.shape = shape

    @property
    def is_elided(self) -> bool:
        """True for `{...}`: the values were not printed."""
        return self.text == "{...}"

    def to_numpy(self) -> np.ndarray | list:
        """The value as a numpy array (a list of arrays for tuple literals)."""
        if isinstance(self.shape, TupleShape):
            raise LiteralError("tuple literals convert element-wise; not supported")
        if self.is_elided:
            raise LiteralError("the literal's values were elided ({...})")
        return _array_from_text(self.text, self.shape)

    def scalar(self) -> float | int | bool | complex:
        """The value of a rank-0 (or one-element) literal."""
        arr = self.to_numpy()
        return arr.reshape(-1)[0].item()

    @classmethod
    def from_numpy(cls, value: np.ndarray | float | int | bool, shape: Shape) -> Literal:
        """A literal of `shape` holding `value` (broadcast if scalar)."""
        arr = np.broadcast_to(np.asarray(value), shape.dims)
        return cls(_text_from_array(arr, shape.dtype), shape)

    def to_text(self) -> str:
        """The text inside `constant(...)`."""
        return self.text

    def __repr__(self) -> str:
        return f"Literal({self.shape}: {self.text[:40]})"


def _parse_token(tok: str, kind: str) -> float | int | bool:
    if tok == "true":
        return True
    if tok == "false":
        return False
    if tok.startswith("0x"):
        return int(tok, 16)
    low = tok.lower()
    if "nan" in low:
        return float("nan") * (-1 if low.startswith("-") else 1)
    if "inf" in low:
        return float("-inf") if low.startswith("-") else float("inf")
    if kind in ("sint", "uint", "pred"):
        return int(float(tok)) if any(c in tok for c in ".eE") else int(tok)
    return float(tok)


def _array_from_text(text: str, shape: Shape) -> np.ndarray:
    dt = DTYPES[shape.dtype]
    if dt.numpy is None:
        raise LiteralError(f"no numpy type for {shape.dtype}")
    tokens = _TOKEN_RE.findall(text)
    values = [_parse_token(t, dt.kind) for t in tokens]
    if dt.is_complex:
        if len(values) != 2 * shape.numel:
            raise LiteralError(f"expected {shape.numel} complex values, got {len(values) // 2}")
        vals = [complex(values[i], values[i + 1]) for i in range(0, len(values), 2)]
        return np.array(vals, dtype=dt.numpy).reshape(shape.dims)
    if len(values) != shape.numel:
        raise LiteralError(f"expected {shape.numel} values for {shape}, got {len(values)}")
    if dt.kind == "float" and dt.numpy.itemsize < 4 or shape.dtype == "bf16":
        return np.array(values, dtype=np.float64).astype(dt.numpy).reshape(shape.dims)
    if dt.kind in ("sint", "uint"):  # exact: u64 beyond int64 and s64 beyond float64 precision
        try:
            wide = np.array(values, dtype=np.int64 if dt.kind == "sint" else np.uint64)
        except OverflowError:
            raise LiteralError(f"a value does not fit {shape.dtype}") from None
        return wide.astype(dt.numpy).reshape(shape.dims)
    return np.array(values).astype(dt.numpy).reshape(shape.dims)


def _scalar_text(x: object, kind: str) -> str:
    if kind == "pred":
        return "true" if bool(x) else "false"
    if kind in ("sint", "uint"):
        return str(int(x))
    if kind == "complex":
        c = complex(x)
        return f"({_float_text(c.real)}, {_float_text(c.imag)})"
    return _float_text(float(x))


def _float_text(f: float) -> str:
    if f != f:
        return "nan"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    text = repr(f)
    if text == "-0.0":
        return text  # XLA's parser reads "-0" as the integer 0 and loses the sign
    return text[:-2] if text.endswith(".0") else text


def _text_from_array(arr: np.ndarray, dtype: str) -> str:
    kind = DTYPES[dtype].kind
    if arr.ndim == 0:
        return _scalar_text(arr.item() if kind != "float" else float(arr.astype(np.float64)), kind)
    flat = arr.astype(np.float64) if kind == "float" else arr

    def rec(a: np.ndarray) -> str:
        if a.ndim == 1:
            return "{" + ", ".join(_scalar_text(v, kind) for v in a.tolist()) + "}"
        return "{ " + ", ".join(rec(sub) for sub in a) + " }"

    return rec(flat)
