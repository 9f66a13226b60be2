"""`hlopt tune` (runtime.tuning.tune, runtime.tuning.tune_space, runtime.tuning.tune_report, cli/tune.py).

The search, resumption, memory refusal and outputs are tested with a stand-in for the trial evaluator
(`run_trial`, replaced in this process: a formula of the configuration), so that they cost no compile; the
tests marked `xla_gpu` run real trials on a tiny 8-device module with XLA's deviceless compiler: 3 trials in this
process (4-10 s on a quiet 2-core machine), and 2 as tasks of a local Ray instance (6-14 s with Ray's start; skipped
without Ray); the slow suite also runs 2 on a Ray head started with `ray start`, reached as a Ray Client (`ray://`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hlopt.cli.main import main
from hlopt.runtime.tuning import tune, tune_space
from hlopt.runtime.tuning.tune_report import pareto_front, ranked, write_outputs
from hlopt.runtime.xla_gpu_path import xla_gpu

optuna = pytest.importorskip("optuna")
needs_compiler = pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")

SPACE = """
memory_limit_gb: 2
xla_flags:
  xla_gpu_all_gather_combine_threshold_bytes: {low: 1048576, high: 1073741824, log: true, default: 31457287}
  xla_gpu_enable_pipelined_all_gather: {choices: [false, true], default: false}
  xla_gpu_enable_while_loop_double_buffering: {choices: [false, true], default: false}
hlopt:
  use: {choices: [false, true], default: false}
  heuristic: {choices: [xla-default, critical-path], default: xla-default}
"""
MODULE = "HloModule m\n\nENTRY e {\n  ROOT p = f32[4]{0} parameter(0)\n}\n"


def fake_trial(job: tune.TrialJob) -> dict:
    """A stand-in evaluator: pipelined all-gathers and hlopt save time, double buffering saves more but needs
    more memory than the space's 2 GiB limit; the combine threshold is best at 64 MiB."""
    flags = dict(f[2:].split("=") for f in job.flags.split())
    threshold = int(flags.get("xla_gpu_all_gather_combine_threshold_bytes", 31457287))
    modeled = 1000.0 + 40 * abs(math.log2(threshold / 2**26))
    modeled -= 150 * (flags.get("xla_gpu_enable_pipelined_all_gather") == "true")
    modeled -= 300 * (flags.get("xla_gpu_enable_while_loop_double_buffering") == "true")
    if job.hlopt is not None:
        modeled -= 60 + 20 * (job.hlopt["heuristic"] == "critical-path")
    peak = 2**30 + 2**31 * (flags.get("xla_gpu_enable_while_loop_double_buffering") == "true")
    return {"modeled_us": modeled, "exposed_comm_us": modeled / 10, "makespan_us": modeled * 1.1,
            "peak_memory_bytes": peak, "launches": 10, "kept": "xla" if job.hlopt is None else "hlopt", "seconds": 0.0}


@pytest.fixture
def fake(monkeypatch):
    """run_trial replaced by `fake_trial` (trials run in this process with workers=1)."""
    calls: list[tune.TrialJob] = []

    def run(job):
        calls.append(job)
        return fake_trial(job)

    monkeypatch.setattr(tune, "run_trial", run)
    return calls


def space_file(tmp_path: Path, text: str = SPACE) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def tuner(tmp_path: Path, out: str = "out", trials: int = 12, seed: int = 0, **kw) -> tune.Tuner:
    space = tune_space.load_space(space_file(tmp_path))
    return tune.Tuner("m", [("m.hlo", MODULE)], tmp_path / out, space, trials=trials, seed=seed, **kw)


# ----------------------------------------------------------------------------- the space


def test_default_space_validates_and_its_default_point_passes_no_flag():
    space = tune_space.default_space()
    assert "xla_gpu_all_reduce_combine_threshold_bytes" in space.xla_flags
    assert {"hlopt.use", "hlopt.pipeliner", "hlopt.heuristic", "hlopt.guard"} <= set(space.names())
    assert space.contains(space.defaults()) and space.contains(space.defaults(use_hlopt=True))
    assert tune_space.Config.of(space, space.defaults()) == tune_space.Config({}, None)
    hlopt_default = tune_space.Config.of(space, space.defaults(use_hlopt=True))
    assert hlopt_default.flags == {} and hlopt_default.hlopt == {"pipeliner": True, "heuristic": "xla-default",
                                                                 "guard": True, "double_buffering": "best"}


