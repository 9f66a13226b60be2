"""A small pattern DSL for local rewrites (in the spirit of tinygrad's UPat / PatternMatcher).

    x_plus_zero = Pat("add", [Pat.any("x"), Pat.const(0)], commutative=True)
    rules = PatternMatcher([(x_plus_zero, lambda x, root: x)])
    replacement = rules.rewrite(inst)      # None when nothing matched

Captured names reach the rewrite function as keyword arguments (`root` is the matched instruction);
matchers are indexed by root opcode and compose with `+`; commutative binary ops match either order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hlo.ir import Instruction

__all__ = ["Pat", "PatternMatcher", "scalar_constant_value"]

COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})


def scalar_constant_value(inst: Instruction) -> Any | None:
    """The value of a scalar constant, or of a broadcast of one (None otherwise or if elided)."""
    while inst.opcode == "broadcast" and inst.operand_count == 1:
        inst = inst.operand(0)
    if inst.opcode != "constant" or inst.shape.is_tuple:
        return None
    literal = inst.attrs.get("literal")
    if literal is None or literal.is_elided:
        return None
    if inst.shape.rank == 0:
        try:
            return literal.scalar()
        except ValueError:
            return None
    if inst.shape.numel > 4096:
        return None
    try:
        arr = literal.to_numpy()
    except ValueError:
        return None
    flat = arr.reshape(-1)
    if flat.size and (flat == flat[0]).all():
        return flat[0].item()
    return None


@dataclass(frozen=True)
class Pat:
    """Matches an instruction by opcode(s), operand patterns and a predicate; `name` captures it."""

    opcode: str | frozenset[str] | None = None
    operands: tuple[Pat, ...] | None = None
    name: str | None = None
    predicate: Callable[[Instruction], bool] | None = None
    commutative: bool | None = None
    const_value: Any = field(default=None)
    is_const: bool = False

    def __init__(self, opcode: str | Iterable[str] | None = None, operands: Iterable[Pat] | None = None,
                 name: str | None = None, predicate: Callable[[Instruction], bool] | None = None,
                 commutative: bool | None = None):
        ops = opcode if opcode is None or isinstance(opcode, str) else frozenset(opcode)
        object.__setattr__(self, "opcode", ops)
        object.__setattr__(self, "operands", None if operands is None else tuple(operands))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "predicate", predicate)
        object.__setattr__(self, "commutative", commutative)
        object.__setattr__(self, "const_value", None)
        object.__setattr__(self, "is_const", False)

    @staticmethod
    def any(name: str | None = None, predicate: Callable[[Instruction], bool] | None = None) -> Pat:
        """Matches any instruction."""
        return Pat(None, None, name, predicate)

    @staticmethod
    def const(value: Any = None, name: str | None = None) -> Pat:
        """Matches a scalar constant (or a broadcast of one) equal to `value` (any value if None)."""
        p = Pat(None, None, name)
        object.__setattr__(p, "is_const", True)
        object.__setattr__(p, "const_value", value)
        return p

    def opcodes(self) -> frozenset[str] | None:
        """The root opcodes this pattern can match (None: any)."""
        if self.opcode is None:
            return None
        return frozenset({self.opcode}) if isinstance(self.opcode, str) else self.opcode

    def match(self, inst: Instruction, captures: dict[str, Instruction] | None = None) -> dict[str, Instruction] | None:
        """Captures if `inst` matches, else None."""
        captures = {} if captures is None else captures
        if self.is_const:
            value = scalar_constant_value(inst)
            if value is None or (self.const_value is not None and not _equal(value, self.const_value)):
                return None
        ops = self.opcodes()
        if ops is not None and inst.opcode not in ops:
            return None
        if self.predicate is not None and not self.predicate(inst):
            return None
        if self.name is not None:
            if self.name in captures and captures[self.name] is not inst:
                return None
            captures[self.name] = inst
        if self.operands is None:
            return captures
        if len(self.operands) != inst.operand_count:
            return None
        orders = [inst.operands]
        commutative = self.commutative if self.commutative is not None else inst.opcode in COMMUTATIVE
        if commutative and len(self.operands) == 2:
            orders.append(inst.operands[::-1])
        for order in orders:
            trial = dict(captures)
            if all(p.match(o, trial) is not None for p, o in zip(self.operands, order, strict=True)):
                captures.clear()
                captures.update(trial)
                return captures
        return None


def _equal(a: Any, b: Any) -> bool:
    try:
        return a == b and not (isinstance(a, float) and a != a)
    except TypeError:
        return False


Rewrite = Callable[..., Instruction | None]


class PatternMatcher:
    """Rules (pattern, rewrite) indexed by root opcode; `rewrite(inst)` returns the first replacement."""

    def __init__(self, rules: Iterable[tuple[Pat, Rewrite]]):
        self.rules = list(rules)
        self.by_opcode: dict[str | None, list[tuple[Pat, Rewrite]]] = {}
        for pat, fn in self.rules:
            ops = pat.opcodes()
            for op in (ops if ops is not None else [None]):
                self.by_opcode.setdefault(op, []).append((pat, fn))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, inst: Instruction) -> Instruction | None:
        """The replacement built by the first matching rule whose function returns non-None."""
        for pat, fn in self.by_opcode.get(inst.opcode, []) + self.by_opcode.get(None, []):
            captures = pat.match(inst)
            if captures is None:
                continue
            captures.pop("root", None)
            result = fn(root=inst, **captures)
            if result is not None:
                return result
        return None
