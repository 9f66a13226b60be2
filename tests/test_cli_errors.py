"""A sweep of the CLI's error cases: every user error exits non-zero with one clear line and no traceback;
dump directories keep the good modules' results (in-process through cli.main.main)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hlopt.cli.common import write_atomic
from hlopt.cli.main import main

from hlopt import hlo

GOOD = """HloModule good

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %zero = f32[] constant(0)
  %z = f32[8]{0} broadcast(%zero), dimensions={}
  %a = f32[8]{0} add(%p, %z)
  ROOT %e = f32[8]{0} exponential(%a)
}
"""
BAD = GOOD.replace("HloModule good", "HloModule bad").replace("exponential(%a)", "exponential(%q)")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `hlopt ARGV`, SystemExit messages written to stderr as Python would."""
    message = ""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        message = f"{e.code}\n" if isinstance(e.code, str) else ""
    out, err = capsys.readouterr()
    return code, out, err + message


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """Non-zero status, one line on stderr, no traceback; returns the line."""
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def files(tmp_path) -> dict[str, Path]:
    good = tmp_path / "good.hlo"
    good.write_text(GOOD)
    binary = tmp_path / "binary.hlo"
    binary.write_bytes(b"HloModule \x89PNG\r\n\x1a\n\x00\xff\xfe" * 20)
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "module_0001.a.txt").write_text(GOOD)
    (dump / "module_0002.b.txt").write_text(BAD)
    (dump / "module_0003.c.txt").write_text(GOOD.replace("HloModule good", "HloModule good_c"))
    return {"good": good, "binary": binary, "dump": dump, "tmp": tmp_path}


@pytest.mark.parametrize("verb", ["opt", "stats", "cost", "check", "schedule"])
def test_binary_file_is_one_line(capsys, files, verb):
    extra = ["-p", "dce"] if verb == "check" else []
    code, _, err = run_cli(capsys, verb, files["binary"], *extra)
    assert_one_line_error(code, err, "binary.hlo", "not HLO text")


@pytest.mark.parametrize("verb", ["opt", "stats", "cost", "schedule"])
def test_missing_file_is_one_line(capsys, tmp_path, verb):
    code, _, err = run_cli(capsys, verb, tmp_path / "nope.hlo")
    assert_one_line_error(code, err, "no such file", "nope.hlo")


@pytest.mark.parametrize("argv, needles", [
    (["schedule", "{good}", "--overlap-limit", "0"], ["--overlap-limit", "at least 1"]),
    (["schedule", "{good}", "--memory-limit", "-1"], ["--memory-limit", "at least 0"]),
    (["check", "{good}", "--devices", "0"], ["--devices", "at least 1"]),
    (["cost", "{good}", "--top", "x"], ["--top", "not an integer"]),
    (["bench-schedule", "synthetic:mixd:8"], ["unknown synthetic pattern 'mixd'", "did you mean mixed"]),
    (["bench-schedule", "synthetic:mixed:8:x"], ["RATIO 'x' is not a number"]),
    (["bench-schedule", "synthetic:fsdp:eight"], ["LAYERS 'eight'"]),
    (["bench-schedule", "synthetic:fsdp:2", "--target", "z900"], ["--target 'z900'"]),
    (["schedule", "synthetic:fsdp:2", "--heuristic", "nope"], ["'nope'", "xla-default", "+fill"]),
    (["schedule", "{good}", "--heuristic", "xla-default+fil"], ["+fil", "+keep"]),
    (["check", "{good}", "-p", "dce", "--inputs", "{tmp}/missing.npz"], ["--inputs", "no such file"]),
    (["check", "{good}", "-p", "dce", "--inputs", "{good}"], ["--inputs", "not an .npz archive"]),
    (["check", "{good}", "-p", "dce", "--inputs", "{tmp}/one.npy"], ["single .npy array"]),
    (["check", "{good}", "-p", "dce", "--inputs", "{tmp}/f64.npz"], ["float64", "f32[8]", "does not cast"]),
    (["check", "{good}", "-p", "dce", "--inputs", "{tmp}/two.npz"], ["2 array(s)", "1 entry parameter"]),
    (["opt", "{good}", "--load", "{tmp}/missing.py"], ["plugin file not found"]),
    (["opt", "{good}", "--config", "{tmp}/missing.yaml"], ["missing.yaml"]),
])
def test_user_errors_are_one_line(capsys, files, argv, needles):
    tmp = files["tmp"]
    np.save(tmp / "one.npy", np.ones(8, np.float32))
    np.savez(tmp / "f64.npz", a=np.ones(8))
    np.savez(tmp / "two.npz", a=np.ones(8, np.float32), b=np.ones(8, np.float32))
    argv = [a.format(good=files["good"], tmp=tmp) for a in argv]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, *needles)