def test_a_configuration_passes_only_the_flags_that_differ_from_xla_defaults():
    space = tune_space.load_space(None)
    point = space.defaults() | {"xla_gpu_enable_pipelined_all_gather": True,
                                "xla_gpu_all_reduce_combine_threshold_bytes": 1048576}
    config = tune_space.Config.of(space, point)
    assert config.xla_flags == ("--xla_gpu_all_reduce_combine_threshold_bytes=1048576 "
                                "--xla_gpu_enable_pipelined_all_gather=true")
    assert config.hlopt is None and "enable_pipelined_all_gather=true" in config.describe()


@pytest.mark.parametrize("body, message", [
    ("xla_flags: {xla_a: {low: 1, high: 10, default: 20}}", "outside"),
    ("xla_flags: {xla_a: {choices: [1, 2], low: 1, high: 3, default: 1}}", "either choices or low/high"),
    ("xla_flags: {xla_a: {choices: [false, true], default: 1}}", "not one of the choices"),
    ("xla_flags: {xla_a: {low: 0, high: 10, log: true, default: 1}}", "log range"),
    ("xla_flags: {--xla_a: {choices: [1, 2], default: 1}}", "without dashes"),
    ("xla_flags: {xla_a: {choices: [1, 2]}}", "default"),
    ("xla_flags: {xla_a: {choices: [1, 2], default: 1, colour: red}}", "colour"),
    ("hlopt: {use: {choices: [true], default: true}}", "must allow false"),
    ("hlopt: {use: {choices: [false, true], default: false}, heuristic: {choices: [fastest], default: fastest}}",
     "unknown ['fastest']"),
    ("hlopt: {use: {choices: [false, true], default: false}, double_buffering: {choices: [best, maybe], "
     "default: best}}", "unknown ['maybe']"),
    ("objective: fastest", "objective"),
    ("memory_limit_gb: 1", "nothing to tune"),
    ("xla_flags: [1, 2", "not YAML"),
])
def test_a_bad_space_is_one_clear_line(tmp_path, body, message):
    with pytest.raises(tune_space.SpaceError) as e:
        tune_space.load_space(space_file(tmp_path, body))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_pipelines_of_hlopt_options_parse():
    from hlopt.passes.framework.pipeline import parse_pipeline

    no_pipeliner = tune.before_pipeline(False)
    assert "collective-pipeliner" not in no_pipeliner and "collective-pipeliner" in tune.before_pipeline(True)
    after = tune.after_pipeline("critical-path", 2)
    assert after.endswith("latency-hiding-scheduler{heuristic=critical-path,overlap_limit=2}")
    assert tune.after_pipeline() == __import__("hlopt.runtime.xla_gpu_path.reemit", fromlist=["AFTER_XLA"]).AFTER_XLA
    for spec in (no_pipeliner, after):
        parse_pipeline(spec)


# ----------------------------------------------------------------------------- the search (stand-in evaluator)


def test_the_defaults_come_first_and_the_search_finds_the_best_within_memory(tmp_path, fake):
    result = tuner(tmp_path).run()
    assert [r["trial"] for r in result.records] == list(range(12))
    assert result.records[0]["config"] == "XLA defaults" and fake[0].flags == "" and fake[0].hlopt is None
    assert result.records[1]["mode"] == "hlopt" and fake[1].flags == ""
    refused = [r for r in result.records if r["status"] == "over_memory"]
    assert refused and all("double_buffering=true" in r["config"] for r in refused)
    best = result.best()
    assert best["status"] == "ok" and best["objective_us"] < result.default()["objective_us"]
    assert best["objective_us"] == min(r["objective_us"] for r in result.records if r["status"] == "ok")
    assert result.best("xla")["mode"] == "xla"


def test_the_last_trial_is_hlopt_on_the_best_flags_of_xla_alone(tmp_path, fake):
    result = tuner(tmp_path, trials=10).run()
    earlier = tune.TuneResult("m", tmp_path, result.space, "h100", result.memory_limit_bytes, result.records[:9])
    last, best_xla = result.records[9], earlier.best("xla")
    assert last["mode"] == "hlopt" and last["xla_flags"] == best_xla["xla_flags"]
    assert last["hlopt"] == {"heuristic": "xla-default"}


def test_same_seed_same_trials_other_seed_other_trials(tmp_path, fake):
    params = [[r["params"] for r in tuner(tmp_path, out, trials=8, seed=seed).run().records]
              for out, seed in (("a", 3), ("b", 3), ("c", 4))]
    assert params[0] == params[1] and params[0] != params[2]


