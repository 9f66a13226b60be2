"""While-loop analysis: induction variable, range and trip count (XLA's xla/hlo/analysis/while_loop_analysis.cc:
GetLoopInductionVarTupleIdx, MatchTrivialLoopTripCount / MatchLoopRangeWithKnownValues, ComputeWhileLoopTripCount).

A loop is "simple" when its state is a tuple, its condition compares one tuple slot `i` with an integer
constant, the body returns `add(gte(param, i), constant)` (or `subtract(gte, constant)`) at that slot, and the
initial value of `i` is an integer constant:

    %cond: ROOT %lt = pred[] compare(%gte_i, s32[] constant(16)), direction=LT
    %body: ROOT %t = (...) tuple(%next, ...), %next = add(%gte_i, s32[] constant(1))
    ENTRY: %w = while(tuple(s32[] constant(0), ...))

    induction_variable(w) == 0
    loop_range(w) == LoopRange(start=0, step=1, trip_count=16)   # .max_value == 15
    trip_count(w) == 16

`affine_in_induction_variable(x, param, i)` reads an integer index expression of the body as
`scale * i + offset` (through add, subtract, negate, multiply by a constant and copy), so that
`subtract(subtract(constant(3), i), constant(1))` is known to be `2 - i`, as XLA's simplifier would fold it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hlopt.hlo.ir import Computation, Instruction
from hlopt.hlo.shape import DTYPES

__all__ = [
    "LoopRange", "induction_variable", "loop_range", "loop_max_value", "trip_count", "scalar_int_constant",
    "single_parameter", "affine_in_induction_variable", "is_induction_variable",
]

_FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}


@dataclass(frozen=True)
class LoopRange:
    """The values the induction variable takes in the body: start, start + step, ... (trip_count values)."""

    start: int
    step: int
    trip_count: int

    @property
    def max_value(self) -> int | None:
        """The largest value the body sees (XLA's Range::max for a step-1 loop); None when it never runs."""
        if self.trip_count <= 0:
            return None
        return max(self.start, self.start + (self.trip_count - 1) * self.step)

    @property
    def last_value(self) -> int | None:
        """The value of the last iteration; None when the body never runs."""
        return None if self.trip_count <= 0 else self.start + (self.trip_count - 1) * self.step


def scalar_int_constant(inst: Instruction) -> int | None:
    """The value of a one-element integer constant, else None (an elided literal is not known)."""
    if inst.opcode != "constant" or inst.shape.is_tuple or inst.shape.numel != 1:
        return None
    if DTYPES[inst.shape.dtype].kind not in ("sint", "uint"):
        return None
    try:
        return int(inst.attrs["literal"].scalar())
    except Exception:  # noqa: BLE001  (an elided or unreadable literal has no known value)
        return None


def single_parameter(comp: Computation) -> Instruction | None:
    """The computation's parameter when it has exactly one (a while body or condition), else None."""
    params = comp.parameters
    return params[0] if len(params) == 1 else None


def _is_slot(inst: Instruction, param: Instruction, k: int | None = None) -> bool:
    return inst.opcode == "get-tuple-element" and inst.operand(0) is param and \
        (k is None or inst.attrs["index"] == k)


def induction_variable(loop: Instruction) -> int | None:
    """The tuple slot of the loop's induction variable: the condition's root compares `gte(param, k)` and the
    body returns `add(gte(param, k), constant)` (or subtract) at slot k (XLA's GetLoopInductionVarTupleIdx);
    None when the loop has no such slot."""
    cond, body = loop.attrs.get("condition"), loop.attrs.get("body")
    if not isinstance(cond, Computation) or not isinstance(body, Computation):
        return None
    root, cparam = cond.root, single_parameter(cond)
    if root is None or root.opcode != "compare" or cparam is None:
        return None
    slots = [o.attrs["index"] for o in root.operands if _is_slot(o, cparam)]
    if len(slots) != 1:
        return None
    k = slots[0]
    return k if _step(body, k) is not None else None


def _step(body: Computation, k: int) -> int | None:
    """The constant the body adds to slot k each iteration, else None."""
    root, param = body.root, single_parameter(body)
    if root is None or root.opcode != "tuple" or param is None or k >= root.operand_count:
        return None
    upd = root.operand(k)
    if upd.opcode not in ("add", "subtract") or upd.operand_count != 2:
        return None
    a, b = upd.operands
    if _is_slot(a, param, k) and scalar_int_constant(b) is not None:
        c = scalar_int_constant(b)
        return c if upd.opcode == "add" else -c
    if upd.opcode == "add" and _is_slot(b, param, k) and scalar_int_constant(a) is not None:
        return scalar_int_constant(a)
    return None


def _initial_value(loop: Instruction, k: int) -> int | None:
    init = loop.operand(0)
    while init.opcode == "copy":
        init = init.operand(0)
    if init.opcode != "tuple" or k >= init.operand_count:
        return None
    return _folded_int(init.operand(k))


def _folded_int(inst: Instruction, depth: int = 0) -> int | None:
    """The value of an integer scalar computed from constants by copy, get-tuple-element of a tuple, add,
    subtract and multiply (what XLA's trip-count analysis evaluates for an initial value); None otherwise."""
    if depth > 16 or inst.shape.is_tuple or inst.shape.numel != 1:
        return None
    if inst.opcode == "copy":
        return _folded_int(inst.operand(0), depth + 1)
    if inst.opcode == "get-tuple-element" and inst.operand(0).opcode == "tuple":
        return _folded_int(inst.operand(0).operand(inst.attrs["index"]), depth + 1)
    if inst.opcode in ("add", "subtract", "multiply") and inst.operand_count == 2:
        a, b = (_folded_int(inst.operand(n), depth + 1) for n in (0, 1))
        if a is None or b is None:
            return None
        return a + b if inst.opcode == "add" else a - b if inst.opcode == "subtract" else a * b
    return scalar_int_constant(inst)


def _bound(loop: Instruction, k: int) -> tuple[str, int] | None:
    """(direction, constant) of the condition read as `i <direction> constant`."""
    root = loop.attrs["condition"].root
    cparam = single_parameter(loop.attrs["condition"])
    lhs, rhs = root.operand(0), root.operand(1)
    direction = str(root.attrs.get("direction", ""))
    if _is_slot(lhs, cparam, k):
        bound = scalar_int_constant(rhs)
    elif _is_slot(rhs, cparam, k):
        bound, direction = scalar_int_constant(lhs), _FLIPPED.get(direction, "")
    else:
        return None
    return None if bound is None or direction not in _FLIPPED else (direction, bound)


def _iterations(start: int, step: int, direction: str, bound: int) -> int | None:
    """How many times `i = start; while (i <direction> bound) i += step` runs the body; None if unbounded."""
    def ceil_div(a: int, b: int) -> int:
        return -(-a // b)

    if direction in ("LT", "LE"):
        limit = bound if direction == "LT" else bound + 1  # i < limit
        if start >= limit:
            return 0
        return ceil_div(limit - start, step) if step > 0 else None
    if direction in ("GT", "GE"):
        limit = bound if direction == "GT" else bound - 1  # i > limit
        if start <= limit:
            return 0
        return ceil_div(start - limit, -step) if step < 0 else None
    if direction == "NE":
        if start == bound:
            return 0
        if step != 0 and (bound - start) % step == 0 and (bound - start) // step > 0:
            return (bound - start) // step
        return None
    return 1 if start == bound else 0  # EQ: runs once when equal, then the step leaves the bound (step != 0)


def loop_range(loop: Instruction, k: int | None = None) -> LoopRange | None:
    """Start, step and trip count of a simple loop (module docstring); None when any of them is unknown.
    `k` is the induction variable's slot (found when None). Integer overflow is not modelled: XLA also
    assumes the induction variable does not wrap."""
    k = induction_variable(loop) if k is None else k
    if k is None:
        return None
    start, step, bound = _initial_value(loop, k), _step(loop.attrs["body"], k), _bound(loop, k)
    if start is None or not step or bound is None:
        return None
    trips = _iterations(start, step, *bound)
    return None if trips is None else LoopRange(start, step, trips)


def loop_max_value(loop: Instruction, k: int) -> int | None:
    """The last value the induction variable takes in the body, for a loop from 0 by 1 against a constant
    bound (`i < N`: N-1, `i <= N`: N); None when unknown or when the loop would not run at all (the range
    XLA's DUS form of while-loop-all-reduce-code-motion accepts)."""
    rng = loop_range(loop, k)
    if rng is None or rng.start != 0 or rng.step != 1:
        return None
    return rng.max_value


def _known_trip_count(loop: Instruction) -> int | None:
    known = loop.backend_config_value("known_trip_count")
    if not isinstance(known, dict):
        return None
    try:
        return max(int(known.get("n", 0)), 0)
    except (TypeError, ValueError):
        return None


def trip_count(loop: Instruction) -> int | None:
    """How many times the body runs: backend_config's `known_trip_count` (XLA's annotation), else the count of a
    simple loop (module docstring; XLA's ComputeWhileLoopTripCount for that form); None when unknown."""
    known = _known_trip_count(loop)
    if known is not None:
        return known
    rng = loop_range(loop)
    return None if rng is None else rng.trip_count


def affine_in_induction_variable(inst: Instruction, param: Instruction, k: int) -> tuple[int, int] | None:
    """(scale, offset) when integer scalar `inst` is `scale * gte(param, k) + offset` built from the slot,
    integer constants, add, subtract, negate, multiply by a constant and copy; None otherwise."""
    if inst.shape.is_tuple or inst.shape.numel != 1 or DTYPES[inst.shape.dtype].kind not in ("sint", "uint"):
        return None
    if _is_slot(inst, param, k):
        return (1, 0)
    c = scalar_int_constant(inst)
    if c is not None:
        return (0, c)
    op = inst.opcode
    if op == "copy" or op == "negate":
        inner = affine_in_induction_variable(inst.operand(0), param, k)
        if inner is None or op == "copy":
            return inner
        return (-inner[0], -inner[1])
    if op not in ("add", "subtract", "multiply") or inst.operand_count != 2:
        return None
    a = affine_in_induction_variable(inst.operand(0), param, k)
    b = affine_in_induction_variable(inst.operand(1), param, k)
    if a is None or b is None:
        return None
    if op == "add":
        return (a[0] + b[0], a[1] + b[1])
    if op == "subtract":
        return (a[0] - b[0], a[1] - b[1])
    if a[0] and b[0]:
        return None  # i * i is not affine
    return (a[0] * b[1] + b[0] * a[1], a[1] * b[1])


def is_induction_variable(inst: Instruction, param: Instruction, k: int, max_value: int) -> bool:
    """Whether `inst` is the induction variable `i` (slot k) or `max_value - i`, up to the folding XLA's
    simplifier does (XLA's test in the DUS form of while-loop-all-reduce-code-motion)."""
    affine = affine_in_induction_variable(inst, param, k)
    return affine in ((1, 0), (-1, max_value))
