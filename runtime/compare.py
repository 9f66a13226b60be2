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
    worst_index: tuple[int, ...] | None = None
    expected_value: object = None
    actual_value: object = None

    @property
    def ok(self) -> bool:
        """True if the output matches."""
        return not self.problem

    def __str__(self) -> str:
        if self.ok:
            return f"output {self.index}: equal (max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})"
        text = f"output {self.index}: {self.problem}"
        if self.worst_index is not None:
            text += (f"; {self.mismatches} element(s) differ, worst at {list(self.worst_index)}: expected "
                     f"{self.expected_value!r}, got {self.actual_value!r} (abs {self.max_abs:.3g}, rel {self.max_rel:.3g})")
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
        lines = [self.problem] if self.problem else []
        lines += [str(o) for o in self.outputs if not o.ok] or ([] if self.problem else
                                                                [f"all {len(self.outputs)} output(s) match"])
        return "\n".join(lines)


def _as_comparable(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind in "fc" or x.dtype.kind == "V" or x.dtype.name in ("bfloat16",) or "float" in x.dtype.name:
        if x.dtype.kind == "c":
            return x.astype(np.complex128)
        return x.astype(np.float64)
    return x


def _compare_one(i: int, e: np.ndarray, a: np.ndarray, rtol: float, atol: float) -> OutputDiff:
    e, a = np.asarray(e), np.asarray(a)
    if e.shape != a.shape:
        return OutputDiff(i, f"shape differs: expected {e.shape}, got {a.shape}")
    if e.dtype != a.dtype:
        return OutputDiff(i, f"dtype differs: expected {e.dtype}, got {a.dtype}")
    ec, ac = _as_comparable(e), _as_comparable(a)
    if ec.dtype.kind in "biu":
        bad = ec != ac
        diff = np.abs(ec.astype(np.float64) - ac.astype(np.float64)) if bad.any() else np.zeros(ec.shape)
        rel = diff
    else:
        nan_e, nan_a = np.isnan(ec), np.isnan(ac)
        if (nan_e != nan_a).any():
            idx = np.unravel_index(int(np.argmax(nan_e != nan_a)), ec.shape)
            return OutputDiff(i, "NaN pattern differs", mismatches=int((nan_e != nan_a).sum()), worst_index=idx,
                              expected_value=e[idx].item(), actual_value=a[idx].item())
        with np.errstate(invalid="ignore", over="ignore"):
            same_inf = (ec == ac)
            diff = np.where(nan_e | same_inf, 0.0, np.abs(ec - ac))
            rel = diff / np.maximum(np.abs(ec), np.finfo(np.float64).tiny)
        bad = diff > atol + rtol * np.abs(np.where(np.isfinite(ec), ec, 0))
    result = OutputDiff(i, max_abs=float(diff.max()) if diff.size else 0.0,
                        max_rel=float(np.nan_to_num(rel).max()) if rel.size else 0.0)
    if bad.any():
        idx = np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), ec.shape)
        result.problem = "values differ"
        result.mismatches = int(bad.sum())
        result.worst_index = tuple(int(x) for x in idx)
        result.expected_value = e[idx].item()
        result.actual_value = a[idx].item()
    return result


def compare(expected: list[np.ndarray], actual: list[np.ndarray], rtol: float = 1e-5,
            atol: float = 1e-5) -> Comparison:
    """Compare outputs element-wise: integers and predicates exactly, floats within atol + rtol*|expected|
    (low-precision types compared in f64), NaNs must match NaNs."""
    if len(expected) != len(actual):
        return Comparison([], f"output count differs: expected {len(expected)}, got {len(actual)}")
    return Comparison([_compare_one(i, e, a, rtol, atol) for i, (e, a) in enumerate(zip(expected, actual,
                                                                                         strict=True))])