def test_an_interrupted_run_keeps_its_trials_and_resumes(tmp_path, monkeypatch):
    calls = []

    def interrupted(job):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(job)
        return fake_trial(job)

    monkeypatch.setattr(tune, "run_trial", interrupted)
    first = tuner(tmp_path, trials=6).run()
    assert first.interrupted and len(first.records) == 3
    assert len((tmp_path / "out" / "trials.jsonl").read_text().splitlines()) == 3
    monkeypatch.setattr(tune, "run_trial", fake_trial)
    second = tuner(tmp_path, trials=6).run()
    assert not second.interrupted and [r["trial"] for r in second.records] == list(range(6))
    assert second.records[:3] == first.records
    with pytest.raises(tune.TuneError, match="another module, space, target or seed"):
        tuner(tmp_path, trials=6, seed=1).run()
    assert len(tuner(tmp_path, trials=2, seed=1, restart=True).run().records) == 2


def test_a_failed_trial_is_recorded_and_the_search_goes_on(tmp_path, monkeypatch):
    def failing(job):
        return {"error": "RuntimeError: XLA refused"} if "pipelined_all_gather=true" in job.flags else fake_trial(job)

    monkeypatch.setattr(tune, "run_trial", failing)
    result = tuner(tmp_path, trials=8).run()
    failed = [r for r in result.records if r["status"] == "failed"]
    assert failed and all(r["error"] == "RuntimeError: XLA refused" for r in failed)
    assert ranked(result)[-1]["status"] == "failed" and result.best() is not None


def test_pareto_front_keeps_the_trials_nothing_beats_on_both():
    rows = [{"trial": i, "status": "ok", "objective_us": t, "peak_memory_bytes": m}
            for i, (t, m) in enumerate([(10, 5), (8, 6), (9, 7), (7, 9), (12, 4), (7, 10)])]
    assert [r["trial"] for r in pareto_front(rows)] == [4, 0, 1, 3]


def test_outputs_best_flags_hlopt_yaml_csv_and_plot(tmp_path, fake):
    result = tuner(tmp_path).run()
    paths = write_outputs(result, devices=8)
    best_xla = result.best("xla")
    assert (tmp_path / "out" / "best_flags.txt").read_text() == best_xla["xla_flags"] + "\n"
    assert best_xla["objective_us"] == min(r["objective_us"] for r in result.ok() if r["mode"] == "xla")
    assert result.best()["mode"] == "hlopt" and paths["best_hlopt"].read_text().count("critical-path") >= 1
    import yaml

    data = yaml.safe_load(paths["best_hlopt"].read_text())
    assert data["hlopt"]["heuristic"] == "critical-path" and data["compile_command"].startswith("hlopt compile")
    csv_lines = paths["csv"].read_text().splitlines()
    assert len(csv_lines) == 13 and csv_lines[0].startswith("rank,trial,status")
    summary = json.loads(paths["summary"].read_text())
    assert summary["gain"] > 0 and summary["default"]["trial"] == 0 and summary["pareto"]
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"


def test_cli_tune_with_the_stand_in(tmp_path, fake, capsys):
    module = tmp_path / "m.hlo"
    module.write_text(MODULE)
    rc = main(["tune", str(module), "--space", str(space_file(tmp_path)), "--trials", "6", "--workers", "1",
               "--out", str(tmp_path / "o"), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["trials"] == 6 and summary["default"]["config"] == "XLA defaults"
    assert set(summary["files"]) >= {"csv", "json", "summary", "best_flags", "plot"}


def test_cli_tune_a_dump_directory_per_module_and_jointly(tmp_path, fake, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    for name in ("a", "b"):
        (dump / f"{name}.hlo").write_text(MODULE.replace("HloModule m", f"HloModule {name}"))
    space = str(space_file(tmp_path))
    assert main(["tune", str(dump), "--space", space, "--trials", "3", "--workers", "1", "--out", str(tmp_path / "per"),
                 "--json"]) == 0
    per_module = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in per_module] == ["a", "b"]
    assert all((tmp_path / "per" / n / "trials.json").exists() for n in ("a", "b"))
    assert all(len(job.modules) == 1 for job in fake)
    fake.clear()
    assert main(["tune", str(dump), "--joint", "--space", space, "--trials", "3", "--workers", "1",
                 "--out", str(tmp_path / "j"), "--json"]) == 0
    joint = json.loads(capsys.readouterr().out)
    assert joint["name"] == "dump" and joint["trials"] == 3 and all(len(job.modules) == 2 for job in fake)


def test_cli_tune_errors_are_one_line(tmp_path, capsys, monkeypatch):
    module = tmp_path / "m.hlo"
    module.write_text(MODULE)
    bad = space_file(tmp_path, "xla_flags: {xla_a: {low: 1, high: 10, default: 20}}")
    with pytest.raises(SystemExit) as e:
        main(["tune", str(module), "--space", str(bad)])
    assert e.value.code == 1 and capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["tune", str(module), "--target", "v100"])
    assert "unknown target" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)
    with pytest.raises(SystemExit):
        main(["tune", str(module)])
    assert "pip install 'hlopt[tune]'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real trials (deviceless XLA:GPU)


