"""The shared part of the XLA pass-test conformance assets (tests/xla_conformance/README.md says the format).

A pass's asset is `tests/xla_conformance/<pass>.py` (its CASES) plus `tests/xla_conformance/<pass>/<case>.hlo`
(the inputs of XLA's own unit tests, kept as test data). A Case is one XLA test: its input file, the runs of the
pass the test makes (an hlopt pipeline spec holding XLA's configuration, and the `changed` the test asserts) and
the main structural assertions of the test restated as checks in the small vocabulary below. `run_case` runs a
case with hlopt; `agreement` prints the table. No jax here: numerics are the `_numerics` tests' (`runnable`
says whether XLA:CPU can run a module, `inputs_for` gives inputs that keep XLA's test loops short).

Checks, evaluated on the module after the last run (COMP: `entry`, `module` (every computation), `body` (the
body of the entry's one while), `bodies` (every while body), `fused` (every fused computation), `callee` (the
computations the entry root calls), or `computation:NAME`):
- `root PATTERN`: the entry root matches PATTERN.
- `count COMP PATTERN N` / `exists COMP PATTERN` / `none COMP PATTERN`: N / at least one / no instruction of
  COMP matches PATTERN.
- `state N`: the entry's one while has a tuple state of N elements.
- `loop_init K PATTERN` / `body_root K PATTERN`: operand K of that while's initial tuple / of its body's root.
- `min COMP PATTERN N`: at least N instructions of COMP match PATTERN.
- `count_called PATTERN ROOT N`: N instructions of the module matching PATTERN call a computation whose root
  matches ROOT (FileCheck's `CHECK-COUNT-N: ROOT ... op(` over fused computations).
- `operands_at_most PATTERN N`: every instruction of the module matching PATTERN has at most N operands.
- `ctrl COMP PATTERN PRED`: some instruction of COMP matching PATTERN has a control predecessor matching PRED.
- `distinct COMP PATTERN KEY`: the instructions of COMP matching PATTERN have pairwise different KEY (a filter key).
- `dims OPCODE D0,D1,..`: some instruction of the module with that opcode has `dimensions` D.
- `called_root PATTERN ROOT` (alias `fused_root`): some instruction of the module matching PATTERN (a fusion,
  a call) calls a computation whose root matches ROOT.
- `order COMP P1 | P2 | ...`: instructions matching P1, P2, ... appear in this order in COMP (the entry of an
  unscheduled module in post order, as XLA prints it; a FileCheck
  sequence); each Pk matches the next instruction after the previous match that matches it.

PATTERN: `_` (anything), `zeros` (a zero buffer: a constant of zeros or a broadcast zero scalar, as hlopt writes
zero buffers above 4096 elements), `opcode`, `opcode(P1, ..., Pn)` (all operands, in order), optionally with an attribute
filter after the opcode: `fusion{kind=kLoop}`, `all-reduce{shape=f32[16];channel_id=1}` (`;`-separated;
`shape` compares the shape without layout, `layout` the minor-to-major order (`layout=2,0,1`), `kind` a fusion's kind, `name` the name, `target` a custom call's
target, `op_name` the metadata's, `control_predecessors` their names, `replica_groups` as `0,1|2,3`, `frontend_attributes` `k=v` pairs, `calls` / `to_apply` a called computation's name, `literal` a scalar constant's value, a list of integers
as `dimensions=0,1` (empty: `dimensions=`), any other key the attribute's text).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Run:
    """One run of the pass: an hlopt pipeline spec with XLA's configuration, and what the test asserts."""

    spec: str
    changed: bool | None = None
    #: run on a fresh copy of the input instead of the result of the previous run
    fresh: bool = False
    #: options only Python can give (a callback): then `spec` is one pass name, made with these options
    options: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Case:
    """One XLA unit test: its input (`<folder>/<name>.hlo`), its runs and its checks."""

    folder: str
    name: str
    runs: tuple[Run, ...]
    checks: tuple[str, ...] = ()
    #: what of the test's assertions the checks leave out, and other facts of the case
    note: str = ""
    #: XLA:CPU cannot run the module (a custom call only a GPU runs, a send/recv): the reason
    not_runnable: str = ""
    #: module config the C++ test sets (replica_count, num_partitions, use_spmd_partitioning)
    config: tuple[tuple[str, Any], ...] = ()
    #: the input file's stem when it is not `name` (two cases on one input)
    input: str = ""

    @property
    def path(self) -> Path:
        return ROOT / self.folder / f"{self.input or self.name}.hlo"

    @property
    def text(self) -> str:
        return self.path.read_text()


@dataclass
class Outcome:
    """What hlopt did on one case."""

    case: Case
    changed: list[bool] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: the module before and after each run that changed it (for numerics)
    modules: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not self.failures


