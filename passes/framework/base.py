"""Pass base classes: module passes, computation passes (callees first) and expander passes.

A pass is a small frozen dataclass whose fields are its options; `name` is XLA's kebab-case name
for the same pass; `run(module)` returns whether it changed the module (XLA's HloPassInterface).
`run_with_result(module)` returns a `PassResult` (torch.fx's PassResult): whether it changed the module
and what the pass has to say about its decisions (the fusion passes' explanations). A pass keeps nothing
of a run: what a run found comes back in its result.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hlopt.hlo.ir import Computation, Instruction, Module

__all__ = ["Pass", "PassResult", "ModulePass", "ComputationPass", "ExpanderPass", "non_fusion_computations",
           "call_graph", "post_order", "module_opcodes", "forget_module_facts"]


@dataclass
class PassResult:
    """What one run of a pass returns: whether it changed the module, and its explanations (one object
    per decision, printable; empty for passes that give none)."""

    changed: bool
    explanations: list[Any] = field(default_factory=list)

    def explain_lines(self) -> list[str]:
        """The explanations as text, one line each."""
        return [str(e) for e in self.explanations]


class Pass(ABC):
    """Anything with a `name` and `run(module) -> bool`."""

    name: ClassVar[str] = ""
    #: Whether a pipeline may skip a run of this pass on a module that no IR edit has touched since a run of
    #: the same pass (same options) that changed nothing: the run would change nothing again (XLA's passes
    #: find "no change" cheaply). None: yes for hlopt's built-in passes, no for others (a plugin pass may
    #: read something besides the module); a pass sets True or False to say so itself.
    skip_unchanged_reruns: ClassVar[bool | None] = None

    @abstractmethod
    def run(self, module: Module) -> bool:
        """Transform `module` in place; return True iff it changed."""

    def run_with_result(self, module: Module) -> PassResult:
        """Run on `module` and return what the run did (the pipeline calls this)."""
        return PassResult(self.run(module))

    def describe(self) -> str:
        """The pass as a pipeline spec element, options included (`name{a=1,b=x}`)."""
        from dataclasses import fields, is_dataclass

        if not is_dataclass(self):
            return self.name
        opts = [f"{f.name}={_option_text(getattr(self, f.name))}" for f in fields(self)
                if f.compare and getattr(self, f.name) != f.default]
        return self.name + ("{" + ",".join(opts) + "}" if opts else "")


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list | frozenset | set):
        return ":".join(map(str, value))
    return str(value)


@dataclass(frozen=True)
class ModulePass(Pass):
    """A pass over the whole module."""

    @abstractmethod
    def run(self, module: Module) -> bool:
        """Transform `module` in place; return True iff it changed."""


#: module -> {what: (Module.mutations when it was found, what was found)}: module facts that passes run back to
#: back ask again (the scans that find nothing to do), found again only after an IR edit. Computations are kept
#: by weak reference (`_weak`), so that a fact never keeps its module alive. (Not the call graph: after fusion
#: it is large, and the passes that read it run where the module has just been edited.)
_FACTS: weakref.WeakKeyDictionary[Module, dict[Any, tuple[int, Any]]] = weakref.WeakKeyDictionary()


def _module_fact(module: Module, what: Any, find: Callable[[], Any]) -> Any:
    """`find()` (a frozenset of strings, or a list of computations), remembered for `module` until its next IR
    edit (`Module.mutations`); a list comes back as a new list of the same computations."""
    facts = _FACTS.get(module)
    if facts is None:
        facts = _FACTS[module] = {}
    known = facts.get(what)
    if known is not None and known[0] == module.mutations:
        try:
            return _strong(known[1])
        except ReferenceError:  # a computation gone meanwhile: find it again
            pass
    value = find()
    facts[what] = (module.mutations, _weak(value))
    return value


def forget_module_facts(module: Module) -> None:
    """Drop what is remembered of `module` (`module_opcodes`, `non_fusion_computations`): found afresh next."""
    _FACTS.pop(module, None)


def _weak(value: Any) -> Any:
    """`value` (a frozenset of strings, or a list of computations) with every computation replaced by a weak
    reference to it."""
    if isinstance(value, list):
        return [weakref.ref(v) for v in value]
    return value


def _strong(value: Any) -> Any:
    """`_weak`'s inverse (ReferenceError when a computation is gone)."""
    if isinstance(value, list):
        got = [ref() for ref in value]
        if None in got:
            raise ReferenceError("a remembered computation is gone")
        return got
    return value


def call_graph(module: Module) -> tuple[dict[Computation, list[Computation]], list[tuple[str, list[Computation]]]]:
    """One scan of every instruction: each computation's direct callees (unique, in order, as
    `Computation.called_computations` gives them) and, per calling instruction, (its opcode, what it calls)."""
    callees: dict[Computation, list[Computation]] = {}
    calls: list[tuple[str, list[Computation]]] = []
    for comp in module.computations:
        seen: dict[Computation, None] = {}
        for inst, called in comp.calling_instructions():  # remembered by the computation until its next edit
            calls.append((inst.opcode, called))
            for c in called:
                seen.setdefault(c, None)
        callees[comp] = list(seen)
    return callees, calls