def test_pass_options_out_of_range_are_refused(capsys, files):
    code, _, err = run_cli(capsys, "opt", files["good"], "-p", "latency-hiding-scheduler{overlap_limit=-3}")
    assert code != 0 and "Traceback" not in err
    assert "overlap_limit='-3' is not valid: Input should be greater than or equal to 1" in err.splitlines()[0]
    code, _, err = run_cli(capsys, "opt", files["good"], "-p", "latency-hiding-scheduler{memory_limit=lots}")
    assert code != 0 and "memory_limit" in err.splitlines()[0]


def test_named_pipelines_get_did_you_mean(capsys, files):
    code, _, err = run_cli(capsys, "opt", files["good"], "-p", "defualt")
    assert code != 0 and "did you mean default" in err.splitlines()[0]


def test_internal_error_names_module_and_where_to_report(capsys, files, monkeypatch):
    import hlopt.cli.main as cli_main

    def broken(module, name):
        raise KeyError("boom")

    monkeypatch.setattr(cli_main, "module_stats", broken)
    code, _, err = run_cli(capsys, "stats", files["good"])
    line = assert_one_line_error(code, err, "internal error", "good.hlo", "KeyError", "report")
    assert "HLOPT_TRACEBACK=1" in line


def test_a_failing_pass_names_pass_module_and_owner(capsys, files):
    plugin = files["tmp"] / "raiser.py"
    plugin.write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\nfrom hlopt.passes import ModulePass, register\n\n"
        "@register\n@dataclass(frozen=True)\nclass Raiser(ModulePass):\n    name: ClassVar[str] = 'raiser'\n"
        "    def run(self, module):\n        raise RuntimeError('kaputt')\n")
    code, _, err = run_cli(capsys, "opt", files["good"], "--load", plugin, "-p", "dce,raiser")
    assert_one_line_error(code, err, "pass 'raiser' failed on module", "good.hlo", "kaputt", "passes before it: dce",
                          "report it to the author of class Raiser in", "raiser.py")


def test_dump_directory_processes_every_module_and_lists_failures(capsys, files):
    out = files["tmp"] / "out"
    code, _, err = run_cli(capsys, "opt", files["dump"], "-p", "dce", "-o", out)
    assert code == 1 and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["module_0001.a.txt", "module_0003.c.txt"]
    assert "1 of 3 module(s) failed" in err and "module_0002.b.txt" in err and "%q is not defined" in err


def test_fail_fast_stops_at_the_first_failure(capsys, files):
    out = files["tmp"] / "out"
    code, _, err = run_cli(capsys, "opt", files["dump"], "-p", "dce", "-o", out, "--fail-fast")
    assert code == 1 and "Traceback" not in err and "module_0002.b.txt" in err
    assert sorted(p.name for p in out.iterdir()) == ["module_0001.a.txt"]


@pytest.mark.parametrize("argv", [["stats"], ["cost"], ["check", "-p", "dce"],
                                  ["schedule", "--estimator", "approximate"]])
def test_json_has_one_entry_per_module_with_result_or_error(capsys, files, argv):
    verb, *rest = argv
    code, out, err = run_cli(capsys, verb, files["dump"], *rest, "--json")
    assert code == 1 and "Traceback" not in err
    doc = json.loads(out)
    entries = doc["modules"] if verb == "check" else doc
    assert len(entries) == 3
    errors = [e for e in entries if "error" in e]
    assert len(errors) == 1 and "%q is not defined" in errors[0]["error"]
    good = [e for e in entries if "error" not in e]
    assert len(good) == 2


def test_output_is_written_atomically(tmp_path, monkeypatch):
    """The target is replaced by a rename only: a write that fails keeps the old file and leaves no temporary."""
    import hlopt.cli.common as common

    target = tmp_path / "out.hlo"
    target.write_text("old")

    def failing_replace(src, dst):
        assert Path(src).read_text() == "new"  # the whole text was written, next to the target
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(common.os, "replace", failing_replace)
    with pytest.raises(SystemExit, match="cannot write .*out.hlo: No space left on device"):
        write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.hlo"]
    monkeypatch.undo()
    write_atomic(target, "new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out.hlo"]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("hlopt ")


def test_check_without_pipeline_says_it_runs_default(capsys, files):
    code, out, err = run_cli(capsys, "check", files["good"])
    assert code == 0 and "checking the `default` pipeline" in err
    assert out.startswith("OK") and "max abs error" in out and out.count("pipeline: default") == 1


def test_opt_timing_without_pipeline_warns(capsys, files):
    code, _, err = run_cli(capsys, "opt", files["good"], "--timing")
    assert code == 0 and "no pipeline given" in err


