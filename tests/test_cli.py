"""The hlopt command line, end to end (in-process through cli.main.main)."""

from __future__ import annotations

import io
import json
import sys

import pytest
from hlopt.cli.main import main
from hlopt.corpus.programs import corpus_texts

from hlopt import hlo

MODULE = """HloModule cli_test

ENTRY %main (p: f32[8], q: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %q = f32[8]{0} parameter(1)
  %zero = f32[] constant(0)
  %z = f32[8]{0} broadcast(%zero), dimensions={}
  %a = f32[8]{0} add(%p, %z)
  %dead = f32[8]{0} exponential(%q)
  ROOT %m = f32[8]{0} multiply(%a, %q)
}
"""


@pytest.fixture()
def module_file(tmp_path):
    path = tmp_path / "m.hlo"
    path.write_text(MODULE)
    return path


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def test_opt_runs_pipeline_with_timing_and_dumps(capsys, module_file, tmp_path):
    out_file = tmp_path / "out.hlo"
    dumps = tmp_path / "dumps"
    code, _, err = _run(capsys, "opt", module_file, "-p", "fix(algebraic-simplifier,dce)", "-o", out_file,
                        "--timing=passes", "--dump-dir", dumps)
    assert code == 0
    text = out_file.read_text()
    assert "exponential" not in text and "broadcast" not in text
    assert "algebraic-simplifier" in err and "total" in err
    assert "executed instructions 7 -> 3, kernels 4 -> 1" in err
    assert len(list(dumps.iterdir())) >= 3


def test_opt_explain_prints_every_fusion_decision_of_the_run(capsys, module_file, tmp_path):
    code, _, err = _run(capsys, "opt", module_file, "-p", "priority-fusion,multi-output-fusion", "--explain",
                        "-o", tmp_path / "out.hlo")
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert any(line.startswith("[priority-fusion]") and "fused %" in line for line in lines)
    assert any(line.startswith("[priority-fusion]") and "refused %" in line for line in lines)


def test_opt_reads_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(MODULE))
    code, out, _ = _run(capsys, "opt", "-")
    assert code == 0 and hlo.parse(out).instruction_count() == 7


def test_opt_dump_directory_keeps_file_names(capsys, tmp_path):
    src = tmp_path / "dump"
    src.mkdir()
    (src / "module_0001.jit_a.before_optimizations.txt").write_text(MODULE)
    (src / "module_0002.jit_b.after_optimizations.txt").write_text(MODULE.replace("cli_test", "other"))
    (src / "notes.txt").write_text("not hlo")
    out = tmp_path / "out"
    code, _, _ = _run(capsys, "opt", src, "-p", "dce", "-o", out)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["module_0001.jit_a.before_optimizations.txt",
                                                     "module_0002.jit_b.after_optimizations.txt"]


def test_opt_errors_are_clear(capsys, module_file, tmp_path):
    with pytest.raises(SystemExit, match="unknown pass 'nope'"):
        main(["opt", str(module_file), "-p", "nope"])
    bad = tmp_path / "bad.hlo"
    bad.write_text(MODULE.replace("multiply(%a, %q)", "multiply(%a, %r)"))
    with pytest.raises(SystemExit, match=r"bad.hlo:10:\d+: error: operand %r is not defined"):
        main(["opt", str(bad)])