@pytest.fixture(scope="module")
def tiny_module(tmp_path_factory) -> Path:
    """A psum inside a scan over 8 devices (shard_map), as jax lowers it."""
    from hlopt.corpus.programs import built
    from hlopt.runtime import capture_text

    fn, args = built("shmap_psum_in_scan")
    path = tmp_path_factory.mktemp("tune") / "psum_scan.hlo"
    path.write_text(capture_text(fn, *args))
    return path


@pytest.mark.xla_gpu
@needs_compiler
def test_three_real_trials(tiny_module, tmp_path, capsys):
    """Trial 0 (XLA's defaults), trial 1 (hlopt compile's defaults) and one sampled trial, deviceless."""
    space = space_file(tmp_path, "xla_flags:\n  xla_gpu_all_reduce_combine_threshold_bytes: "
                                 "{low: 1024, high: 1073741824, log: true, default: 31457287}\n"
                                 "hlopt:\n  use: {choices: [false, true], default: false}\n")
    rc = main(["tune", str(tiny_module), "--space", str(space), "--trials", "3", "--workers", "1",
               "--out", str(tmp_path / "o"), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    rows = json.loads((tmp_path / "o" / "trials.json").read_text())
    by_trial = {r["trial"]: r for r in rows}
    assert summary["trials"] == 3 and summary["failed"] == 0
    default, hlopt_default = by_trial[0], by_trial[1]
    assert default["xla_flags"] == "" and default["mode"] == "xla" and hlopt_default["mode"] == "hlopt"
    # trial 1 compiled XLA's default again beside hlopt's module: the same figure as trial 0
    assert hlopt_default["xla_alone_modeled_us"] == default["modeled_us"] > 0
    for r in rows:
        assert r["peak_memory_bytes"] > 0 and r["makespan_us"] > 0 and r["exposed_comm_us"] >= 0
    assert (tmp_path / "o" / "best_flags.txt").exists() and (tmp_path / "o" / "pareto.png").exists()


@pytest.mark.xla_gpu
@needs_compiler
def test_a_small_sweep_on_a_local_ray_instance(tiny_module, tmp_path, capsys):
    pytest.importorskip("ray")
    space = space_file(tmp_path, "xla_flags:\n  xla_gpu_all_reduce_combine_threshold_bytes: "
                                 "{low: 1024, high: 1073741824, log: true, default: 31457287}\n")
    rc = main(["tune", str(tiny_module), "--space", str(space), "--trials", "2", "--workers", "2",
               "--cluster", "local", "--out", str(tmp_path / "o"), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["trials"] == 2 and summary["rated"] == 2 and summary["default"]["modeled_us"] > 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.xla_gpu
@needs_compiler
def test_a_small_sweep_on_a_ray_cluster_through_ray_client(tiny_module, tmp_path):
    """`--cluster ray://HOST:PORT` end to end: a Ray head started here as `ray start` starts one (token
    authentication as Ray's default has it), and `hlopt tune` in another process connecting as a Ray Client."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("ray")
    ray_cli = shutil.which("ray")
    if ray_cli is None:
        pytest.skip("no `ray` command")
    gcs_port, client_port = _free_port(), _free_port()
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={gcs_port}", f"--ray-client-server-port={client_port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
         "--min-worker-port=0", "--max-worker-port=0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        space = space_file(tmp_path, "xla_flags:\n  xla_gpu_all_reduce_combine_threshold_bytes: "
                                     "{low: 1024, high: 1073741824, log: true, default: 31457287}\n")
        env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
        command = [sys.executable, "-m", "hlopt.cli.main", "tune", str(tiny_module), "--space", str(space),
                   "--trials", "2", "--workers", "2", "--cluster", f"ray://127.0.0.1:{client_port}",
                   "--out", str(tmp_path / "o"), "--json"]
        deadline = time.monotonic() + 120
        while True:  # the head takes a few seconds to listen
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
            if done.returncode == 0 or time.monotonic() > deadline or "cannot connect" not in done.stderr:
                break
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads(done.stdout)
        assert summary["trials"] == 2 and summary["rated"] == 2 and summary["default"]["modeled_us"] > 0
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)


def test_the_double_buffering_option_reaches_compile_for_gpu_as_it_takes_it():
    assert [tune.double_buffering_option(v) for v in ("best", "always", "never")] == ["best", True, False]
    space = tune_space.default_space()
    assert space.hlopt.double_buffering.default == "best"
