"""Pipelines: a spec string like `call-inliner,fix(algebraic-simplifier,dce),my-pass{threshold=8}`.

Running a pipeline verifies the module around every pass (`verify_each`; inside a `fix(...)` group once, at
the end of the outermost group, as XLA's release builds do: `HloPassFix` with a debug-only verifier inside;
`verify_in_fix="every-pass"` verifies after each pass there too), runs `fix(...)` groups to a
fixed point with an iteration limit and cycle detection, skips a run of a pass on a module that no IR edit
touched since the same pass (same options) last ran on it and changed nothing (`Pass.skip_unchanged_reruns`), checks that each pass's returned `changed`
is honest (by default from the module's IR edit counter, `Module.mutations`: a pass that edits the
module through the IR and returns False fails; with `paranoid=True` the module text is hashed around
every pass, which also catches direct attribute writes and `True` with nothing changed, and nothing passes
remember of the module by its edit stamps is trusted: `passes.framework.fixed_points`, `module_opcodes`), names
the passes that ran before a failing one, and can dump the module after each pass and time each pass.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlopt.hlo.gc_pause import collection_paused
from hlopt.hlo.ir import Module
from hlopt.hlo.verifier import HloVerifyError, VerifyCheckpoint, checkpoint_of, verify, verify_changes
from hlopt.passes.framework.base import Pass, PassResult, forget_module_facts
from hlopt.passes.framework.fixed_points import forget_fixed_points
from hlopt.passes.framework.registry import PassOptionError, create_pass, has_pass, load_builtins

#: `Pipeline.verify_in_fix`: verify a fix group once at its end (XLA's release builds), or after every pass
VERIFY_IN_FIX_MODES = ("end", "every-pass")

__all__ = [
    "Pipeline", "Fix", "PipelineError", "PassFailure", "PassRecord", "PipelineResult",
    "parse_pipeline", "NAMED_PIPELINES", "NamedPipelines", "register_pipeline", "expanded_pipeline", "run_pipeline",
]

class NamedPipelines(Mapping[str, str]):
    """Named pipelines usable anywhere in a spec (`default`, `simplify`, ...): name -> spec. hlopt's own are
    defined in `hlopt.pipelines`, loaded with the built-in passes on first use (`passes.framework.registry`); a plugin
    adds its own with `register_pipeline`."""

    def __init__(self) -> None:
        self._specs: dict[str, str] = {}

    def _loaded(self) -> dict[str, str]:
        load_builtins()
        return self._specs

    def __getitem__(self, name: str) -> str:
        return self._loaded()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._specs or name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"NamedPipelines({self._loaded()!r})"

    def register(self, name: str, spec: str) -> None:
        """Name `spec` (a later registration of the name replaces it)."""
        self._specs[name] = spec


NAMED_PIPELINES = NamedPipelines()


def register_pipeline(name: str, spec: str) -> None:
    """Make `spec` available as the named pipeline `name` (a later registration of the name replaces it)."""
    NAMED_PIPELINES.register(name, spec)


def expanded_pipeline(name: str, keep: tuple[str, ...] = ("simplify", "cleanup", "fusion")) -> str:
    """A named pipeline's spec with the named pipelines it uses written out, but those in `keep` (a spec
    names them as well as it spells them)."""
    from hlopt.hlo.lexer import split_top_level

    parts = []
    for part in split_top_level(NAMED_PIPELINES[name]):
        part = part.strip()
        parts.append(expanded_pipeline(part, keep) if part in NAMED_PIPELINES and part not in keep else part)
    return ",".join(parts)


class PipelineError(ValueError):
    """A malformed pipeline spec (with the position of the problem)."""


class PassFailure(RuntimeError):
    """A pass raised, broke the verifier, or lied about `changed`; names the passes before it."""

    def __init__(self, pass_name: str, history: list[str], reason: str):
        self.pass_name = pass_name
        self.history = history
        self.reason = reason
        ran = ", ".join(history[-12:]) if history else "none"
        more = f" (and {len(history) - 12} earlier)" if len(history) > 12 else ""
        super().__init__(f"pass {pass_name!r} failed: {reason}\n  passes that ran before it: {ran}{more}")


def unfused_instruction_count(module: Module, memo: dict | None = None) -> int:
    """Instructions outside fused computations, a fusion counting as one: the figure to compare before and
    after fusion (entry, loop bodies, branches and reducers included).

    `memo` (a dict the caller keeps between calls) remembers each computation's fusion callees by its edit
    stamp, so that a count after a few edits rescans only the computations they touched."""
    memo = {} if memo is None else memo
    fused: set = set()
    for comp in module.computations:
        stamp = comp.edit_stamp
        known = memo.get(comp)
        if known is None or known[0] != stamp:
            known = memo[comp] = (stamp, tuple(c for inst, called in comp.calling_instructions()
                                               if inst.opcode == "fusion" for c in called))
        fused.update(known[1])
    return sum(len(c) for c in module.computations if c not in fused)


@dataclass
class PassRecord:
    """What one pass run did."""

    name: str
    changed: bool
    seconds: float
    instructions_before: int
    instructions_after: int
    iteration: int | None = None
    #: which `fix(...)` group ran it (1, 2, ... in the order the groups ran), None outside any group
    group: int | None = None
    #: what the pass said about its decisions (`PassResult.explanations`: the fusion passes' explanations)
    explanations: list[Any] = field(default_factory=list)
    #: what verify_each checked after the pass (`VerifyScope` as text: "full: ...", "incremental: ...");
    #: "not verified (unchanged)" when the pass changed nothing, "off" without verify_each
    verified: str = ""
    #: CPU time of the pass (this process's, `time.process_time`): steadier than `seconds` on a loaded machine
    cpu_seconds: float = 0.0
    #: not run: no IR edit touched the module since this pass (same options) last ran and changed nothing
    skipped: bool = False

    def explain_lines(self) -> list[str]:
        """The explanations as text, one line each."""
        return [str(e) for e in self.explanations]

    @property
    def label(self) -> str:
        """The pass name, with its fix group and iteration when it ran inside one (`cse [fix 2, iter 0]`)."""
        if self.iteration is None:
            return self.name
        return f"{self.name} [fix {self.group}, iter {self.iteration}]"


@dataclass
class PipelineResult:
    """The outcome of running a pipeline."""

    changed: bool = False
    records: list[PassRecord] = field(default_factory=list)

    @property
    def explanations(self) -> list[Any]:
        """The explanations of every pass run, in the order they ran (like torch.fx's PassResult, what a
        pass found comes back in the result; the pass objects keep nothing)."""
        return [e for r in self.records for e in r.explanations]

    def explain_lines(self) -> list[str]:
        """`explanations` as text, one line each (`hlopt opt --explain`)."""
        return [str(e) for e in self.explanations]

    def timing_table(self) -> str:
        """Per-pass time and instruction counts, as aligned text."""
        lines = [f"{'pass':40} {'changed':>7} {'ms':>9} {'instrs before':>13} {'after':>8} {'cpu ms':>9}"]
        for r in self.records:
            name = r.label + (" (skipped)" if r.skipped else "")
            lines.append(
                f"{name:40} {str(r.changed):>7} {r.seconds * 1e3:9.2f} {r.instructions_before:13d} "
                f"{r.instructions_after:8d} {r.cpu_seconds * 1e3:9.2f}"
            )
        total = sum(r.seconds for r in self.records)
        cpu = sum(r.cpu_seconds for r in self.records)
        lines.append(f"{'total':40} {str(self.changed):>7} {total * 1e3:9.2f} {'':13} {'':8} {cpu * 1e3:9.2f}")
        return "\n".join(lines)


@dataclass
class Fix:
    """Run the inner passes repeatedly until none changes the module (or the limit is hit)."""

    passes: list[Pass | Fix]
    max_iterations: int = 25

    @property
    def name(self) -> str:
        """The spec form."""
        return "fix(" + ",".join(_element_name(p) for p in self.passes) + ")"


def _element_name(p: Pass | Fix) -> str:
    return p.name if isinstance(p, Fix) else p.describe()


@dataclass
class Pipeline:
    """An ordered list of passes and fixed-point groups, with run-time checks."""

    passes: list[Pass | Fix]
    verify_each: bool = True
    check_changed: bool = True
    paranoid: bool = False
    dump_dir: Path | None = None
    timing: bool = False
    #: where `verify_each` verifies inside `fix(...)` groups: "end" (once, when the outermost group reaches
    #: its fixed point or fails; XLA's release builds) or "every-pass" (after each pass that changed the module)
    verify_in_fix: str = "end"

    def __post_init__(self) -> None:
        if self.verify_in_fix not in VERIFY_IN_FIX_MODES:
            raise ValueError(f"verify_in_fix must be one of {VERIFY_IN_FIX_MODES}, not {self.verify_in_fix!r}")

    @classmethod
    def parse(cls, spec: str, **kwargs: object) -> Pipeline:
        """A pipeline from a spec string."""
        return cls(parse_pipeline(spec), **kwargs)

    @property
    def spec(self) -> str:
        """The spec string of this pipeline."""
        return ",".join(_element_name(p) for p in self.passes)

    def run(self, module: Module, *, input_verified: bool = False) -> PipelineResult:
        """Run every pass on `module` in place. With `verify_each` the input is verified first, unless the
        caller has just verified it (`input_verified=True`, as `hlopt opt` does to report errors its way)."""
        with collection_paused():  # passes make and drop many linked objects; cyclic GC mid-pass only costs time
            state = _RunState(self, module)
            if self.verify_each and not input_verified:
                state.verify("(input)", [])
            elif self.verify_each and not self.paranoid:
                state.checkpoint = checkpoint_of(module)  # the caller verified it: changes are checked from here
                state.verified_at = module.mutations
            for element in self.passes:
                state.run_element(element)
            return state.result


class _RunState:
    def __init__(self, pipeline: Pipeline, module: Module):
        self.pipeline = pipeline
        self.module = module
        self.result = PipelineResult()
        self.history: list[str] = []
        self.dump_index = 0
        self.groups_run = 0
        self.group: int | None = None
        self._count: tuple[int, int] | None = None  # (Module.mutations, unfused_instruction_count) last counted
        self._fusion_callees: dict = {}  # unfused_instruction_count's memo
        self.checkpoint: VerifyCheckpoint | None = None  # where incremental verification starts from
        #: Module.mutations at the last verification (a group's end verifies only if it moved)
        self.verified_at: int | None = None
        #: pass spec -> Module.mutations after its last run that changed nothing (and edited nothing)
        self._unchanged_at: dict[str, int] = {}
        if pipeline.dump_dir is not None:
            Path(pipeline.dump_dir).mkdir(parents=True, exist_ok=True)
            self.dump("input")

    def verify(self, pass_name: str, history: list[str]) -> str:
        """Verify the module (incrementally from the last verification unless paranoid); returns what was
        checked, as text."""
        try:
            if self.pipeline.paranoid:
                verify(self.module)
                self.checkpoint = None
                return "full (paranoid)"
            self.checkpoint, scope = verify_changes(self.module, self.checkpoint)
            self.verified_at = self.module.mutations
            return str(scope)
        except HloVerifyError as e:
            self.checkpoint = None
            if pass_name == "(input)":
                raise
            raise PassFailure(pass_name, history, f"the module no longer verifies:\n{e}") from e

    def instruction_count(self) -> int:
        """`unfused_instruction_count` of the module, counted again only after an IR edit."""
        edits = self.module.mutations
        if self._count is None or self._count[0] != edits:
            self._count = (edits, unfused_instruction_count(self.module, self._fusion_callees))
        return self._count[1]

    def fingerprint(self) -> str:
        return hashlib.sha1(self.module.to_text().encode()).hexdigest()

    def run_element(self, element: Pass | Fix, iteration: int | None = None) -> bool:
        if isinstance(element, Fix):
            return self.run_fix(element)
        return self.run_pass(element, iteration)

    def run_fix(self, fix: Fix) -> bool:
        self.groups_run += 1
        outer, self.group = self.group, self.groups_run
        deferred = self.defers_verification() and outer is None
        try:
            changed = self.run_fix_group(fix)
        except PassFailure as failure:
            if deferred:
                self.verify_group_end(fix, failure)
            raise
        finally:
            self.group = outer
        if deferred:
            self.verify_group_end(fix)
        return changed

    def defers_verification(self) -> bool:
        """Whether passes inside a fix group are verified only at the end of the outermost group."""
        p = self.pipeline
        return p.verify_each and not p.paranoid and p.verify_in_fix == "end"

    def verify_group_end(self, fix: Fix, failure: PassFailure | None = None) -> None:
        """Verify the module once at the end of an outermost fix group (if any pass in it edited the module).
        After a failing pass (`failure`) a verification error is dropped: the pass's failure is what is reported."""
        if self.module.mutations == self.verified_at:
            return
        try:
            scope = verify_changes(self.module, self.checkpoint)
        except HloVerifyError as e:
            self.checkpoint = None
            if failure is not None:
                return  # the pass failure is reported; the module may be half-edited
            raise PassFailure(fix.name, list(self.history),
                              f"the module no longer verifies at the end of the group (verified once there, as "
                              f"XLA's release builds do; --verify-each=every-pass finds the pass):\n{e}") from e
        self.checkpoint, checked = scope
        self.verified_at = self.module.mutations
        if self.result.records:
            last = self.result.records[-1]
            last.verified = f"{last.verified}; group end: {checked}" if last.verified else f"group end: {checked}"

    def run_fix_group(self, fix: Fix) -> bool:
        """Run `fix` to its fixed point. The cycle check hashes the module's text after each iteration that
        changed it, from the second such iteration on (most groups settle after one changing iteration
        and never print the module; a cycle is then caught one period later); paranoid hashes from the
        input on."""
        eager = self.pipeline.paranoid
        seen = {self.fingerprint()} if eager else set()
        any_change = False
        for i in range(fix.max_iterations):
            changed = False
            for p in fix.passes:
                changed |= self.run_element(p, iteration=i)
            any_change |= changed
            if not changed:
                return any_change
            if not eager and i == 0:
                continue
            fp = self.fingerprint()
            if fp in seen:
                raise PassFailure(fix.name, self.history, f"cycle: iteration {i} reproduced an earlier module")
            seen.add(fp)
        raise PassFailure(fix.name, self.history, f"no fixed point after {fix.max_iterations} iterations")

    def may_skip(self, p: Pass) -> bool:
        """Whether this pipeline skips `p`'s reruns on an unedited module (never when paranoid: a pass's
        direct attribute writes, which only the paranoid hash sees, would go unnoticed)."""
        if self.pipeline.paranoid:
            return False
        says = getattr(type(p), "skip_unchanged_reruns", None)
        if says is None:
            from hlopt.passes import BUILTIN_PASS_MODULES

            return type(p).__module__ in BUILTIN_PASS_MODULES
        return bool(says)

    def record_skip(self, name: str, iteration: int | None) -> bool:
        """The record of a run skipped because it could change nothing (always returns False: unchanged)."""
        n = self.instruction_count()
        self.result.records.append(
            PassRecord(name, False, 0.0, n, n, iteration, self.group if iteration is not None else None,
                       verified="not run (no edit since its last run changed nothing)", skipped=True))
        return False

    def run_pass(self, p: Pass, iteration: int | None) -> bool:
        name = p.describe()
        skippable = self.may_skip(p)
        if skippable and self._unchanged_at.get(name) == self.module.mutations:
            return self.record_skip(name, iteration)
        check = self.pipeline.check_changed
        paranoid = check and self.pipeline.paranoid
        if self.pipeline.paranoid:  # what passes remember of the module trusts the IR's edit stamps: not here
            forget_fixed_points(self.module)
            forget_module_facts(self.module)
        before = self.fingerprint() if paranoid else ""
        edits_before = self.module.mutations
        n_before = self.instruction_count()
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            outcome = _run_with_result(p, self.module)
        except PassFailure:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the pass history
            raise PassFailure(name, list(self.history), f"{type(e).__name__}: {e}") from e
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - start_cpu
        changed = outcome.changed
        if not isinstance(changed, bool):
            raise PassFailure(name, list(self.history), f"run() returned {changed!r}, not a bool")
        if paranoid:
            really = self.fingerprint() != before
            if really != changed:
                what = "changed the module but returned False" if really else "returned True but changed nothing"
                raise PassFailure(name, list(self.history), what)
        elif check and not changed and self.module.mutations != edits_before:
            raise PassFailure(name, list(self.history), "changed the module but returned False")
        self.history.append(name)
        if skippable and not changed and self.module.mutations == edits_before:
            self._unchanged_at[name] = edits_before
        verified = "off"
        if self.pipeline.verify_each:
            if not changed:
                verified = "not verified (unchanged)"
            elif self.group is not None and self.defers_verification():
                verified = "at the end of the fix group"
            else:
                verified = self.verify(name, self.history[:-1])
        self.result.records.append(
            PassRecord(name, changed, seconds, n_before, self.instruction_count(), iteration,
                       self.group if iteration is not None else None, list(outcome.explanations), verified,
                       cpu_seconds)
        )
        self.result.changed |= changed
        if self.pipeline.dump_dir is not None:
            self.dump(name)
        return changed

    def dump(self, label: str) -> None:
        """Write the module as it is now into the dump folder, numbered in order."""
        safe = re.sub(r"[^\w.\-]+", "_", label)[:80]
        path = Path(self.pipeline.dump_dir) / f"{self.module.name}.{self.dump_index:04d}.{safe}.txt"
        path.write_text(self.module.to_text())
        self.dump_index += 1