def test_deprecated_device_flags_still_work_with_a_warning(capsys, files):
    code, out, err = run_cli(capsys, "cost", files["good"], "--device", "h100", "--num-devices", "4", "--json")
    assert code == 0 and json.loads(out)["device"]
    assert "--device is deprecated; use --target" in err and "--num-devices is deprecated" in err
    code, out, err = run_cli(capsys, "bench-schedule", "synthetic:fsdp:2", "--heuristics", "xla-default",
                             "--estimator", "approximate", "--devices", "h100", "--json")
    assert code == 0 and json.loads(out)[0]["device"] == "h100" and "--target" in err


def test_every_verb_takes_stdin(capsys, monkeypatch):
    import io

    for verb in ("opt", "stats", "cost", "schedule", "bench-schedule", "check"):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(GOOD.encode())))
        extra = ["--estimator", "approximate", "--heuristics", "xla-default"] if verb == "bench-schedule" else []
        code, out, err = run_cli(capsys, verb, "-", *extra, *(["-p", "dce"] if verb == "check" else []))
        assert code == 0 and "Traceback" not in err, (verb, err)
        if verb == "bench-schedule":
            assert "stdin.hlo" in out


def test_pipe_closed_early_is_quiet(tmp_path):
    big = GOOD.replace("HloModule good", "HloModule big")
    body = "".join(f"  %x{i} = f32[8]{{0}} exponential(%p)\n" for i in range(3000))
    big = big.replace("  %zero", body + "  %zero")
    dump = tmp_path / "dump"
    dump.mkdir()
    for i in range(3):
        (dump / f"m{i}.txt").write_text(big)
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "hlopt.cli.main", "opt", str(dump)], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err and "BrokenPipe" not in err


def test_scheduler_internal_error_names_module_and_pass(capsys, files, monkeypatch):
    import hlopt.cli.schedule as schedule

    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(schedule, "schedule_module", broken)
    code, _, err = run_cli(capsys, "schedule", files["good"])
    assert_one_line_error(code, err, "internal error in pass 'latency-hiding-scheduler' on module",
                          "good.hlo", "IndexError", "bug in hlopt")


def test_check_refuses_an_elided_constant_and_opt_prints_it_back(capsys, tmp_path):
    """A `{...}` constant would run as zeros: `check` refuses it naming the constant; `opt` keeps `{...}`."""
    path = tmp_path / "elided.hlo"
    path.write_text(GOOD.replace("%zero = f32[] constant(0)\n  %z = f32[8]{0} broadcast(%zero), dimensions={}",
                                 "%z = f32[8]{0} constant({...})"))
    code, _, err = run_cli(capsys, "check", path, "-p", "simplify")
    assert_one_line_error(code, err, "%z", "elided", "--xla_dump_large_constants")
    code, out, _ = run_cli(capsys, "opt", path, "-p", "simplify")
    assert code == 0 and "constant({...})" in out


def test_the_command_exits_with_mains_status_and_messages(tmp_path):
    """`hlopt` (`console_script`, also `python -m hlopt.cli.main`) ends the process without the
    interpreter's teardown: the output is complete, a user error keeps its message and status 1, a usage
    error its status 2."""
    root = Path(__file__).resolve().parents[1]
    good = tmp_path / "good.hlo"
    good.write_text(GOOD)
    out = tmp_path / "out.hlo"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hlopt.cli.main", *args], cwd=root, capture_output=True,
                              text=True, timeout=120)

    done = run("opt", str(good), "-p", "dce", "--timing")
    assert done.returncode == 0 and done.stdout.startswith("HloModule good") and "total" in done.stderr
    assert done.stdout == hlo.parse(GOOD).to_text()  # nothing left in a buffer
    done = run("opt", str(good), "-p", "dce", "-o", str(out))
    assert done.returncode == 0 and out.read_text().startswith("HloModule good")
    missing = run("opt", str(tmp_path / "missing.hlo"))
    assert missing.returncode == 1 and "missing.hlo" in missing.stderr and "Traceback" not in missing.stderr
    usage = run("opt", str(good), "--no-such-flag")
    assert usage.returncode == 2 and "--no-such-flag" in usage.stderr
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("hlopt ")


# ----------------------------------------------------------------------------- issue #33: the CLI as users run it

STEP = """HloModule step, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p: f32[64,64], q: f32[64,64]) -> f32[64,64] {
  %p = f32[64,64]{1,0} parameter(0)
  %q = f32[64,64]{1,0} parameter(1)
  %d = f32[64,64]{1,0} dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ar = f32[64,64]{1,0} all-reduce(%d), replica_groups={{0,1}}, to_apply=%add
  %e = f32[64,64]{1,0} dot(%q, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %m = f32[64,64]{1,0} add(%ar, %e)
}
"""