def post_order(module: Module, callees: dict[Computation, list[Computation]]) -> list[Computation]:
    """`Module.computations_post_order` from a `call_graph`'s callees (no second scan of the instructions)."""
    visited: set[Computation] = set()
    order: list[Computation] = []

    def called(c: Computation) -> list[Computation]:
        got = callees.get(c)
        return got if got is not None else c.called_computations()

    for root in ([module.entry] if module.entry else []) + module.computations:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, iter(called(root)))]
        while stack:
            node, it = stack[-1]
            for callee in it:
                if callee not in visited:
                    visited.add(callee)
                    stack.append((callee, iter(called(callee))))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def module_opcodes(module: Module) -> frozenset[str]:
    """Every opcode of the module's computations' instructions (found again after an IR edit only): a pass
    with nothing to match among them has nothing to do."""
    return _module_fact(module, "opcodes", lambda: frozenset(
        inst.opcode for comp in module.computations for inst in comp.instructions))


def non_fusion_computations(module: Module, callees_first: bool = True) -> list[Computation]:
    """Computations that are not the body of a fusion (XLA's MakeNonfusionComputations), callees first
    (found again after an IR edit only: passes run back to back that change nothing ask for the same)."""
    return _module_fact(module, ("non-fusion", callees_first),
                        lambda: _non_fusion_computations(module, callees_first))


def _non_fusion_computations(module: Module, callees_first: bool) -> list[Computation]:
    callees, calls = call_graph(module)
    fused = {c for opcode, called in calls if opcode == "fusion" for c in called}
    order = post_order(module, callees) if callees_first else list(module.computations)
    return [c for c in order if c not in fused and c.module is module]


@dataclass(frozen=True)
class ComputationPass(ModulePass):
    """A pass run on each non-fusion computation, callees before callers."""

    @abstractmethod
    def run_on_computation(self, computation: Computation) -> bool:
        """Transform one computation; return True iff it changed."""

    def run(self, module: Module) -> bool:
        changed = False
        for comp in non_fusion_computations(module):
            changed |= self.run_on_computation(comp)
        return changed


@dataclass(frozen=True)
class ExpanderPass(ModulePass):
    """Match one instruction, replace it (XLA's OpExpanderPass).

    `expand` builds the replacement in the instruction's computation (e.g. with a Builder placed
    before it) and returns it; the pass then replaces every use and removes the old instruction.
    Returning None or the instruction itself means "left alone".
    """

    #: The opcodes `instruction_matches` can accept (None: any): a module without them is left at once, and
    #: only instructions of these opcodes are asked.
    opcodes: ClassVar[frozenset[str] | None] = None

    @abstractmethod
    def instruction_matches(self, inst: Instruction) -> bool:
        """Whether `inst` is one this pass rewrites."""

    @abstractmethod
    def expand(self, inst: Instruction) -> Instruction | None:
        """Build the replacement of `inst` (in inst.parent) and return it."""

    def computations(self, module: Module) -> list[Computation]:
        """The computations whose instructions are matched: every non-fusion computation, callees first."""
        return non_fusion_computations(module)

    def matches_while_running(self, inst: Instruction) -> bool:
        """What `run` asks of each instruction of `computations(module)`: `instruction_matches` (a pass
        that narrows `computations` may leave out the checks the narrowing already made)."""
        return self.instruction_matches(inst)

    def carries_annotations(self, old: Instruction) -> bool:
        """Whether the expansion of `old` takes its metadata, frontend attributes and sharding where it has
        none of its own, as XLA's ReplaceInstruction does (the default); False for an expansion that sets
        what it keeps itself."""
        return True

    def explain_expansion(self, old: Instruction, new: Instruction) -> str | None:
        """A line saying what `old` became (before it is replaced by `new`), for the run's
        `PassResult.explanations`; None (the default): nothing to say."""
        return None

    def run(self, module: Module) -> bool:
        return self.expand_all(module, None)

    def run_with_result(self, module: Module) -> PassResult:
        """`run`, with the `explain_expansion` lines of this run (a subclass that overrides `run` alone
        keeps its own `run`)."""
        if type(self).run is not ExpanderPass.run:
            return PassResult(self.run(module))
        notes: list[str] = []
        return PassResult(self.expand_all(module, notes), notes)

    def expand_all(self, module: Module, notes: list[str] | None) -> bool:
        """Expand every match in `computations(module)`; the `explain_expansion` lines go to `notes`."""
        opcodes = self.opcodes
        if opcodes is not None and opcodes.isdisjoint(module_opcodes(module)):
            return False
        changed = False
        for comp in self.computations(module):
            candidates = comp.instructions if opcodes is None else [i for i in comp.instructions if i.opcode in opcodes]
            for inst in [i for i in candidates if self.matches_while_running(i)]:
                new = self.expand(inst)
                if new is None or new is inst:
                    continue
                if notes is not None:
                    note = self.explain_expansion(inst, new)
                    if note is not None:
                        notes.append(note)
                comp.replace_instruction(inst, new, carry_annotations=self.carries_annotations(inst))
                changed = True
        return changed