def _run_with_result(p: Pass, module: Module) -> PassResult:
    """`p.run_with_result(module)`; a pass object that only has `run` (not derived from `Pass`) is wrapped."""
    run_with_result = getattr(p, "run_with_result", None)
    if run_with_result is None:
        return PassResult(p.run(module))
    return run_with_result(module)


# ----------------------------------------------------------------------------- spec parsing

_TOKEN_RE = re.compile(r"\s*(fix\(|[A-Za-z_][\w\-.]*|\{[^{}]*\}|\(|\)|,)")


def parse_pipeline(spec: str) -> list[Pass | Fix]:
    """Parse a pipeline spec into pass instances and Fix groups (named pipelines expanded)."""
    return _SpecParser(spec).parse()


class _SpecParser:
    def __init__(self, spec: str, depth: int = 0, skip_missing: bool = False):
        self.spec = spec
        self.pos = 0
        self.option_pos: dict[str, int] = {}  # where each option of the element being read starts
        self.depth = depth
        self.skip_missing = skip_missing  # named pipelines skip built-ins that are not installed

    def error(self, message: str, pos: int | None = None) -> PipelineError:
        """The spec, with a caret at `pos` (default: where parsing is)."""
        pos = self.pos if pos is None else pos
        return PipelineError(f"{message} at column {pos + 1} of pipeline spec:\n  {self.spec}\n  "
                             + " " * pos + "^")

    def token(self) -> str | None:
        m = _TOKEN_RE.match(self.spec, self.pos)
        if m is None:
            if self.spec[self.pos :].strip():
                raise self.error("unexpected text", self.next_pos())
            return None
        return m.group(1)

    def next_pos(self) -> int:
        """Where the next token starts (after blanks)."""
        return len(self.spec) - len(self.spec[self.pos :].lstrip())

    def take(self) -> str:
        m = _TOKEN_RE.match(self.spec, self.pos)
        self.pos = m.end()
        return m.group(1)

    def parse(self) -> list[Pass | Fix]:
        items = self.parse_list(closing=None)
        if self.token() is not None:
            raise self.error("unexpected ')'", self.next_pos())
        if not items:
            raise self.error("empty pipeline")
        return items

    def parse_list(self, closing: str | None) -> list[Pass | Fix]:
        """Elements separated by single commas, up to `closing` (or the end): an empty element (`a,,b`, a
        leading or trailing comma) is refused."""
        items: list[Pass | Fix] = []
        after_comma = False
        while True:
            tok = self.token()
            if tok is None or tok == closing:
                if after_comma:
                    raise self.error("a pass is missing after ','", self.next_pos())
                return items
            if tok == ",":
                raise self.error("a pass is missing before ','", self.next_pos())
            items.extend(self.parse_element())
            tok = self.token()
            after_comma = tok == ","
            if after_comma:
                self.take()
            elif tok is not None and tok != closing:
                what = f"expected a pass name, got {tok!r}" if tok == ")" else "expected ',' between passes"
                raise self.error(what, self.next_pos())

    def parse_element(self) -> list[Pass | Fix]:
        start = self.next_pos()
        tok = self.take()
        if tok == "fix(":
            inner = self.parse_list(closing=")")
            if self.token() != ")":
                raise self.error("expected ')' to close fix(")
            self.take()
            options = self.parse_options() if (self.token() or "").startswith("{") else {}
            limit = self.fix_limit(options.pop("max_iterations", "25"))
            if options:
                raise self.error(f"fix takes only max_iterations, not {sorted(options)}",
                                 self.option_pos.get(sorted(options)[0], start))
            if not inner and self.skip_missing:
                return []
            return [Fix(inner, limit)]
        if not re.match(r"[A-Za-z_]", tok):
            raise self.error(f"expected a pass name, got {tok!r}", start)
        options = self.parse_options() if (self.token() or "").startswith("{") else {}
        if not options and (tok in NAMED_PIPELINES or (not has_pass(tok) and tok in NAMED_PIPELINES)):
            # (a name that is no pass may be a pipeline an installed plugin names when it loads)
            if self.depth > 8:
                raise self.error("named pipelines nest too deeply", start)
            return _SpecParser(NAMED_PIPELINES[tok], self.depth + 1, skip_missing=True).parse()
        if self.skip_missing and not has_pass(tok):
            return []
        try:
            return [create_pass(tok, **options)]
        except PassOptionError as e:
            raise self.error(str(e), self.option_pos.get(e.option, start) if e.option else start) from None

    def fix_limit(self, text: str) -> int:
        """fix's max_iterations, a positive integer."""
        try:
            limit = int(text)
        except ValueError:
            limit = 0
        if limit < 1:
            raise self.error(f"fix: max_iterations={text!r} is not a positive integer",
                             self.option_pos.get("max_iterations", self.pos))
        return limit

    def parse_options(self) -> dict[str, str]:
        """`{key=value,...}`; where each key starts is kept in `option_pos` for error carets."""
        body_start = self.next_pos() + 1
        body = self.take()[1:-1]
        options: dict[str, str] = {}
        self.option_pos: dict[str, int] = {}
        offset = body_start
        for item in body.split(","):
            at = offset + len(item) - len(item.lstrip())
            offset += len(item) + 1
            if not item.strip():
                continue
            key, eq, value = item.partition("=")
            if not eq:
                raise self.error(f"option {item.strip()!r} needs a value (key=value)", at)
            options[key.strip()] = value.strip()
            self.option_pos[key.strip()] = at
        return options


def run_pipeline(module: Module, spec: str | Iterable[Pass | Fix], **kwargs: object) -> PipelineResult:
    """Parse (if needed) and run a pipeline on `module`."""
    passes = parse_pipeline(spec) if isinstance(spec, str) else list(spec)
    return Pipeline(passes, **kwargs).run(module)