def test_opt_load_user_pass(capsys, tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "custom_pass.py"
    mod = tmp_path / "two.hlo"
    mod.write_text(MODULE.replace("constant(0)", "constant(2)").replace("add(%p, %z)", "multiply(%p, %z)"))
    code, out, _ = _run(capsys, "opt", mod, "--load", example, "-p", "mul-by-two-to-add,dce")
    assert code == 0 and "add(%p, %p)" in out


def test_check_compares_before_and_after(capsys, module_file):
    code, out, _ = _run(capsys, "check", module_file, "-p", "fix(algebraic-simplifier,dce)", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] and report["modules"][0]["outputs"] == 1


def test_check_fails_on_a_wrong_pass(capsys, tmp_path):
    plugin = tmp_path / "wrong.py"
    plugin.write_text("""
from dataclasses import dataclass
from typing import ClassVar
from hlopt.passes import ModulePass, register

@register
@dataclass(frozen=True)
class Wrong(ModulePass):
    name: ClassVar[str] = "make-it-wrong"
    def run(self, module):
        for inst in module.entry.instructions:
            if inst.opcode == "multiply":
                inst.opcode = "add"
                return True
        return False
""")
    mod = tmp_path / "m.hlo"
    mod.write_text(MODULE)
    code, out, _ = _run(capsys, "check", mod, "--load", plugin, "-p", "make-it-wrong")
    assert code == 1 and "MISMATCH" in out and "values differ" in out


def test_check_multi_device_module(capsys, tmp_path):
    entry = next(e for e in corpus_texts() if e.id == "shmap_psum_in_scan")
    path = tmp_path / "sm.hlo"
    path.write_text(entry.text)
    code, out, _ = _run(capsys, "check", path, "-p", "call-inliner,fix(algebraic-simplifier,dce)",
                        "--devices", "8")
    assert code == 0 and out.startswith("OK")


def test_check_moves_gradient_all_reduce_out_of_loop(capsys, tmp_path):
    entry = next(e for e in corpus_texts() if e.id == "shmap_grad_accumulation" and not e.optimized)
    path, out_path = tmp_path / "ga.hlo", tmp_path / "ga.opt.hlo"
    path.write_text(entry.text)
    spec = "call-inliner,simplify,while-loop-all-reduce-code-motion"
    code, out, _ = _run(capsys, "check", path, "-p", spec, "--devices", "8")
    assert code == 0 and out.startswith("OK")
    code, _, _ = _run(capsys, "opt", path, "-p", spec, "-o", out_path)
    assert code == 0
    optimized = hlo.parse(out_path.read_text())
    bodies = {i.attrs["body"] for i in optimized.instructions() if i.opcode == "while"}
    assert bodies and not any(i.opcode == "all-reduce" for b in bodies for i in b.instructions)
    assert any(i.opcode == "all-reduce" for i in optimized.instructions())  # after the loop


def test_stats_json(capsys, module_file):
    code, out, _ = _run(capsys, "stats", module_file, "--json")
    stats = json.loads(out)
    assert code == 0 and stats["instructions"] == 7 and stats["opcodes"]["parameter"] == 2
    assert stats["parameter_bytes"] == 64 and stats["output_bytes"] == 32


def test_passes_lists_builtins(capsys):
    code, out, _ = _run(capsys, "passes", "--json")
    names = {p["name"] for p in json.loads(out)["passes"]}
    assert {"call-inliner", "dce", "cse", "tuple-simplifier", "algebraic-simplifier",
            "latency-hiding-scheduler", "async-collective-creator"} <= names


def test_schedule_json_and_outputs(capsys, tmp_path, shared_dir):
    case = shared_dir / "xla_cases" / "latency_hiding_scheduler" / "AllGatherAsyncBalance.hlo"
    trace, plot, out = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "s.hlo"
    code, stdout, _ = _run(capsys, "schedule", case, "--estimator", "approximate", "--json", "--trace", trace,
                           "--plot", plot, "-o", out)
    assert code == 0
    summary = json.loads(stdout)
    for key in ("heuristic", "makespan_us", "lower_bound_us", "exposed_comm_us", "overlap_fraction",
                "peak_memory_bytes", "schedule_seconds", "computations"):
        assert key in summary
    assert json.loads(trace.read_text())["traceEvents"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert hlo.parse(out.read_text()).is_scheduled


def test_bench_schedule_csv_and_plot(capsys, tmp_path):
    csv_path, plot = tmp_path / "b.csv", tmp_path / "b.png"
    code, out, _ = _run(capsys, "bench-schedule", "synthetic:fsdp:4:0.5", "synthetic:data-parallel:4",
                        "--heuristics", "original-order,xla-default", "--estimator", "approximate",
                        "--csv", csv_path, "--plot", plot, "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 4
    assert csv_path.read_text().count("\n") == 5
    assert plot.exists()


def test_tables_keep_their_width_when_piped(capsys):
    """rich squeezes a table into 80 columns when stdout is not a terminal; ours are printed 200 wide."""
    code, out, _ = _run(capsys, "bench-schedule", "synthetic:fsdp:4:0.5", "--heuristics", "original-order,xla-default",
                        "--estimator", "approximate")
    assert code == 0
    widest = max(len(line) for line in out.splitlines())
    assert 80 < widest <= 200
    assert all("…" not in line for line in out.splitlines())


ROLLUP = """HloModule rollup

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (x: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[1024,1024]{1,0} parameter(0)
  %ar = f32[1024,1024]{1,0} all-reduce(%x), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %d = f32[1024,1024]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = f32[1024,1024]{1,0} add(%ar, %d)
}

ENTRY %main (p: f32[1024,1024]) -> f32[1024,1024] {
  %p = f32[1024,1024]{1,0} parameter(0)
  %c = f32[1024,1024]{1,0} call(%p), to_apply=%body, frontend_attributes={inlineable="false"}
  ROOT %n = f32[1024,1024]{1,0} negate(%c)
}
"""


def test_schedule_rolls_a_non_inlinable_call_up_into_its_caller(capsys, tmp_path):
    """The entry's figures include its callee's scheduled time and exposed communication (a shard_map body
    is such a call): not 'overlap 100%, exposed 0' while the body has exposed communication."""
    path, plot = tmp_path / "r.hlo", tmp_path / "body.png"
    path.write_text(ROLLUP)
    code, out, _ = _run(capsys, "schedule", path, "--estimator", "approximate", "--json", "--plot", plot,
                        "--computation", "body")
    assert code == 0
    summary = json.loads(out)
    body, main_ = summary["computations"]["body"], summary["computations"]["main"]
    assert body["exposed_comm_us"] > 0
    assert main_["exposed_comm_us"] == pytest.approx(body["exposed_comm_us"])
    assert summary["exposed_comm_us"] == pytest.approx(body["exposed_comm_us"]) and summary["overlap_fraction"] < 1
    assert main_["makespan_us"] == pytest.approx(body["makespan_us"] + 2.0)  # parameter, body, negate
    assert summary["executed_computations"] == ["main", "body"]  # the reducer is not executed by control flow
    assert plot.read_bytes()[:4] == b"\x89PNG"
    code, out, _ = _run(capsys, "schedule", path, "--estimator", "approximate")
    assert code == 0 and "│ add " not in out and "1 trivial computation(s)" in out
    with pytest.raises(SystemExit, match="--computation 'nope'.*scheduled: add, body, main"):
        main(["schedule", str(path), "--plot", str(plot), "--computation", "nope"])


def test_schedule_takes_a_dump_directory(capsys, tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "a.txt").write_text(ROLLUP)
    (dump / "b.txt").write_text(MODULE)
    code, out, _ = _run(capsys, "schedule", dump, "--estimator", "approximate", "--json", "-o", tmp_path / "out")
    assert code == 0 and [r["file"] for r in json.loads(out)] == [str(dump / "a.txt"), str(dump / "b.txt")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt", "b.txt"]


CHAIN = """HloModule chain

ENTRY %main (p: f32[8], q: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %q = f32[8]{0} parameter(1)
  %a = f32[8]{0} add(%p, %q)
  %b = f32[8]{0} multiply(%a, %q)
  %c = f32[8]{0} exponential(%b)
  ROOT %n = f32[8]{0} negate(%c)
}
"""


def test_stats_counts_executed_instructions_and_kernels_not_fused_computations(capsys, tmp_path):
    """After fusion, `instructions` (every computation) goes up; executed instructions and kernels go down."""
    before, after = tmp_path / "before.hlo", tmp_path / "after.hlo"
    before.write_text(CHAIN)
    assert _run(capsys, "opt", before, "-p", "priority-fusion", "-o", after)[0] == 0
    stats = {}
    for path in (before, after):
        code, out, _ = _run(capsys, "stats", path, "--json")
        assert code == 0
        stats[path.name] = json.loads(out)
    b, a = stats["before.hlo"], stats["after.hlo"]
    assert any(op == "fusion" for op in a["opcodes"])
    assert a["instructions"] > b["instructions"]  # the fused computation is counted here
    assert (b["executed_instructions"], b["kernels"]) == (6, 4)
    assert (a["executed_instructions"], a["kernels"]) == (3, 1)


def test_readme_config_example_runs(capsys, tmp_path, module_file):
    """The README's --config example is a valid pipeline file."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "pipeline.yaml"
    config.write_text(example)
    code, out, _ = _run(capsys, "opt", module_file, "--config", config)
    assert code == 0 and "exponential" not in out and hlo.parse(out).is_scheduled
    assert "docs/API.md" in readme


def test_demo_headline_says_which_comparison_without_the_gpu_compiler(monkeypatch):
    import hlopt.runtime.xla_gpu_path.xla_gpu as xla_gpu
    from hlopt.cli.demo import xla_gpu_headline

    monkeypatch.setattr(xla_gpu, "available", lambda: False)
    line = xla_gpu_headline(None, "h100", 8)
    assert "not installed" in line and "unfused" in line and "not XLA:GPU's" in line


@pytest.mark.xla_gpu
def test_demo_headline_compares_with_xla_gpu():
    from hlopt.cli.demo import xla_gpu_headline
    from hlopt.runtime.xla_gpu_path.xla_gpu import available

    if not available():
        pytest.skip("the XLA:GPU compiler is not installed")
    line = xla_gpu_headline(hlo.parse(MODULE), "h100", 1)
    assert "XLA:GPU alone vs hlopt + XLA:GPU" in line and "x" in line.rsplit(",", 1)[-1]


def test_console_main_runs_main_then_freezes_the_collector(module_file, tmp_path, monkeypatch):
    """The console script skips the interpreter's final collection of what the run built: `gc.freeze` once
    main has returned (or raised SystemExit), so that the process's exit does not walk that object graph."""
    import gc

    from hlopt.cli import main as cli_main

    calls: list[str] = []
    out = tmp_path / "out.hlo"
    real_main = cli_main.main

    def fake_main() -> int:
        calls.append("main")
        return real_main(["opt", str(module_file), "-p", "dce", "-o", str(out)])

    monkeypatch.setattr(cli_main, "main", fake_main)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    assert cli_main.console_main() == 0
    assert calls[0] == "main" and calls[-1] == "freeze" and "exponential" not in out.read_text()

    def failing_main() -> int:
        calls.append("failing main")
        raise SystemExit("hlopt: some user error")

    monkeypatch.setattr(cli_main, "main", failing_main)
    with pytest.raises(SystemExit):
        cli_main.console_main()
    assert calls[-2:] == ["failing main", "freeze"]


def test_a_verbs_parser_alone_has_the_same_help_and_options(capsys):
    """`main` builds the parser of the verb it runs alone (the others' help imports the scheduler and the
    runtime): each verb's help is the one the full parser gives, and an unknown verb lists them all."""
    from hlopt.cli.main import _verb_adders, build_parser

    for verb in _verb_adders():
        texts = []
        for parser in (build_parser(), build_parser(verb)):
            with pytest.raises(SystemExit):
                parser.parse_args([verb, "--help"])
            texts.append(capsys.readouterr().out)
        assert texts[0] == texts[1] and verb in texts[0], verb
    with pytest.raises(SystemExit):
        build_parser("no-such-verb").parse_args(["no-such-verb"])
    assert "compile" in capsys.readouterr().err