@pytest.fixture()
def step(tmp_path) -> Path:
    path = tmp_path / "step.hlo"
    path.write_text(STEP)
    return path


@pytest.mark.parametrize("argv, needles", [
    (["schedule", "{step}", "--plot", "/proc/g.png"], ["cannot write /proc/g.png", "No such file or directory"]),
    (["schedule", "{step}", "--trace", "/proc/t.json"], ["cannot write /proc/t.json"]),
    (["opt", "{step}", "-o", "/proc/o.hlo"], ["cannot write /proc/o.hlo"]),
])
def test_an_os_error_on_an_output_path_is_the_users(capsys, step, argv, needles):
    """`hlopt schedule step.hlo --plot /proc/g.png`: one line naming the path and the reason, not an
    internal error."""
    code, _, err = run_cli(capsys, *[a.format(step=step) for a in argv])
    line = assert_one_line_error(code, err, *needles)
    assert "internal error" not in line and "bug" not in line


def test_an_os_error_on_a_user_path_anywhere_in_a_verb_is_the_users(capsys, step, monkeypatch):
    """Whatever verb hits an OS error on a path outside hlopt's installation reports the path and the reason."""
    import hlopt.cli.main as cli_main

    def broken(module, name):
        raise FileNotFoundError(2, "No such file or directory", "/proc/C")

    monkeypatch.setattr(cli_main, "module_stats", broken)
    code, _, err = run_cli(capsys, "stats", step)
    line = assert_one_line_error(code, err, "/proc/C", "No such file or directory")
    assert "internal error" not in line


@pytest.mark.xla_gpu
def test_compile_to_an_unwritable_folder_is_the_users(capsys, step):
    """`hlopt compile step.hlo --target h100 --out /proc/C`."""
    code, _, err = run_cli(capsys, "compile", step, "--target", "h100", "--out", "/proc/C")
    line = assert_one_line_error(code, err, "/proc/C")
    assert "internal error" not in line and "bug" not in line


def test_an_unknown_device_in_a_pass_option_is_the_users(capsys, step):
    """`hlopt opt step.hlo -p 'priority-fusion{device=h1000}'`: refused when the spec is read."""
    code, _, err = run_cli(capsys, "opt", step, "-p", "priority-fusion{device=h1000}")
    assert code != 0 and "Traceback" not in err
    first = err.splitlines()[0]
    assert "device='h1000'" in first and "unknown device" in first and "bug" not in err


WRONG_SHAPE = GOOD.replace("HloModule good", "HloModule wrong").replace("%a = f32[8]{0} add", "%a = f32[4]{0} add")


@pytest.mark.parametrize("verb", ["stats", "cost", "schedule", "bench-schedule"])
def test_reports_refuse_a_module_that_does_not_verify(capsys, tmp_path, verb):
    """`hlopt stats wrong.hlo` (one instruction given a wrong shape) fails like `opt`; `--no-verify` reports."""
    path = tmp_path / "wrong.hlo"
    path.write_text(WRONG_SHAPE)
    extra = ["--estimator", "approximate"] if verb in ("schedule", "bench-schedule") else []
    code, _, err = run_cli(capsys, verb, path, *extra)
    assert code != 0 and "Traceback" not in err
    assert "module wrong does not verify: %a" in err.splitlines()[0] and "--no-verify" in err.splitlines()[0]
    code, out, err = run_cli(capsys, verb, path, *extra, "--no-verify", "--json")
    assert code == 0 and json.loads(out), err


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_output_files_get_the_mode_a_plain_open_gives(capsys, tmp_path, umask):
    """`hlopt opt good.hlo -o out.hlo`: the file is 0666 less the umask, as `open(path, "w")` makes it (the
    atomic write's temporary file is 0600 until then)."""
    import os

    good = tmp_path / "good.hlo"
    good.write_text(GOOD)
    old = os.umask(umask)
    try:
        code, _, err = run_cli(capsys, "opt", good, "-o", tmp_path / "out.hlo")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert code == 0, err
    mode = (tmp_path / "out.hlo").stat().st_mode & 0o777
    assert mode == 0o666 & ~umask == (tmp_path / "plain.txt").stat().st_mode & 0o777


