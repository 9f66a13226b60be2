"""Pipeline framework: spec parsing, fixed points, honesty checks, failures, dumps, configs, plugins."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import pytest
from hlopt.passes import ModulePass, register
from hlopt.passes.framework.config import ConfigError, load_pipeline_config
from hlopt.passes.framework.pipeline import Fix, PassFailure, Pipeline, PipelineError, parse_pipeline
from hlopt.passes.framework.registry import PassOptionError, create_pass, load_plugin_file, registered_passes

from hlopt import hlo

MODULE = """
HloModule m

ENTRY main {
  p = f32[4] parameter(0)
  n1 = f32[4] negate(p)
  n2 = f32[4] negate(n1)
  ROOT r = f32[4] add(n2, p)
}
"""


@register
@dataclass(frozen=True)
class _RemoveDoubleNegate(ModulePass):
    """negate(negate(x)) -> x, one at a time."""

    name: ClassVar[str] = "test-remove-double-negate"

    def run(self, module: hlo.Module) -> bool:
        for comp in module.computations:
            for inst in comp.instructions:
                if inst.opcode == "negate" and inst.operand(0).opcode == "negate":
                    comp.replace_instruction(inst, inst.operand(0).operand(0))
                    return True
        return False


@register
@dataclass(frozen=True)
class _Liar(ModulePass):
    """Changes the module but says it did not."""

    name: ClassVar[str] = "test-liar"
    claim: bool = False

    def run(self, module: hlo.Module) -> bool:
        if not self.claim:
            module.entry.root.metadata = hlo.Metadata(op_name="touched")
        return self.claim


@register
@dataclass(frozen=True)
class _Toggler(ModulePass):
    """Flips a metadata field forever: never reaches a fixed point."""

    name: ClassVar[str] = "test-toggler"

    def run(self, module: hlo.Module) -> bool:
        root = module.entry.root
        flag = (root.metadata or {}).get("op_name") == "a"
        root.metadata = hlo.Metadata(op_name="b" if flag else "a")
        return True


@register
@dataclass(frozen=True)
class _Breaker(ModulePass):
    """Raises."""

    name: ClassVar[str] = "test-breaker"
    threshold: int = 3

    def run(self, module: hlo.Module) -> bool:
        raise RuntimeError(f"boom {self.threshold}")


def test_spec_parses_options_and_fix():
    items = parse_pipeline("test-breaker{threshold=8},fix(test-remove-double-negate,test-liar{claim=true})")
    assert items[0].threshold == 8
    assert isinstance(items[1], Fix) and len(items[1].passes) == 2
    assert items[1].passes[1].claim is True


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-pass", "unknown pass"),
        ("test-breaker{nope=1}", "has no option 'nope'"),
        ("test-breaker{threshold=x}", "not a valid int"),
        ("fix(test-breaker", "expected ')'"),
        ("", "empty pipeline"),
        ("test-breaker)", "expected a pass name, got ')' at column 13"),
    ],
)
def test_spec_errors_are_clear(spec, message):
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_pipeline(spec)


def test_fix_reaches_fixed_point_and_records_timing():
    module = hlo.parse(MODULE)
    result = Pipeline.parse("fix(test-remove-double-negate)").run(module)
    assert result.changed
    assert [i.opcode for i in module.entry.instructions] == ["parameter", "add"]
    assert "test-remove-double-negate" in result.timing_table()
    assert "cpu ms" in result.timing_table().splitlines()[0]
    assert all(r.cpu_seconds >= 0 for r in result.records)
    assert result.records[-1].changed is False


def test_dishonest_changed_is_reported():
    with pytest.raises(PassFailure, match="changed the module but returned False"):
        Pipeline.parse("test-liar").run(hlo.parse(MODULE))
    with pytest.raises(PassFailure, match="changed the module but returned False"):
        Pipeline.parse("test-liar", paranoid=True).run(hlo.parse(MODULE))
    with pytest.raises(PassFailure, match="returned True but changed nothing"):
        Pipeline.parse("test-liar{claim=true}", paranoid=True).run(hlo.parse(MODULE))


def test_default_changed_check_counts_edits_without_printing(monkeypatch):
    """By default the honest-`changed` check reads the module's edit counter: no print, no hash."""
    module = hlo.parse(MODULE)

    def no_print(self):
        raise AssertionError("the default check printed the module")

    monkeypatch.setattr(hlo.Module, "to_text", no_print)
    with pytest.raises(PassFailure, match="changed the module but returned False"):
        Pipeline.parse("test-liar", verify_each=False).run(module)
    result = Pipeline.parse("test-remove-double-negate", verify_each=False).run(hlo.parse(MODULE))
    assert result.changed


def test_every_ir_edit_moves_the_mutation_counter():
    module = hlo.parse(MODULE)
    entry = module.entry
    marks = [module.mutations]
    root = entry.root
    neg = entry.add(hlo.Instruction("negate", root.shape, [root]))
    marks.append(module.mutations)
    neg.set_operand(0, entry.parameters[0])
    marks.append(module.mutations)
    entry.move(neg, before=root)
    marks.append(module.mutations)
    neg.add_control_successor(root)
    marks.append(module.mutations)
    neg.remove_control_successor(root)
    marks.append(module.mutations)
    entry.remove(neg)
    marks.append(module.mutations)
    assert all(a < b for a, b in zip(marks, marks[1:], strict=False))


