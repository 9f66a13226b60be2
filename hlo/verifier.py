"""The verifier: structural and shape invariants every module must keep between passes.

`verify(module)` raises `HloVerifyError` listing every problem found, each naming the instruction and
computation and showing its neighbourhood; `verify_report(module)` returns the problems instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hlo.ir import Computation, Instruction, Module
from hlo.opcodes import is_known_opcode
from hlo.shape import Shape, TupleShape
from hlo.shape_inference import INFERENCE_RULES, ShapeInferenceError, infer_shape

__all__ = ["verify", "verify_report", "HloVerifyError", "VerifyProblem"]


@dataclass
class VerifyProblem:
    """One broken invariant."""

    computation: str
    instruction: str | None
    message: str
    context: str = ""

    def __str__(self) -> str:
        where = f"%{self.instruction} in {self.computation}" if self.instruction else self.computation
        return f"{where}: {self.message}" + (f"\n{self.context}" if self.context else "")


class HloVerifyError(ValueError):
    """The module breaks invariants; `.problems` lists them."""

    def __init__(self, problems: list[VerifyProblem]):
        self.problems = problems
        shown = "\n".join(str(p) for p in problems[:20])
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} verifier problem(s):\n{shown}{more}")


def _neighbourhood(inst: Instruction, radius: int = 2) -> str:
    comp = inst.parent
    if comp is None or inst not in comp.instructions:
        return "  " + inst.to_text()
    i = comp.instructions.index(inst)
    lines = []
    for j in range(max(0, i - radius), min(len(comp.instructions), i + radius + 1)):
        mark = ">>" if j == i else "  "
        lines.append(f"  {mark} {comp.instructions[j].to_text()[:200]}")
    return "\n".join(lines)


class _Checker:
    def __init__(self, module: Module):
        self.module = module
        self.problems: list[VerifyProblem] = []

    def report(self, comp: Computation, inst: Instruction | None, message: str) -> None:
        context = _neighbourhood(inst) if inst is not None else ""
        self.problems.append(VerifyProblem(comp.name, inst.name if inst else None, message, context))

    def run(self) -> list[VerifyProblem]:
        m = self.module
        if m.entry is None or m.entry not in m.computations:
            self.problems.append(VerifyProblem(m.name, None, "the module has no entry computation"))
            return self.problems
        names = Counter(c.name for c in m.computations)
        for name, n in names.items():
            if n > 1:
                self.problems.append(VerifyProblem(name, None, f"computation name used {n} times"))
        for comp in m.computations:
            self.check_computation(comp)
        return self.problems

    def check_computation(self, comp: Computation) -> None:
        if not comp.instructions:
            self.report(comp, None, "computation has no instructions")
            return
        if comp.root is None or comp.root.parent is not comp:
            self.report(comp, None, "root is missing or not in this computation")
        members = set(comp.instructions)
        if len(members) != len(comp.instructions):
            self.report(comp, None, "an instruction appears twice in the instruction list")
        seen_names: dict[str, Instruction] = {}
        position = {inst: i for i, inst in enumerate(comp.instructions)}
        params: dict[int, Instruction] = {}
        for inst in comp.instructions:
            if inst.name in seen_names:
                self.report(comp, inst, f"name %{inst.name} is used twice in the computation")
            seen_names[inst.name] = inst
            if inst.parent is not comp:
                self.report(comp, inst, "parent link does not point to this computation")
            if not is_known_opcode(inst.opcode):
                self.report(comp, inst, f"unknown opcode {inst.opcode!r}")
            if inst.opcode == "parameter":
                n = inst.attrs.get("parameter_number")
                if n in params:
                    self.report(comp, inst, f"parameter number {n} is used twice")
                params[n] = inst
            self.check_use_def(comp, inst, members, position)
            self.check_called(comp, inst)
            self.check_shape(comp, inst)
        if params and sorted(params) != list(range(len(params))):
            self.report(comp, None, f"parameter numbers {sorted(params)} are not 0..{len(params) - 1}")

    def check_use_def(self, comp: Computation, inst: Instruction, members: set, position: dict) -> None:
        counts = Counter(inst._operands)
        for op, n in counts.items():
            if op not in members:
                self.report(comp, inst, f"operand %{op.name} is not in computation {comp.name}")
                continue
            if op._users.get(inst) != n:
                self.report(comp, inst, f"operand %{op.name} lists this instruction {op._users.get(inst, 0)} "
                                        f"time(s) among its users, but it is used {n} time(s)")
            if position[op] > position[inst]:
                self.report(comp, inst, f"operand %{op.name} is defined after its use (instructions out of order)")
        for user, n in inst._users.items():
            if user.parent is not comp:
                self.report(comp, inst, f"user %{user.name} is not in this computation")
            elif Counter(user._operands)[inst] != n:
                self.report(comp, inst, f"user %{user.name} does not use this instruction {n} time(s)")
        for pred in inst._control_preds:
            if inst not in pred._control_succs:
                self.report(comp, inst, f"control predecessor %{pred.name} does not list it as successor")
            if pred in position and position[pred] > position[inst]:
                self.report(comp, inst, f"control predecessor %{pred.name} comes after it")
            if pred.parent is not comp:
                self.report(comp, inst, f"control predecessor %{pred.name} is in another computation")

    def check_called(self, comp: Computation, inst: Instruction) -> None:
        for callee in inst.called_computations:
            if callee.module is not self.module or callee not in self.module.computations:
                self.report(comp, inst, f"calls computation %{callee.name}, which is not in the module")
                continue
            if callee.root is None:
                continue
            self.check_signature(comp, inst, callee)

    def check_signature(self, comp: Computation, inst: Instruction, callee: Computation) -> None:
        op = inst.opcode
        params = callee.parameters
        if op == "while":
            if len(params) != 1 or not params[0].shape.compatible(inst.shape):
                self.report(comp, inst, f"while {callee.name} must take one parameter of the loop shape {inst.shape}")
            if callee is inst.attrs.get("condition"):
                r = callee.root.shape
                if r.is_tuple or r.dtype != "pred" or r.rank:
                    self.report(comp, inst, f"while condition {callee.name} must return pred[], returns {r}")
            elif callee is inst.attrs.get("body") and not callee.root.shape.compatible(inst.shape):
                self.report(comp, inst, f"while body {callee.name} returns {callee.root.shape}, not {inst.shape}")
        elif op in ("call", "fusion"):
            if len(params) != inst.operand_count:
                self.report(comp, inst, f"{callee.name} takes {len(params)} parameter(s), called with "
                                        f"{inst.operand_count}")
            else:
                for p, a in zip(params, inst.operands, strict=True):
                    if not p.shape.compatible(a.shape):
                        self.report(comp, inst, f"parameter {p.attrs['parameter_number']} of {callee.name} is "
                                                f"{p.shape}, operand is {a.shape}")
            if not callee.root.shape.compatible(inst.shape):
                self.report(comp, inst, f"{callee.name} returns {callee.root.shape}, instruction is {inst.shape}")
        elif op in ("reduce", "reduce-window", "all-reduce", "reduce-scatter", "all-reduce-start", "scatter",
                    "select-and-scatter") and callee is inst.attrs.get("to_apply"):
            for p in params:
                if p.shape.is_tuple or p.shape.rank:
                    self.report(comp, inst, f"reducer {callee.name} must take scalars, parameter is {p.shape}")
                    return
            if op in ("reduce", "reduce-window") and len(params) != inst.operand_count:
                self.report(comp, inst, f"reducer {callee.name} takes {len(params)} parameters, expected "
                                        f"{inst.operand_count}")
        elif op == "conditional":
            branches = inst.attrs.get("branch_computations") or [inst.attrs.get("true_computation"),
                                                                  inst.attrs.get("false_computation")]
            if callee in branches and not callee.root.shape.compatible(inst.shape):
                self.report(comp, inst, f"branch {callee.name} returns {callee.root.shape}, not {inst.shape}")

    def check_shape(self, comp: Computation, inst: Instruction) -> None:
        if inst.shape is None:
            self.report(comp, inst, "instruction has no shape")
            return
        if inst.opcode not in INFERENCE_RULES or any(op.shape is None for op in inst.operands):
            return
        try:
            expected = infer_shape(inst)
        except ShapeInferenceError as e:
            self.report(comp, inst, f"shape inference failed: {e}")
            return
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            self.report(comp, inst, f"malformed {inst.opcode}: {type(e).__name__}: {e}")
            return
        if not _compatible(expected, inst.shape):
            self.report(comp, inst, f"shape {inst.shape} does not match the inferred {expected}")


def _compatible(a: Shape | TupleShape, b: Shape | TupleShape) -> bool:
    return a.compatible(b)


def verify_report(module: Module) -> list[VerifyProblem]:
    """Every problem found (empty if the module is valid)."""
    return _Checker(module).run()


def verify(module: Module) -> None:
    """Raise HloVerifyError if the module breaks any invariant."""
    problems = verify_report(module)
    if problems:
        raise HloVerifyError(problems)