def load(case: Case):  # noqa: ANN201 - a Module
    """The case's input module, with the module config its C++ test sets."""
    from hlopt.hlo import parse

    module = parse(case.text)
    for key, value in case.config:
        module.config[key] = value
    return module


def run_spec(module, spec: str, options: tuple[tuple[str, Any], ...] = ()) -> bool:  # noqa: ANN001 - a Module
    """Run an hlopt pipeline spec (or one pass made with Python `options`) on `module`, verified after when it
    changed; whether it changed the module."""
    from hlopt.hlo import verify
    from hlopt.passes.framework.pipeline import run_pipeline
    from hlopt.passes.framework.registry import create_pass

    if options:
        changed = create_pass(spec, **dict(options)).run(module)
    else:
        changed = run_pipeline(module, spec, verify_each=False, check_changed=False).changed
    if changed:  # XLA's tests verify allowing mixed precision; hlopt's verifier is stricter on some inputs
        verify(module)
    return bool(changed)


def run_case(case: Case, keep_modules: bool = False) -> Outcome:
    """Run a case's runs with hlopt and evaluate its checks."""
    out = Outcome(case)
    try:
        original = load(case)
    except Exception as e:  # noqa: BLE001 - a parse error is a difference, reported in the table
        out.failures.append(f"parse: {str(e).splitlines()[0]}")
        return out
    module = original.clone()
    for n, run in enumerate(case.runs):
        if run.fresh:
            module = original.clone()
        before = module.clone() if keep_modules else None
        try:
            changed = run_spec(module, run.spec, run.options)
        except Exception as e:  # noqa: BLE001 - reported as a difference
            first = str(e).splitlines()[0] if str(e) else ""
            out.failures.append(f"run {n + 1}: {type(e).__name__}: {first}")
            return out
        out.changed.append(changed)
        if keep_modules and changed:
            out.modules.append((before, module.clone()))
        if run.changed is not None and changed != run.changed:
            out.failures.append(f"run {n + 1}: changed={changed}, XLA: {run.changed}")
    for check in case.checks:
        try:
            problem = evaluate(check, module)
        except Exception as e:  # noqa: BLE001 - a check that cannot be evaluated is a difference
            problem = f"{type(e).__name__}: {e}"
        if problem:
            out.failures.append(f"{check!r}: {problem}")
    return out