def test_fix_cycle_is_detected():
    with pytest.raises(PassFailure, match="cycle"):
        Pipeline.parse("fix(test-toggler)").run(hlo.parse(MODULE))


def test_failure_names_previous_passes():
    with pytest.raises(PassFailure) as info:
        Pipeline.parse("fix(test-remove-double-negate),test-breaker{threshold=5}").run(hlo.parse(MODULE))
    text = str(info.value)
    assert "test-breaker{threshold=5}" in text and "boom 5" in text
    assert "passes that ran before it: test-remove-double-negate" in text


def test_dump_dir_writes_module_after_each_pass(tmp_path):
    Pipeline.parse("fix(test-remove-double-negate)", dump_dir=tmp_path).run(hlo.parse(MODULE))
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps[0].startswith("m.0000.input")
    assert len(dumps) == 3  # input + changed + unchanged iteration
    assert hlo.parse((tmp_path / dumps[-1]).read_text()).instruction_count() == 2


def test_config_files_json_and_yaml(tmp_path):
    cfg = {"pipeline": [{"fix": ["test-remove-double-negate"], "max_iterations": 4},
                        {"name": "test-breaker", "options": {"threshold": 9}}], "verify_each": False}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(cfg))
    pipeline = load_pipeline_config(path)
    assert pipeline.passes[0].max_iterations == 4 and pipeline.passes[1].threshold == 9
    assert pipeline.verify_each is False
    yml = tmp_path / "p.yaml"
    yml.write_text("pipeline:\n  - test-remove-double-negate\n  - name: test-breaker\n    options: {bogus: 1}\n")
    with pytest.raises(ConfigError, match="has no option 'bogus'"):
        load_pipeline_config(yml)
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: []\nextra: 1\n")
    with pytest.raises(ConfigError, match="invalid pipeline configuration"):
        load_pipeline_config(bad)