def _hlopt(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m hlopt.cli.main ARGS` in a child process (as the console script runs it)."""
    import os

    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "hlopt.cli.main", *args], cwd=cwd or root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_xla_start_up_logs_stay_out_of_the_terminal_but_errors_do_not(tmp_path):
    """`hlopt check good.hlo -p dce`: none of the CUDA plugin's `cudart_stub ... Could not find cuda drivers`
    lines nor absl's banner; `--verbose` (or HLOPT_XLA_LOGS=1) shows them; a fatal XLA error still shows."""
    import importlib.util

    good = tmp_path / "good.hlo"
    good.write_text(GOOD)
    done = _hlopt("check", str(good), "-p", "dce", env={"HLOPT_XLA_LOGS": "0"})
    assert done.returncode == 0 and done.stdout.startswith("OK"), done.stderr
    assert "cudart_stub" not in done.stderr and "absl::InitializeLog" not in done.stderr, done.stderr
    if importlib.util.find_spec("jax_plugins.xla_cuda12") is not None:
        verbose = _hlopt("check", str(good), "-p", "dce", "--verbose")
        assert verbose.returncode == 0 and "cudart_stub" in verbose.stderr
    bad = _hlopt("check", str(good), "-p", "dce", env={"XLA_FLAGS": "--xla_no_such_flag=1"})
    assert bad.returncode != 0 and "Unknown flag in XLA_FLAGS: --xla_no_such_flag" in bad.stderr


def test_start_up_noise_filter_keeps_warnings_and_errors():
    from hlopt.cli.common import _STARTUP_NOISE

    noise = ["WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
             "I0000 00:00:1795838838.594022   30544 cudart_stub.cc:31] Could not find cuda drivers on your machine"]
    kept = ["W1128 04:06:40.421321   28823 sharding_propagation.cc:3132] GSPMD sharding propagation",
            "E1128 04:06:40.606920   28814 status_macros.cc:58] INTERNAL: RET_CHECK failure",
            "F1128 04:08:24.264941    1579 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --x",
            "Traceback (most recent call last):"]
    assert all(_STARTUP_NOISE.match(line) for line in noise)
    assert not any(_STARTUP_NOISE.match(line) for line in kept)


@pytest.mark.parametrize("yaml_text, expected", [
    ("pipeline:\n  - call-inliner\n  - fix: [algebraic-simplifier, dce]\n    max_iterations: ten\n",
     "pipeline[1].max_iterations: 'ten': expected a valid integer"),
    ("pipeline: [5]\n", "pipeline[0]: 5: expected a pass name or spec string"),
    ("pipeline: [{name: dce, options: 3}]\n", "pipeline[0].options: 3: expected a valid dictionary"),
    ("pipeline: [dce]\nverify_each: maybe\n", "verify_each: 'maybe': expected a valid boolean"),
    ("pipeline: [{fix: [dce], max_iterations: 0}]\n", "pipeline[0].max_iterations: 0: expected greater than or equal to 1"),
])
def test_a_config_with_a_wrong_type_is_one_line(capsys, files, yaml_text, expected):
    """`hlopt opt good.hlo --config bad.yaml` with `max_iterations: ten`: the field, the value and what was
    expected, on one line (not pydantic's five union errors)."""
    config = files["tmp"] / "bad.yaml"
    config.write_text(yaml_text)
    code, _, err = run_cli(capsys, "opt", files["good"], "--config", config)
    assert_one_line_error(code, err, "bad.yaml: invalid pipeline configuration: " + expected)


def test_demo_install_hint_keeps_its_brackets(monkeypatch):
    """`hlopt demo` without the GPU compiler prints `pip install 'hlopt[gpu-compile]'`, not `'hlopt'` (rich
    read `[gpu-compile]` as markup)."""
    import io

    import hlopt.runtime.xla_gpu_path.xla_gpu as xla_gpu
    from hlopt.cli.demo import xla_gpu_headline
    from rich.console import Console

    monkeypatch.setattr(xla_gpu, "available", lambda: False)
    console = Console(file=io.StringIO(), width=400)
    console.print(xla_gpu_headline(None, "h100", 8))
    assert "pip install 'hlopt[gpu-compile]'" in console.file.getvalue()


def test_user_text_in_tables_is_not_markup(capsys, tmp_path):
    """`hlopt stats '[red]m.hlo'`: names and paths are printed as written."""
    path = tmp_path / "[red]m.hlo"
    path.write_text(GOOD)
    code, out, err = run_cli(capsys, "stats", path)
    assert code == 0 and "[red]m.hlo" in out, (out, err)


@pytest.mark.parametrize("spec, message, column", [
    ("call-inliner,,dce", "a pass is missing before ','", 14),
    ("dce,", "a pass is missing after ','", 5),
    (",dce", "a pass is missing before ','", 1),
    ("fix(dce,,cse)", "a pass is missing before ','", 9),
    ("dce dce", "expected ',' between passes", 5),
    ("latency-hiding-scheduler{overlap_limt=2}", "has no option 'overlap_limt'; did you mean overlap_limit?", 26),
    ("dce,latency-hiding-scheduler{heuristic=xla-default, overlap_limit=0}", "overlap_limit='0' is not valid", 53),
])
def test_spec_errors_have_a_caret_where_the_problem_is(capsys, files, spec, message, column):
    """`hlopt opt good.hlo -p 'call-inliner,,dce'` is refused; `-p 'latency-hiding-scheduler{overlap_limt=2}'`
    gets a did-you-mean and a caret under the option, not at column 1."""
    code, _, err = run_cli(capsys, "opt", files["good"], "-p", spec)
    assert code != 0 and "Traceback" not in err
    first, shown, caret = err.strip().splitlines()
    assert message in first and f"at column {column} of pipeline spec" in first
    assert shown.strip() == spec and caret.index("^") - 2 == column - 1


def test_the_readme_custom_pass_command_runs_as_written(capsys, tmp_path, monkeypatch):
    """The README's `hlopt opt dump.hlo --load examples/custom_pass.py -p ...` works with the example."""
    import re
    import shlex

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    section = readme[readme.index("## Writing a pass"):]
    command = re.search(r"`(hlopt opt dump\.hlo --load examples/custom_pass\.py [^`]*)`", section).group(1)
    options = re.search(r"its options \(`([^`]*)`\)", section).group(1)
    (tmp_path / "dump.hlo").write_text(GOOD.replace("constant(0)", "constant(2)").replace("add(%p, %z)",
                                                                                          "multiply(%p, %z)"))
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "custom_pass.py").write_text((root / "examples" / "custom_pass.py").read_text())
    monkeypatch.chdir(tmp_path)
    for argv in (shlex.split(command)[1:], ["opt", "dump.hlo", "--load", "examples/custom_pass.py", "-p", options]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and "add(%p, %p)" in out, (argv, err)


def test_an_unknown_pass_names_what_load_registered(capsys, files):
    """`hlopt opt good.hlo --load examples/custom_pass.py -p my-pass`: the files' passes are listed."""
    example = Path(__file__).resolve().parents[1] / "examples" / "custom_pass.py"
    code, _, err = run_cli(capsys, "opt", files["good"], "--load", example, "-p", "my-pass")
    assert code != 0 and "Traceback" not in err
    first = err.splitlines()[0]
    assert "unknown pass 'my-pass' (" in first and f"{example} registers mul-by-two-to-add" in first


def test_a_pass_lying_about_changed_is_named_by_file_and_class(capsys, files):
    """`hlopt opt good.hlo --load liar.py -p liar`: the class and its file, not `hlopt_user_liar_<hash>`."""
    plugin = files["tmp"] / "liar.py"
    plugin.write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\nfrom hlopt.passes import ModulePass, register\n\n"
        "@register\n@dataclass(frozen=True)\nclass Liar(ModulePass):\n    name: ClassVar[str] = 'liar'\n"
        "    def run(self, module):\n        module.entry.root.attrs['metadata'] = None\n        return False\n")
    code, _, err = run_cli(capsys, "opt", files["good"], "--load", plugin, "-p", "liar")
    line = assert_one_line_error(code, err, "pass 'liar' failed", "returned False", f"class Liar in {plugin}")
    assert "hlopt_user_" not in line


def test_opt_timing_on_a_dump_is_one_table_with_totals(capsys, tmp_path):
    """`hlopt opt DUMP -o OPT --timing`: a row per module and totals, no per-pass tables (those come with
    `--timing=passes`); a bare `--timing` before the input does not swallow it."""
    dump = tmp_path / "dump"
    dump.mkdir()
    for i in range(5):
        (dump / f"module_{i:04d}.txt").write_text(GOOD.replace("HloModule good", f"HloModule m{i}"))
    code, _, err = run_cli(capsys, "opt", dump, "-o", tmp_path / "opt", "--timing", "-p", "simplify")
    assert code == 0, err
    lines = err.strip().splitlines()
    assert lines[0].split()[:3] == ["module", "passes", "changed"]
    assert [line.split()[0] for line in lines[1:6]] == [f"module_{i:04d}.txt" for i in range(5)]
    assert lines[6].startswith("total (5 module(s))") and "25 -> 10" in lines[6]
    assert "algebraic-simplifier" not in err and len(lines) == 8
    code, _, err = run_cli(capsys, "opt", "--timing", dump, "-o", tmp_path / "opt2", "-p", "simplify")
    assert code == 0 and "total (5 module(s))" in err
    code, _, err = run_cli(capsys, "opt", dump, "-o", tmp_path / "opt3", "--timing=passes", "-p", "simplify")
    assert code == 0 and err.count("algebraic-simplifier [fix 1, iter 0]") == 5 and "total (5 module(s))" in err


def test_an_interrupt_exits_130_and_says_what_was_written(capsys, files, monkeypatch):
    """Ctrl-C during `hlopt opt DUMP -p dce -o OUT`: status 130, and the files written so far named."""
    import hlopt.cli.main as cli_main

    calls = []
    real = cli_main._run_pipeline  # noqa: SLF001 - wrapped to interrupt the run

    def interrupted_on_the_second(pipeline, module, name=None):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(pipeline, module, name)

    monkeypatch.setattr(cli_main, "_run_pipeline", interrupted_on_the_second)
    good_dump = files["tmp"] / "good_dump"
    good_dump.mkdir()
    for i in range(3):
        (good_dump / f"m{i}.txt").write_text(GOOD)
    out = files["tmp"] / "out"
    code, _, err = run_cli(capsys, "opt", good_dump, "-p", "dce", "-o", out)
    assert code == 130 and "Traceback" not in err
    assert err.strip() == f"hlopt: interrupted; wrote 1 file(s): {out / 'm0.txt'}"
    calls.clear()
    code, _, err = run_cli(capsys, "opt", good_dump, "-p", "dce")
    assert code == 130 and err.strip() == "hlopt: interrupted; no file written"


def test_an_interrupted_bench_schedule_keeps_the_rows_it_finished(capsys, tmp_path, monkeypatch):
    """Ctrl-C during `hlopt bench-schedule synthetic:fsdp:2 --heuristics a,b,c --csv rows.csv`: the CSV has
    the finished rows."""
    import csv

    import hlopt.cli.schedule as schedule

    real, done = schedule._bench_one, []  # noqa: SLF001 - wrapped to interrupt the run

    def interrupted_on_the_third(job):
        if len(done) == 2:
            raise KeyboardInterrupt
        done.append(job)
        return real(job)

    monkeypatch.setattr(schedule, "_bench_one", interrupted_on_the_third)
    rows = tmp_path / "rows.csv"
    code, _, err = run_cli(capsys, "bench-schedule", "synthetic:fsdp:2", "--estimator", "approximate",
                           "--heuristics", "original-order,xla-default,critical-path", "--csv", rows)
    assert code == 130 and err.strip() == f"hlopt: interrupted; wrote 1 file(s): {rows}"
    with rows.open() as f:
        assert [r["heuristic"] for r in csv.DictReader(f)] == ["original-order", "xla-default"]


@pytest.mark.parametrize("argv", [["schedule", "{good}", "--estimator", "approximate", "--plot", "{tmp}/g.png"],
                                  ["bench-schedule", "synthetic:fsdp:2", "--heuristics", "xla-default",
                                   "--estimator", "approximate", "--plot", "{tmp}/g.png"],
                                  ["bench-schedule", "synthetic:fsdp:2", "--heuristics", "xla-default",
                                   "--estimator", "approximate", "--csv", "{tmp}/g.png"]])
def test_an_output_file_that_is_a_directory_is_an_error(capsys, files, argv):
    """`hlopt schedule good.hlo --plot g.png` with g.png a directory: one line, nothing written into it."""
    (files["tmp"] / "g.png").mkdir()
    code, _, err = run_cli(capsys, *[a.format(good=files["good"], tmp=files["tmp"]) for a in argv])
    assert_one_line_error(code, err, "g.png", "is a directory")
    assert list((files["tmp"] / "g.png").iterdir()) == []


def test_stablehlo_text_is_converted_through_jaxlib(capsys, tmp_path):
    """`hlopt opt step.mlir -p dce` where step.mlir is jax's `lowered.as_text()` (StableHLO, the default
    dialect, with or without debug locations): converted to HLO, not "expected 'HloModule'"."""
    import jax
    import jax.numpy as jnp

    lowered = jax.jit(lambda x, y: (jnp.sin(x) @ y, x + 1)).lower(jnp.ones((4, 4)), jnp.ones((4, 4)))
    for i, text in enumerate((lowered.as_text(), lowered.as_text(debug_info=True))):
        path = tmp_path / f"step{i}.mlir"
        path.write_text(text)
        code, out, err = run_cli(capsys, "opt", path, "-p", "dce")
        assert code == 0 and "Traceback" not in err, err
        module = hlo.parse(out)
        assert {i.opcode for i in module.entry.instructions} >= {"sine", "dot", "add"}
    code, out, err = run_cli(capsys, "check", tmp_path / "step1.mlir", "-p", "simplify")
    assert code == 0 and out.startswith("OK"), err


def test_stablehlo_text_jaxlib_refuses_is_one_line(capsys, tmp_path):
    path = tmp_path / "bad.mlir"
    path.write_text("module @x {\n  func.func @main( }\n")
    code, _, err = run_cli(capsys, "stats", path)
    assert_one_line_error(code, err, "bad.mlir: StableHLO/MHLO text that jaxlib could not convert",
                          "as_text(dialect='hlo')")


NO_COMM = """HloModule nocomm

ENTRY %main (p: f32[512,512], q: f32[512,512]) -> f32[512,512] {
  %p = f32[512,512]{1,0} parameter(0)
  %q = f32[512,512]{1,0} parameter(1)
  %d = f32[512,512]{1,0} dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %e = f32[512,512]{1,0} exponential(%d)
  %d2 = f32[512,512]{1,0} dot(%e, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[512,512]{1,0} tanh(%d2)
}
"""


def test_schedule_plot_of_a_module_without_communication(capsys, tmp_path, monkeypatch):
    """`hlopt schedule nocomm.hlo --plot g.png`: "no communication" (not "overlap 100%") in the title and
    the table, the longest kernels labeled, the legend outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved = {}
    real_savefig = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        ax = fig.axes[0]
        saved["title"] = ax.get_title()
        saved["labels"] = sorted(t.get_text() for t in ax.texts)
        legend = ax.get_legend()
        fig.canvas.draw()
        saved["legend_outside"] = legend.get_window_extent().x0 >= ax.get_window_extent().x1
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    path = tmp_path / "nocomm.hlo"
    path.write_text(NO_COMM)
    code, out, err = run_cli(capsys, "schedule", path, "--plot", tmp_path / "g.png")
    plt.close("all")
    assert code == 0, err
    assert (tmp_path / "g.png").stat().st_size > 0
    assert saved["title"].endswith("no communication") and "overlap" not in saved["title"]
    assert saved["labels"] == ["d", "d2", "e", "t"] and saved["legend_outside"]
    assert "no comm" in out and "100%" not in out


def test_overlap_is_never_minus_zero():
    from hlopt.scheduler.report import format_overlap

    assert format_overlap(-1e-12) == "0%" and format_overlap(-0.0) == "0%" and format_overlap(0.82) == "82%"


def test_every_ir_name_the_custom_pass_example_uses_is_in_the_api_doc():
    """`inst.get`, `inst.operand(i)` and the rest of what examples/custom_pass.py calls are in docs/API.md."""
    import ast
    import re

    from hlopt.hlo.ir import Computation, Instruction, Module

    root = Path(__file__).resolve().parents[1]
    tree = ast.parse((root / "examples" / "custom_pass.py").read_text())
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    ir_names = {name for name in used if any(hasattr(cls, name) for cls in (Instruction, Computation, Module))}
    assert {"get", "operand", "operands", "replace_instruction"} <= ir_names
    doc = (root / "docs" / "API.md").read_text()
    missing = sorted(name for name in ir_names if not re.search(rf"\.{name}\b", doc))
    assert not missing, missing




def test_bench_schedule_divides_by_one_bound_per_module(capsys, tmp_path, monkeypatch):
    """`hlopt bench-schedule step.hlo --heuristics original-order,xla-default --plot g.png` on a step whose
    work is in a non-inlinable call (as a shard_map body): the two makespans differ, so their ratios to the
    module's one bound differ too (they both read 1.000 when the bound was each schedule's own); the plot
    draws those ratios under a title saying what 1.0 is."""
    import matplotlib
    import matplotlib.figure

    matplotlib.use("Agg")
    drawn = {}
    real_savefig = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        ax = fig.axes[0]
        drawn["title"] = ax.get_title()
        drawn["heights"] = [p.get_height() for p in ax.patches]
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    path = tmp_path / "step.hlo"
    from test_cli import ROLLUP  # a step whose work sits inside a call

    path.write_text(ROLLUP)
    code, out, err = run_cli(capsys, "bench-schedule", path, "--heuristics", "original-order,xla-default",
                             "--plot", tmp_path / "g.png", "--json")
    assert code == 0, err
    original, default = json.loads(out)
    assert original["module_bound_us"] == default["module_bound_us"] > 0
    assert original["module_bound_kind"] in ("compute", "communication")
    assert original["module_bound_us"] == max(original["compute_alone_us"], original["comm_alone_us"])
    assert original["makespan_us"] > default["makespan_us"] >= default["module_bound_us"]
    assert original["makespan_over_module_bound"] > default["makespan_over_module_bound"] >= 1.0
    assert drawn["heights"] == pytest.approx([original["makespan_over_module_bound"],
                                              default["makespan_over_module_bound"]])
    assert "1.0 = the larger of the compute stream's work alone and" in drawn["title"]
    code, out, err = run_cli(capsys, "bench-schedule", path, "--heuristics", "original-order,xla-default")
    assert code == 0 and "/ module bound" in out and "step.hlo on h100: module bound" in out
    assert "-0%" not in out
