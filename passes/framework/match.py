"""A small pattern DSL for local rewrites, in the spirit of tinygrad's UPat / PatternMatcher.

    x_plus_zero = Pat("add", [Pat.any("x"), Pat.const(0)])      # add is commutative: 0 + x matches too
    rules = PatternMatcher([(x_plus_zero, lambda x: x)])
    replacement = rules.rewrite(inst)                            # None when no rule applied

- `Pat(opcode or opcodes, operands=[...], name="x", predicate=fn)`: `name` captures the matched
  instruction; the same name twice means "the same instruction" (`multiply(x, x)`).
- `Pat.any(name)` matches anything; `Pat.const(value)` a scalar constant, a broadcast of one, or a
  constant whose elements all equal `value` (any value when omitted).
- Binary commutative opcodes (add, multiply, maximum, minimum, and, or, xor) match their operands in
  either order; `commutative=True/False` overrides that.
- `PatternMatcher([(pat, fn), ...])` indexes rules by root opcode, keeps their order, and composes
  with `+`. `fn` receives the captures as keyword arguments, plus `root` (the matched instruction)
  when it takes a parameter of that name or `**kwargs`; it returns a replacement or None.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from typing import Any

from hlopt.hlo.ir import Instruction
from hlopt.hlo.literal import Literal
from hlopt.hlo.shape import Shape

__all__ = ["Pat", "PatternMatcher", "COMMUTATIVE", "scalar_constant_value", "replace_instruction",
           "remove_with_unused_operands"]

#: XLA's binary commutative opcodes (HloOpcodeIsBinaryCommutative).
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})

#: Constants with more elements than this are not scanned for a uniform value.
MAX_UNIFORM_ELEMENTS = 4096

_ANY = object()


@lru_cache(maxsize=4096)
def _uniform_value(text: str, dtype: str, dims: tuple[int, ...]) -> Any:
    try:
        flat = Literal(text, Shape(dtype, dims)).to_numpy().reshape(-1)
    except (ValueError, TypeError):
        return None
    if flat.size == 0 or flat.tobytes() != flat[:1].tobytes() * flat.size:
        return None  # empty, or not every element has the same bits (so -0.0 and 0.0 differ)
    return flat[0].item()


def scalar_constant_value(inst: Instruction) -> Any | None:
    """The value of a scalar constant, a broadcast of one, or a uniform small constant (else None)."""
    while inst.opcode == "broadcast" and inst.operand_count == 1:
        inst = inst.operand(0)
    if inst.opcode != "constant" or inst.shape.is_tuple:
        return None
    literal = inst.attrs.get("literal")
    if literal is None or literal.is_elided or inst.shape.numel > MAX_UNIFORM_ELEMENTS:
        return None
    return _uniform_value(literal.text, inst.shape.dtype, inst.shape.dims)


def values_equal(actual: Any, wanted: Any) -> bool:
    """Constant-value equality for patterns: NaN equals NaN; a float 0.0 / -0.0 pattern checks the sign."""
    try:
        if isinstance(wanted, float) and math.isnan(wanted):
            return isinstance(actual, float) and math.isnan(actual)
        if actual != wanted:
            return False
    except TypeError:
        return False
    if isinstance(wanted, float) and wanted == 0 and isinstance(actual, float):
        return math.copysign(1.0, actual) == math.copysign(1.0, wanted)
    return True


class Pat:
    """Matches an instruction by opcode(s), operand patterns and a predicate; `name` captures it."""

    __slots__ = ("opcodes", "operands", "name", "predicate", "commutative", "const_value")

    def __init__(self, opcode: str | Iterable[str] | None = None, operands: Iterable[Pat] | None = None,
                 name: str | None = None, predicate: Callable[[Instruction], bool] | None = None,
                 commutative: bool | None = None):
        if opcode is None:
            self.opcodes: frozenset[str] | None = None
        else:
            self.opcodes = frozenset({opcode}) if isinstance(opcode, str) else frozenset(opcode)
        self.operands = None if operands is None else tuple(operands)
        self.name = name
        self.predicate = predicate
        self.commutative = commutative
        self.const_value: Any = None  # _ANY or a value for Pat.const; None otherwise

    @staticmethod
    def any(name: str | None = None, predicate: Callable[[Instruction], bool] | None = None) -> Pat:
        """Matches any instruction."""
        return Pat(None, None, name, predicate)

    @staticmethod
    def const(value: Any = _ANY, name: str | None = None,
              predicate: Callable[[Instruction], bool] | None = None) -> Pat:
        """A scalar constant, a broadcast of one, or a uniform constant, equal to `value` if given."""
        pat = Pat(None, None, name, predicate)
        pat.const_value = value
        return pat

    def _self_matches(self, inst: Instruction) -> bool:
        if self.opcodes is not None and inst.opcode not in self.opcodes:
            return False
        if self.const_value is not None:
            value = scalar_constant_value(inst)
            if value is None or (self.const_value is not _ANY and not values_equal(value, self.const_value)):
                return False
        return self.predicate is None or bool(self.predicate(inst))

    def matches(self, inst: Instruction, captures: dict[str, Instruction]) -> Iterator[dict[str, Instruction]]:
        """Every way `inst` matches, as capture dicts extending `captures`."""
        if not self._self_matches(inst):
            return
        if self.name is not None:
            bound = captures.get(self.name)
            if bound is not None and bound is not inst:
                return
            captures = {**captures, self.name: inst}
        if self.operands is None:
            yield captures
            return
        if len(self.operands) != inst.operand_count:
            return
        orders = [inst.operands]
        commutative = self.commutative if self.commutative is not None else inst.opcode in COMMUTATIVE
        if commutative and len(self.operands) == 2 and inst.operand(0) is not inst.operand(1):
            orders.append(inst.operands[::-1])
        for order in orders:
            yield from _match_all(self.operands, order, captures)

    def all_matches(self, inst: Instruction, captures: dict[str, Instruction]) -> list[dict[str, Instruction]]:
        """`list(self.matches(inst, captures))`, built without generators (what `PatternMatcher.rewrite` asks
        for every instruction; matching reads the IR only, so building the list first yields the same)."""
        opcodes = self.opcodes
        if opcodes is not None and inst.opcode not in opcodes:
            return _NO_MATCH
        if self.const_value is not None or self.predicate is not None:
            if not self._self_matches(inst):
                return _NO_MATCH
        name = self.name
        if name is not None:
            bound = captures.get(name)
            if bound is not None and bound is not inst:
                return _NO_MATCH
            captures = {**captures, name: inst}
        pats = self.operands
        if pats is None:
            return [captures]
        n = len(pats)
        if n != inst.operand_count:
            return _NO_MATCH
        ops = inst.operands
        if n == 1:
            return pats[0].all_matches(ops[0], captures)
        found = _all_of(pats, ops, captures)
        commutative = self.commutative if self.commutative is not None else inst.opcode in COMMUTATIVE
        if commutative and n == 2 and ops[0] is not ops[1]:
            found = found + _all_of(pats, ops[::-1], captures)
        return found

    def match(self, inst: Instruction) -> dict[str, Instruction] | None:
        """The captures of the first way `inst` matches, or None."""
        return next(self.matches(inst, {}), None)

    def __repr__(self) -> str:
        if self.const_value is not None:
            head = "const" if self.const_value is _ANY else f"const({self.const_value!r})"
        else:
            head = "any" if self.opcodes is None else "|".join(sorted(self.opcodes))
        inner = "" if self.operands is None else "(" + ", ".join(map(repr, self.operands)) + ")"
        return f"{head}{inner}" + (f" as {self.name}" if self.name else "")


#: No match (shared: never changed).
_NO_MATCH: list[dict[str, Instruction]] = []


def _all_of(pats: tuple[Pat, ...], insts: tuple[Instruction, ...],
            captures: dict[str, Instruction]) -> list[dict[str, Instruction]]:
    """Every way `insts` match `pats` one for one, in `_match_all`'s order (each way the first operand matches,
    extended by each way the next one does)."""
    found = [captures]
    for pat, inst in zip(pats, insts, strict=True):
        found = [caps for before in found for caps in pat.all_matches(inst, before)]
        if not found:
            return _NO_MATCH
    return found


def _match_all(pats: tuple[Pat, ...], insts: tuple[Instruction, ...],
               captures: dict[str, Instruction]) -> Iterator[dict[str, Instruction]]:
    if not pats:
        yield captures
        return
    for caps in pats[0].matches(insts[0], captures):
        yield from _match_all(pats[1:], insts[1:], caps)


Rewrite = Callable[..., Instruction | None]

#: The captures matching starts from (shared: matching copies before it adds a capture).
_NO_CAPTURES: dict[str, Instruction] = {}


def _wants_root(fn: Rewrite) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "root" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class PatternMatcher:
    """Rules (pattern, rewrite) indexed by root opcode; `rewrite(inst)` returns the first replacement."""

    def __init__(self, rules: Iterable[tuple[Pat, Rewrite]]):
        self.rules: list[tuple[Pat, Rewrite]] = list(rules)
        self._wants_root = [_wants_root(fn) for _, fn in self.rules]
        self._by_opcode: dict[str, list[int]] = {}
        self._wildcards: list[int] = []
        for i, (pat, _) in enumerate(self.rules):
            if pat.opcodes is None:
                self._wildcards.append(i)
            else:
                for op in pat.opcodes:
                    self._by_opcode.setdefault(op, []).append(i)
        self._cache: dict[str, list[int]] = {}

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def _candidates(self, opcode: str) -> list[int]:
        found = self._cache.get(opcode)
        if found is None:
            found = sorted(self._by_opcode.get(opcode, []) + self._wildcards)
            self._cache[opcode] = found
        return found

    def rewrite(self, inst: Instruction) -> Instruction | None:
        """The replacement built by the first rule (in order) whose function returns non-None."""
        rules = self.rules
        for i in self._candidates(inst.opcode):
            pat, fn = rules[i]
            found = pat.all_matches(inst, _NO_CAPTURES)
            if not found:
                continue
            tried: set[tuple] = set()
            for captures in found:
                if len(found) > 1:
                    key = tuple(sorted((k, v.id) for k, v in captures.items()))
                    if key in tried:  # e.g. a commutative op whose operands are not captured
                        continue
                    tried.add(key)
                kwargs = {k: v for k, v in captures.items() if k != "root"}
                if self._wants_root[i]:
                    kwargs["root"] = inst
                result = fn(**kwargs)
                if result is not None:
                    return result
        return None


# ----------------------------------------------------------------------------- applying a replacement

def remove_with_unused_operands(inst: Instruction, effects: Callable[[Instruction], bool] | None = None) -> None:
    """Remove `inst` (dead, no control edges) and then every operand that became dead (XLA's
    RemoveInstructionAndUnusedOperands; `Computation.remove_with_unused_operands`); `effects` is a
    `passes.dce.SideEffects` to reuse."""
    from hlopt.passes.dce import SideEffects

    comp = inst.parent
    comp.remove_with_unused_operands(inst, effects or SideEffects(comp.module))


def replace_instruction(old: Instruction, new: Instruction, preserve_sharding: bool = False,
                        effects: Callable[[Instruction], bool] | None = None) -> bool:
    """`Computation.replace_instruction` as XLA's default: refused (False) when `old` has control
    dependencies; dead operands go by DCE's side-effect rule (`effects`)."""
    from hlopt.passes.dce import SideEffects

    comp = old.parent
    return comp.replace_instruction(old, new, preserve_sharding=preserve_sharding, relay_control_dependency=False,
                                    effects=effects or SideEffects(comp.module))