# --------------------------------------------------------------------------- patterns
def _split(text: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside parentheses, brackets and braces."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


_PATTERN = re.compile(r"([\w-]+)(?:\{([^{}]*)\})?(?:\((.*)\))?", re.S)


def _attr_text(inst, key: str) -> str:  # noqa: ANN001 - an Instruction
    if key == "shape":
        return inst.shape.to_text(layout=False)
    if key == "layout":
        layout = getattr(inst.shape, "layout", None)
        return "" if layout is None else ",".join(map(str, layout.minor_to_major))
    if key == "kind":
        return str(inst.attrs.get("kind", ""))
    if key == "name":
        return inst.name
    if key == "target":
        return str(inst.attrs.get("custom_call_target", ""))
    if key == "replica_groups":
        groups = inst.attrs.get("replica_groups")
        return "" if groups is None else "|".join(",".join(map(str, g)) for g in groups.groups())
    if key == "op_name":
        return str(getattr(inst.metadata, "op_name", "") or "") if inst.metadata is not None else ""
    if key == "control_predecessors":
        return ",".join(sorted(p.name for p in inst.control_predecessors))
    if key == "frontend_attributes":
        return ",".join(f"{k}={v}" for k, v in sorted((inst.frontend_attributes or {}).items()))
    value = inst.attrs.get(key)
    if key == "literal" and value is not None:
        scalar = value.scalar()
        return f"{scalar:g}" if isinstance(scalar, float) else str(scalar)
    if hasattr(value, "name") and hasattr(value, "instructions"):
        return value.name
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return ",".join(map(str, value))
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _is_zeros(inst) -> bool:  # noqa: ANN001 - an Instruction
    """A zero buffer: a constant of zeros, or a broadcast of a zero scalar constant."""
    if inst.opcode == "broadcast":
        inst = inst.operand(0)
        if inst.opcode != "constant" or inst.shape.rank:
            return False
    if inst.opcode != "constant":
        return False
    try:
        return not inst.attrs["literal"].to_numpy().any()
    except Exception:  # noqa: BLE001 - an elided literal is not a known zero
        return False


def matches(inst, pattern: str) -> bool:  # noqa: ANN001 - an Instruction
    """Whether `inst` matches PATTERN (module docstring)."""
    pattern = pattern.strip()
    if pattern == "_":
        return True
    m = _PATTERN.fullmatch(pattern)
    if m is None:
        raise ValueError(f"bad pattern {pattern!r}")
    if m.group(1) == "zeros":
        if not _is_zeros(inst):
            return False
    elif inst.opcode != m.group(1):
        return False
    for item in _split(m.group(2) or "", ";"):
        key, _, want = item.partition("=")
        if _attr_text(inst, key.strip()) != want.strip():
            return False
    if m.group(3) is None:
        return True
    args = _split(m.group(3))
    return len(args) == inst.operand_count and all(matches(o, a) for o, a in zip(inst.operands, args, strict=True))


# --------------------------------------------------------------------------- checks
def _the_while(module):  # noqa: ANN001, ANN202
    whiles = [i for i in module.entry.instructions if i.opcode == "while"]
    return whiles[0] if len(whiles) == 1 else None


def instructions(module, comp: str) -> list:  # noqa: ANN001
    """The instructions of COMP (module docstring)."""
    if comp == "entry":
        return list(module.entry.instructions)
    if comp == "module":
        return [i for c in module.computations for i in c.instructions]
    if comp == "bodies":
        bodies = {id(i.attrs["body"]): i.attrs["body"] for c in module.computations for i in c.instructions
                  if i.opcode == "while"}
        return [i for b in bodies.values() for i in b.instructions]
    if comp == "fused":
        fused = {id(c): c for i in module.instructions() if i.opcode == "fusion" for c in i.called_computations}
        return [i for c in fused.values() for i in c.instructions]
    if comp == "callee":
        return [i for c in module.entry.root.called_computations for i in c.instructions]
    if comp.startswith("computation:"):
        return list(module.computation(comp.split(":", 1)[1]).instructions)
    if comp == "body":
        w = _the_while(module)
        return [] if w is None else list(w.attrs["body"].instructions)
    raise ValueError(f"unknown computation {comp!r}")


def xla_post_order(comp) -> list:  # noqa: ANN001 - a Computation
    """XLA's MakeInstructionPostOrder: a depth-first post order from each instruction without users (in
    instruction order), operands (then control predecessors) in order."""
    seen: set[int] = set()
    out: list = []
    for start in comp.instructions:
        if start.users or id(start) in seen:
            continue
        stack = [(start, False)]
        while stack:
            inst, expanded = stack.pop()
            if expanded:
                out.append(inst)
                continue
            if id(inst) in seen:
                continue
            seen.add(id(inst))
            stack.append((inst, True))
            preds = [*inst.operands, *inst.control_predecessors]
            stack.extend((o, False) for o in reversed(preds) if id(o) not in seen)
    return out


def _order(module, rest: str) -> str:  # noqa: ANN001
    comp, _, seq = rest.partition(" ")
    insts = instructions(module, comp)
    if comp == "entry" and not module.is_scheduled:  # XLA prints (and FileCheck reads) a post order
        insts = xla_post_order(module.entry)
    pos = 0
    for pattern in (p.strip() for p in seq.split(" | ")):
        while pos < len(insts) and not matches(insts[pos], pattern):
            pos += 1
        if pos == len(insts):
            return f"no {pattern!r} in order"
        pos += 1
    return ""


def _called(inst) -> list:  # noqa: ANN001
    return list(inst.called_computations)


def evaluate(check: str, module) -> str:  # noqa: ANN001, C901 - a Module; one branch per check kind
    """'' when the check holds, else what was found."""
    kind, _, rest = check.partition(" ")
    if kind == "root":
        return "" if matches(module.entry.root, rest) else f"root is {module.entry.root.opcode}"
    if kind == "count_called":
        parts = _split(rest, " ")
        pattern, root, n = parts[0], " ".join(parts[1:-1]), int(parts[-1])
        found = sum(1 for i in instructions(module, "module") if matches(i, pattern)
                    and any(matches(c.root, root) for c in _called(i)))
        return "" if found == n else f"{found} found"
    if kind == "operands_at_most":
        pattern, _, n = rest.rpartition(" ")
        worst = max((i.operand_count for i in instructions(module, "module") if matches(i, pattern)), default=0)
        return "" if worst <= int(n) else f"one has {worst} operands"
    if kind == "min":
        comp, _, rest = rest.partition(" ")
        pattern, _, n = rest.rpartition(" ")
        found = sum(1 for i in instructions(module, comp) if matches(i, pattern))
        return "" if found >= int(n) else f"{found} found"
    if kind in ("count", "exists", "none"):
        comp, _, rest = rest.partition(" ")
        if kind == "count":
            pattern, _, n = rest.rpartition(" ")
            found = sum(1 for i in instructions(module, comp) if matches(i, pattern))
            return "" if found == int(n) else f"{found} found"
        found = sum(1 for i in instructions(module, comp) if matches(i, rest))
        if kind == "exists":
            return "" if found else "none found"
        return "" if not found else f"{found} found"
    if kind == "order":
        return _order(module, rest)
    if kind in ("ctrl", "distinct"):
        comp, pattern, last = _split(rest, " ")[0], " ".join(_split(rest, " ")[1:-1]), _split(rest, " ")[-1]
        found = [i for i in instructions(module, comp) if matches(i, pattern)]
        if kind == "ctrl":
            ok = any(matches(p, last) for i in found for p in i.control_predecessors)
            return "" if ok else f"{len(found)} match, none with such a control predecessor"
        values = [_attr_text(i, last) for i in found]
        return "" if len(values) > 1 and len(set(values)) == len(values) else f"values {values}"
    if kind in ("called_root", "fused_root"):
        pattern, root = _split(rest, " ")[0], " ".join(_split(rest, " ")[1:])
        ok = any(matches(c.root, root) for i in instructions(module, "module") if matches(i, pattern)
                 for c in _called(i))
        return "" if ok else "none found"
    if kind == "dims":
        opcode, _, dims = rest.partition(" ")
        want = tuple(int(d) for d in dims.split(","))
        ok = any(tuple(i.attrs.get("dimensions") or ()) == want for i in instructions(module, "module")
                 if i.opcode == opcode)
        return "" if ok else "none found"
    w = _the_while(module)
    if kind == "state":
        return "" if w is not None and len(w.shape.elements) == int(rest) else "other state"
    if kind in ("loop_init", "body_root"):
        k, _, pattern = rest.partition(" ")
        if w is None:
            return "no single while"
        tup = w.operand(0) if kind == "loop_init" else w.attrs["body"].root
        ok = tup.opcode == "tuple" and int(k) < tup.operand_count and matches(tup.operand(int(k)), pattern)
        return "" if ok else "no match"
    raise ValueError(f"unknown check {check!r}")


# --------------------------------------------------------------------------- numerics helpers (no jax here)
def runnable(module) -> str:  # noqa: ANN001 - a Module
    """'' when XLA:CPU can run the module, else why not."""
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode in ("send", "recv", "send-done", "recv-done", "infeed", "outfeed"):
                return f"%{inst.name} ({inst.opcode}) does not run on XLA:CPU"
            if inst.opcode == "custom-call":
                return f"%{inst.name} (custom-call {inst.attrs.get('custom_call_target')}) does not run on XLA:CPU"
    return ""


# --------------------------------------------------------------------------- the table
def outcomes(cases: Sequence[Case], runner: Callable[[Case], Outcome] = run_case) -> list[Outcome]:
    return [runner(c) for c in cases]


def print_table(rows: Iterable[tuple[str, list[Any]]], verbose: bool = False, out=sys.stdout) -> None:  # noqa: ANN001
    """`| pass | cases | agree |` for (pass name, outcomes) rows; with `verbose`, why each differing case
    differs."""
    rows = list(rows)
    print("| pass | cases | agree |\n|---|---:|---:|", file=out)
    for name, outs in rows:
        agree = sum(bool(o.agrees) for o in outs)
        print(f"| {name} | {len(outs)} | {agree} ({100 * agree / max(len(outs), 1):.0f}%) |", file=out)
    if verbose:
        for name, outs in rows:
            for o in outs:
                if not o.agrees:
                    print(f"- {name} / {o.case.name}: {'; '.join(o.failures)}", file=out)


def checks_on_input(case: Case) -> list[str]:
    """The checks of a case that hold on its input already. A case whose runs change the module needs one that
    does not (else its checks could not tell the rewrite apart)."""
    module = load(case)
    return [c for c in case.checks if not evaluate(c, module)]


def assert_case(case: Case, differing: dict[str, str], runner: Callable[[Case], Outcome] = run_case) -> None:
    """One case's pytest: it agrees, or it is listed in `differing` (then it xfails with the reason, and a
    listed case that starts agreeing fails so that the list stays true)."""
    import pytest

    outcome = runner(case)
    if case.name in differing:
        assert not outcome.agrees, f"{case.name} now agrees with XLA: take it off DIFFERING"
        pytest.xfail(differing[case.name])
    assert outcome.agrees, "; ".join(outcome.failures)


def assert_agreement(cases: Sequence[Case], differing: dict[str, str], runner: Callable[[Case], Outcome] = run_case,
                     at_least: float = 0.0) -> None:
    """The agreement count is the cases not listed in `differing` (the README's table), and at least the
    `at_least` share of the cases."""
    assert set(differing) <= {c.name for c in cases}, "DIFFERING names a case the asset lacks"
    agree = sum(runner(c).agrees for c in cases)
    assert agree == len(cases) - len(differing)
    assert agree >= at_least * len(cases)