def test_plugin_file_registers_user_pass(tmp_path):
    plugin = tmp_path / "my_pass.py"
    plugin.write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from typing import ClassVar
        from hlopt.passes import ModulePass, register

        @register
        @dataclass(frozen=True)
        class CountAdds(ModulePass):
            """Counts adds; changes nothing."""
            name: ClassVar[str] = "count-adds-plugin"
            threshold: int = 1

            def run(self, module):
                return False
    '''))
    loaded = load_plugin_file(plugin)
    assert [c.name for c in loaded] == ["count-adds-plugin"]
    assert "count-adds-plugin" in registered_passes()
    assert create_pass("count-adds-plugin", threshold="4").threshold == 4
    with pytest.raises(PassOptionError):
        create_pass("count-adds-plugin", nope="1")


def test_describe_round_trips_through_spec():
    p = create_pass("test-breaker", threshold="12")
    assert p.describe() == "test-breaker{threshold=12}"
    assert parse_pipeline(p.describe())[0] == p


def test_a_caller_that_verified_the_input_saves_the_pipelines_input_check(monkeypatch):
    import hlopt.passes.framework.pipeline as pipeline_module

    calls: list[bool] = []  # whether each verification started from a checkpoint (incremental)
    real = pipeline_module.verify_changes
    monkeypatch.setattr(pipeline_module, "verify_changes",
                        lambda m, cp=None: (calls.append(cp is not None), real(m, cp))[1])
    Pipeline.parse("fix(algebraic-simplifier,dce)", verify_in_fix="every-pass").run(hlo.parse(MODULE))
    checked = len(calls)
    assert calls[0] is False and all(calls[1:])  # the input in full, then what each pass changed
    calls.clear()
    result = Pipeline.parse("fix(algebraic-simplifier,dce)", verify_in_fix="every-pass").run(
        hlo.parse(MODULE), input_verified=True)
    assert result.changed and len(calls) == checked - 1  # the passes that changed it are still verified
    assert all(calls)  # ... from a checkpoint of the input the caller verified
    assert [r.verified.split(":")[0] for r in result.records if r.changed] == ["incremental"] * len(calls)
    counts = [(r.instructions_before, r.instructions_after) for r in result.records]
    assert all(a == b for (_, a), (b, _) in zip(counts, counts[1:], strict=False))  # counts chain pass to pass


DOUBLE_NEGATES = """
HloModule m

ENTRY main {
  p = f32[4] parameter(0)
  n1 = f32[4] negate(p)
  n2 = f32[4] negate(n1)
  n3 = f32[4] negate(n2)
  n4 = f32[4] negate(n3)
  ROOT r = f32[4] add(n4, p)
}
"""


@register
@dataclass(frozen=True)
class _BreakShape(ModulePass):
    """Gives the root a wrong shape: the module no longer verifies."""

    name: ClassVar[str] = "test-break-shape"

    def run(self, module: hlo.Module) -> bool:
        root = module.entry.root
        if root.opcode != "add":
            return False
        module.entry.set_root(module.entry.add(hlo.Instruction("reshape", hlo.parse_shape("f32[3]"), [root])))
        return True


def _verify_calls(monkeypatch) -> list[int]:
    """Count the pipeline's verifications (incremental or not)."""
    import hlopt.passes.framework.pipeline as pipeline_module

    calls: list[int] = []
    real = pipeline_module.verify_changes
    monkeypatch.setattr(pipeline_module, "verify_changes", lambda m, cp=None: (calls.append(1), real(m, cp))[1])
    return calls


def test_a_fix_group_is_verified_once_at_its_end_by_default(monkeypatch):
    calls = _verify_calls(monkeypatch)
    result = Pipeline.parse("fix(test-remove-double-negate)").run(hlo.parse(DOUBLE_NEGATES), input_verified=True)
    changing = [r for r in result.records if r.changed]
    assert len(changing) == 2 and len(calls) == 1  # two changing passes, one verification (the group's end)
    assert all(r.verified == "at the end of the fix group" for r in changing)
    assert "group end: incremental" in result.records[-1].verified
    calls.clear()
    result = Pipeline.parse("fix(test-remove-double-negate)", verify_in_fix="every-pass").run(
        hlo.parse(DOUBLE_NEGATES), input_verified=True)
    assert len(calls) == 2 and all(r.verified.startswith("incremental") for r in result.records if r.changed)
    calls.clear()
    Pipeline.parse("test-remove-double-negate,test-remove-double-negate").run(
        hlo.parse(DOUBLE_NEGATES), input_verified=True)
    assert len(calls) == 2  # outside a group: after every pass that changed the module


def test_a_group_that_breaks_the_module_fails_at_its_end_naming_the_group():
    with pytest.raises(PassFailure) as info:
        Pipeline.parse("fix(test-remove-double-negate,test-break-shape)").run(hlo.parse(DOUBLE_NEGATES))
    assert info.value.pass_name == "fix(test-remove-double-negate,test-break-shape)"
    assert "at the end of the group" in str(info.value) and "--verify-each=every-pass" in str(info.value)
    with pytest.raises(PassFailure) as info:
        Pipeline.parse("fix(test-remove-double-negate,test-break-shape)", verify_in_fix="every-pass").run(
            hlo.parse(DOUBLE_NEGATES))
    assert info.value.pass_name == "test-break-shape"
    with pytest.raises(ValueError, match="verify_in_fix"):
        Pipeline.parse("dce", verify_in_fix="sometimes")


def test_a_builtin_pass_is_not_rerun_on_a_module_no_edit_touched():
    module = hlo.parse(MODULE)
    result = Pipeline.parse("simplify,tuple-simplifier,simplify").run(module)
    labels = [(r.name, r.skipped) for r in result.records]
    first = labels.index(("dce", False)) + 1  # the first group's first iteration changed the module
    assert not any(skipped for _, skipped in labels[:first])
    # the group's second iteration changed nothing; the next runs find the same module: all skipped
    second_group = [r for r in result.records if r.group == 2]
    assert second_group and all(r.skipped and not r.changed and r.seconds == 0 for r in second_group)
    assert result.records[-len(second_group) - 1].skipped  # tuple-simplifier too
    assert "(skipped)" in result.timing_table()
    assert module.to_text() == _fully_simplified()


def _fully_simplified() -> str:
    module = hlo.parse(MODULE)
    Pipeline.parse("simplify").run(module)
    return module.to_text()


def test_plugin_passes_and_paranoid_runs_are_never_skipped():
    module = hlo.parse(MODULE)
    result = Pipeline.parse("test-remove-double-negate,test-remove-double-negate,"
                            "test-remove-double-negate").run(module)
    assert [r.skipped for r in result.records] == [False] * 3  # not a built-in: may read more than the module
    result = Pipeline.parse("dce,dce", paranoid=True).run(hlo.parse(MODULE))
    assert [r.skipped for r in result.records] == [False, False]
    result = Pipeline.parse("dce,dce").run(hlo.parse(MODULE))
    assert [r.skipped for r in result.records] == [False, True]


def test_cli_verify_each_every_pass_keeps_per_pass_verification_in_groups():
    from hlopt.cli.main import _build_pipeline, build_parser

    args = build_parser("opt").parse_args(["opt", "x.hlo", "-p", "simplify", "--verify-each=every-pass"])
    pipeline = _build_pipeline(args)
    assert pipeline.verify_each is True and pipeline.verify_in_fix == "every-pass"
    pipeline = _build_pipeline(build_parser("opt").parse_args(["opt", "--verify-each", "x.hlo", "-p", "simplify"]))
    assert pipeline.verify_each is True and pipeline.verify_in_fix == "end"
    pipeline = _build_pipeline(build_parser("opt").parse_args(["opt", "x.hlo", "-p", "dce", "--no-verify-each"]))
    assert pipeline.verify_each is False
