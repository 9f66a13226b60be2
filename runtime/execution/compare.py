"""Compare two lists of outputs and say plainly what differs and where."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Comparison", "OutputDiff", "compare"]


@dataclass
class OutputDiff:
    """How one output differs (empty `problem` means equal within tolerance)."""

    index: int
    problem: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: int = 0
    size: int = 0
    worst_index: tuple[int, ...] | None = None
    expected_value: object = None
    actual_value: object = None
    what: str = ""

    @property
    def ok(self) -> bool:
        """True if the output matches."""
        return not self.problem

    def __str__(self) -> str:
        name = f"output {self.index}" + (f" ({self.what})" if self.what else "")
        if self.ok:
            return f"{name}: equal (max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})"
        text = f"{name}: {self.problem}"
        if self.worst_index is not None:
            of = f" of {self.size}" if self.size else ""
            nan = self.problem.startswith("NaN")
            text += (f"; {self.mismatches}{of} element(s) differ, {'first' if nan else 'worst'} at "
                     f"{list(self.worst_index)}: expected {self.expected_value!r}, got {self.actual_value!r}")
            if not nan:
                text += f" (abs {self.max_abs:.3g}, rel {self.max_rel:.3g})"
        return text


@dataclass
class Comparison:
    """The result of comparing every output."""

    outputs: list[OutputDiff] = field(default_factory=list)
    problem: str = ""

    @property
    def ok(self) -> bool:
        """True if everything matches."""
        return not self.problem and all(o.ok for o in self.outputs)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.problem:
            return self.problem
        bad = [str(o) for o in self.outputs if not o.ok]
        if bad:
            return "\n".join([f"{len(bad)} of {len(self.outputs)} output(s) differ:", *bad])
        worst_abs = max((o.max_abs for o in self.outputs), default=0.0)
        worst_rel = max((o.max_rel for o in self.outputs), default=0.0)
        return f"all {len(self.outputs)} output(s) match (max abs {worst_abs:.3g}, max rel {worst_rel:.3g})"


def _as_comparable(x: np.ndarray) -> np.ndarray:
    """Integers (numpy's and ml_dtypes' int2/int4/uint2/uint4) as int64, floats of any width as f64."""
    x = np.asarray(x)
    if x.dtype.kind in "biu":
        return x
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind == "V" and "int" in x.dtype.name:
        return x.astype(np.int64)
    return x.astype(np.float64)


def _relative(diff: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|diff| / |expected| where expected is non-zero and finite (0 elsewhere)."""
    scale = np.abs(expected)
    ok = (scale > 0) & np.isfinite(scale)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.where(ok, diff / np.where(ok, scale, 1.0), 0.0)


def _compare_one(i: int, e: np.ndarray, a: np.ndarray, rtol: float, atol: float) -> OutputDiff:
    e, a = np.asarray(e), np.asarray(a)
    if e.shape != a.shape:
        return OutputDiff(i, f"shape differs: expected {e.shape}, got {a.shape}", what=str(e.dtype))
    if e.dtype != a.dtype:
        return OutputDiff(i, f"dtype differs: expected {e.dtype}, got {a.dtype}", what=str(list(e.shape)))
    result = _compare_values(i, e, a, rtol, atol)
    result.what = f"{e.dtype}{list(e.shape)}"
    return result


def _compare_values(i: int, e: np.ndarray, a: np.ndarray, rtol: float, atol: float) -> OutputDiff:
    ec, ac = _as_comparable(e), _as_comparable(a)
    if ec.dtype.kind in "biu":
        bad = ec != ac
        diff = np.abs(ec.astype(np.float64) - ac.astype(np.float64)) if bad.any() else np.zeros(ec.shape)
        rel = _relative(diff, ec.astype(np.float64))
    else:
        nan_e, nan_a = np.isnan(ec), np.isnan(ac)
        if (nan_e != nan_a).any():
            idx = tuple(int(x) for x in np.unravel_index(int(np.argmax(nan_e != nan_a)), ec.shape))
            return OutputDiff(i, "NaN pattern differs", mismatches=int((nan_e != nan_a).sum()), worst_index=idx,
                              expected_value=ec[idx].item(), actual_value=ac[idx].item(), size=int(ec.size))
        with np.errstate(invalid="ignore", over="ignore"):
            same_inf = (ec == ac)
            diff = np.where(nan_e | same_inf, 0.0, np.abs(ec - ac))
        rel = _relative(diff, ec)
        bad = diff > atol + rtol * np.abs(np.where(np.isfinite(ec), ec, 0))
    result = OutputDiff(i, max_abs=float(diff.max()) if diff.size else 0.0,
                        max_rel=float(rel.max()) if rel.size else 0.0, size=int(ec.size))
    if bad.any():
        idx = np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), ec.shape)
        result.problem = "values differ"
        result.mismatches = int(bad.sum())
        result.worst_index = tuple(int(x) for x in idx)
        result.expected_value = ec[idx].item()
        result.actual_value = ac[idx].item()
    return result


def compare(expected: list[np.ndarray], actual: list[np.ndarray], rtol: float = 1e-5,
            atol: float = 1e-5) -> Comparison:
    """Compare outputs element-wise: integers and predicates exactly, floats within atol + rtol*|expected|
    (low-precision types compared in f64), NaNs must match NaNs."""
    if len(expected) != len(actual):
        return Comparison([], f"output count differs: expected {len(expected)}, got {len(actual)}")
    return Comparison([_compare_one(i, e, a, rtol, atol) for i, (e, a) in enumerate(zip(expected, actual,
                                                                                         strict=True))])
