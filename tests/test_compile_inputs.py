"""`hlopt compile` on what users hand it: dump directories, XLA:CPU-optimized modules, unwritable --out; the guard.

The cases that stop before any XLA:GPU compile run anywhere; the others are marked `xla_gpu`.
"""

from __future__ import annotations

import json

import pytest
from hlopt.cli.main import main
from hlopt.runtime.xla_gpu_path import reemit, xla_gpu

needs_compiler = pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")

PLAIN = """HloModule plain

ENTRY %main (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  %e = f32[64,64]{1,0} exponential(%a)
  ROOT %t = f32[64,64]{1,0} tanh(%e)
}
"""

#: What XLA:CPU's optimized dumps carry (`*.cpu_after_optimizations.txt`): a CPU-only backend_config field.
CPU_OPTIMIZED = """HloModule cpu_optimized

%wrapped_tanh_computation (p: f32[64,64]) -> f32[64,64] {
  %p = f32[64,64]{1,0} parameter(0)
  ROOT %t = f32[64,64]{1,0} tanh(%p)
}

ENTRY %main (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  ROOT %wrapped_tanh = f32[64,64]{1,0} fusion(%a), kind=kLoop, calls=%wrapped_tanh_computation, backend_config={"outer_dimension_partitions":["2"]}
}
"""


def test_xla_cpu_optimized_module_is_one_line_naming_the_reason(tmp_path, capsys):
    src = tmp_path / "m.cpu_after_optimizations.txt"
    src.write_text(CPU_OPTIMIZED)
    assert main(["compile", str(src), "--target", "h100", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "optimized by XLA:CPU" in err and "outer_dimension_partitions" in err and "wrapped_tanh" in err
    assert not (tmp_path / "o").exists()


def test_unwritable_out_is_one_line_naming_the_path(tmp_path, capsys):
    src = tmp_path / "m.hlo"
    src.write_text(PLAIN)
    assert main(["compile", str(src), "--target", "h100", "--out", "/proc/C"]) == 1
    message = capsys.readouterr().err.strip()
    assert message.startswith("hlopt compile: error: --out /proc/C: cannot write there (") and "\n" not in message
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["compile", str(src), "--target", "h100", "--out", str(blocker / "sub")]) == 1
    assert f"--out {blocker / 'sub'}: cannot write there" in capsys.readouterr().err


def test_guard_decision_keeps_the_faster():
    report = {"ours": {"modeled_us": 10.0}, "xla_default": {"modeled_us": 9.0}}
    assert reemit.guard_decision(report) == {"enabled": True, "kept": "xla_default", "hlopt_us": 10.0,
                                             "xla_default_us": 9.0}
    assert reemit.guard_decision(report, enabled=False)["kept"] == "hlopt"
    report["xla_default"]["modeled_us"] = 10.0
    assert reemit.guard_decision(report)["kept"] == "hlopt"  # ties keep ours


@needs_compiler
@pytest.mark.xla_gpu
def test_dump_directory_compiles_module_by_module(tmp_path, capsys):
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "module_0001.jit_f.before_optimizations.txt").write_text(PLAIN)
    (dump / "module_0001.jit_f.cpu_after_optimizations.txt").write_text(CPU_OPTIMIZED)
    (dump / "module_0001.jit_f.debug_options").write_text("xla_dump_to: 'x'\n")
    out = tmp_path / "out"
    assert main(["compile", str(dump), "--target", "h100", "--out", str(out), "--json"]) == 1
    captured = capsys.readouterr()
    reports = json.loads(captured.out)
    assert len(reports) == 2
    failed = [r for r in reports if "error" in r]
    assert len(failed) == 1 and "optimized by XLA:CPU" in failed[0]["error"]
    ok = [r for r in reports if "error" not in r][0]
    assert ok["guard"]["kept"] in ("hlopt", "xla_default")
    written = out / "module_0001.jit_f.before_optimizations"
    assert {p.name for p in written.iterdir()} == {"hlopt.hlo", "final.hlo", "executable.bin", "xla_default.hlo",
                                                  "report.json", "signature.json"}
    assert "cpu_after_optimizations.txt" in captured.err


@needs_compiler
@pytest.mark.xla_gpu
def test_no_guard_keeps_ours_and_says_so(tmp_path, capsys):
    src = tmp_path / "m.hlo"
    src.write_text(PLAIN)
    assert main(["compile", str(src), "--target", "h100", "--out", str(tmp_path / "o"), "--no-guard"]) == 0
    out = capsys.readouterr().out
    assert "guard off (--no-guard): kept hlopt's executable" in out
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["guard"]["enabled"] is False and report["guard"]["kept"] == "hlopt"


def test_load_without_a_gpu_says_so_in_one_line(tmp_path, capsys):
    """What `hlopt compile` writes loads on a GPU host; here (no GPU) loading and `hlopt run` say so in one line,
    after the inputs were checked against the signature."""
    import numpy as np
    from hlopt.runtime.xla_gpu_path import saved

    from hlopt import hlo, runtime

    module = hlo.parse(PLAIN)
    signature = saved.signature_of(module, "h100", 1)
    assert signature.arguments == (((64, 64), "f32"),) and signature.results == (((64, 64), "f32"),)
    (tmp_path / saved.SIGNATURE_FILE).write_text(json.dumps(signature.as_dict()))
    (tmp_path / "executable.bin").write_bytes(b"x")
    (tmp_path / "hlopt.hlo").write_text(PLAIN)
    assert saved.read_signature(tmp_path) == signature
    with pytest.raises(saved.NoGpuError, match="no GPU that jax sees"):
        runtime.load(tmp_path)
    np.savez(tmp_path / "bad.npz", a=np.zeros((2, 2), np.float32))
    assert main(["run", str(tmp_path), "--inputs", str(tmp_path / "bad.npz")]) == 1
    assert "argument 0: expected f32[64, 64], got f32[2, 2]" in capsys.readouterr().err
    np.savez(tmp_path / "x.npz", a=np.zeros((64, 64), np.float32))
    assert main(["run", str(tmp_path), "--inputs", str(tmp_path / "x.npz")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no GPU that jax sees" in err
    with pytest.raises(ValueError, match="not found"):
        saved.read_signature(tmp_path / "nothing")
