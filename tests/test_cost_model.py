"""cost_model: devices, flops against XLA's HloCostAnalysis, roofline, collectives, `hlopt cost --json`."""

from __future__ import annotations

import json

import pytest
from corpus import corpus_texts

import hlo
from cli.main import main
from cost_model import DEVICES, AnalyticalGpuModel, collective_time_us, get_device
from cost_model.analysis import _computation_flops
from runtime._xla import cost_analysis

#: Programs whose flops and transcendentals already equal XLA's HloCostAnalysis exactly.
EXACT = ["mlp_grad", "scan_rnn", "remat_opt_barrier", "custom_vjp", "transformer_train_step", "elementwise_math",
         "vmap_batched_dot"]


@pytest.mark.parametrize("name", DEVICES)
def test_devices_load(name):
    d = get_device(name)
    assert d.sm_count > 50 and d.hbm_bandwidth > 1e12 and d.tensor_flops("bf16") > d.fp32_flops
    assert d.tensor_flops("f8e4m3fn") >= d.tensor_flops("bf16") or name == "a100"


def test_device_from_file(tmp_path):
    spec = get_device("h100").model_dump()
    spec["name"] = "my-gpu"
    spec["sm_count"] = 10
    path = tmp_path / "my.json"
    path.write_text(json.dumps(spec))
    d = get_device(str(path))
    assert d.name == "my-gpu" and d.sm_count == 10


@pytest.mark.parametrize("name", EXACT)
def test_flops_equal_xla_cost_analysis(name):
    entry = next(e for e in corpus_texts() if e.id == name)
    xla = cost_analysis(entry.text)
    ours = _computation_flops(hlo.parse(entry.text).entry)
    assert ours.flops == xla["flops"]
    assert ours.transcendentals == xla.get("transcendentals", 0)


def test_roofline_bounds():
    m = hlo.parse("""HloModule r
ENTRY %e (a: bf16[4096,4096], b: bf16[4096,4096], x: f32[4194304]) -> (bf16[4096,4096], f32[4194304]) {
  %a = bf16[4096,4096] parameter(0)
  %b = bf16[4096,4096] parameter(1)
  %x = f32[4194304] parameter(2)
  %d = bf16[4096,4096] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %y = f32[4194304] add(%x, %x)
  ROOT %t = (bf16[4096,4096], f32[4194304]) tuple(%d, %y)
}""")
    model = AnalyticalGpuModel("h100")
    dot = model.instruction_time(m.entry.instruction("d"))
    add = model.instruction_time(m.entry.instruction("y"))
    assert dot.bound == "compute" and add.bound == "memory"
    assert 130 < dot.time_us < 150  # 2*4096^3 flop at 989 TFLOP/s is 139 us
    assert 9 < add.time_us < 12  # 32 MiB over 3.35 TB/s
    assert AnalyticalGpuModel("b200").instruction_time(m.entry.instruction("d")).time_us < dot.time_us


def test_collective_model():
    d = get_device("h100")
    small, big = collective_time_us("all-reduce", 1e3, 8, d), collective_time_us("all-reduce", 1e9, 8, d)
    assert small < 25 and big > 1e9 / d.nvlink_bandwidth * 1e6
    assert collective_time_us("all-reduce", 1e9, 16, d) > big  # crosses nodes: network
    assert collective_time_us("all-gather", 1e9, 8, d) < big
    assert collective_time_us("all-reduce", 1e9, 1, d) == d.kernel_launch_us


def test_cost_cli_json(capsys, tmp_path):
    entry = next(e for e in corpus_texts() if e.id == "transformer_train_step")
    path = tmp_path / "t.hlo"
    path.write_text(entry.text)
    assert main(["cost", str(path), "--device", "h100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "h100"
    assert set(report["total"]) == {"flops", "transcendentals", "bytes_accessed", "time_us"}
    row = report["instructions"][0]
    assert set(row) == {"name", "opcode", "computation", "flops", "bytes_accessed", "time_us", "bound"}
    assert report["total"]["flops"] == cost_analysis(entry.text)["flops"]


def test_scheduler_uses_the_analytical_model():
    from passes.pipeline import run_pipeline
    from scheduler.synthetic import synthetic_module

    m = synthetic_module(4, "fsdp", hidden=512, batch=512)
    run_pipeline(m, "async-collective-creator,latency-hiding-scheduler{estimator=analytical,device=h100}")
    assert m.is_scheduled
