"""Step 3's scheduler times collectives as XLA:GPU's does: by XLA's own estimates (`sol`) of the collectives of XLA's
default compile of the same program (`cost_model.xla_estimates.WithXlaCollectiveLatencies`), and step 3's passes
time the GPU compiled for (`runtime.xla_gpu_path.reemit.after_xla_passes`)."""

from __future__ import annotations

import pytest
from hlopt.cost_model.model import AnalyticalGpuModel
from hlopt.cost_model.xla_estimates import (
    WithXlaCollectiveLatencies,
    collective_key,
    xla_collective_latencies,
)
from hlopt.runtime.xla_gpu_path import reemit, xla_gpu

from hlopt import hlo

needs_compiler = pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")


def _sol(us: float) -> str:
    """The attribute XLA:GPU writes on a collective it estimated (its `sol` model's time)."""
    return ', backend_config={"reification_cost":[{"name":"sol","exec_time_us":' + str(us) + "}]}"


def _module(ag1: str, ag2: str, ar: str, channel: int = 1) -> str:
    """Two all-gathers of the same shapes and groups (names and channels apart) and a scalar all-reduce, each with
    the backend_config given."""
    return f"""HloModule m, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

ENTRY %main (x: bf16[8,64], y: bf16[8,64], z: f32[]) -> (bf16[64,64], bf16[64,64], f32[]) {{
  %x = bf16[8,64]{{1,0}} parameter(0)
  %y = bf16[8,64]{{1,0}} parameter(1)
  %z = f32[] parameter(2)
  %ag.1 = (bf16[8,64]{{1,0}}, bf16[64,64]{{1,0}}) all-gather-start(%x), channel_id={channel}, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, dimensions={{0}}, use_global_device_ids=true{ag1}
  %agd.1 = bf16[64,64]{{1,0}} all-gather-done(%ag.1)
  %ag.2 = (bf16[8,64]{{1,0}}, bf16[64,64]{{1,0}}) all-gather-start(%y), channel_id={channel + 1}, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, dimensions={{0}}, use_global_device_ids=true{ag2}
  %agd.2 = bf16[64,64]{{1,0}} all-gather-done(%ag.2)
  %ar = f32[] all-reduce-start(%z), channel_id={channel + 2}, replica_groups={{{{0,1,2,3,4,5,6,7}}}}, use_global_device_ids=true, to_apply=%add{ar}
  %ard = f32[] all-reduce-done(%ar)
  ROOT %t = (bf16[64,64]{{1,0}}, bf16[64,64]{{1,0}}, f32[]) tuple(%agd.1, %agd.2, %ard)
}}
"""


def test_xla_collective_latencies_by_what_the_estimate_reads():
    module = hlo.parse(_module(_sol(50.4), _sol(50.4), _sol(0.19)))
    latencies = xla_collective_latencies(module)
    starts = {i.name: i for i in module.entry.instructions}
    # the two all-gathers are one key: names and channel numbers are not what XLA's estimate reads
    assert collective_key(starts["ag.1"]) == collective_key(starts["ag.2"]) != collective_key(starts["ar"])
    assert latencies == {collective_key(starts["ag.1"]): 50.4, collective_key(starts["ar"]): 0.19}
    assert collective_key(starts["agd.1"]) is None and collective_key(starts["x"]) is None  # starts only
    # another compile of the program, other channel numbers: the same keys
    other = hlo.parse(_module("", "", "", channel=7))
    assert {collective_key(i) for i in other.entry.instructions} - {None} == set(latencies)
    # a key XLA estimated two ways is left out; a collective without an estimate adds nothing
    assert xla_collective_latencies(hlo.parse(_module(_sol(50.4), _sol(9.0), ""))) == {}


def test_the_scheduler_model_takes_xla_estimates_where_it_has_them():
    module = hlo.parse(_module(_sol(50.4), _sol(50.4), _sol(0.19)))
    starts = {i.name: i for i in module.entry.instructions}
    base = AnalyticalGpuModel("h100")
    ours = base.async_latency_us(starts["ag.1"])
    model = WithXlaCollectiveLatencies(AnalyticalGpuModel("h100"), {collective_key(starts["ag.1"]): 50.4})
    launch = base.device.kernel_launch_us
    assert model.async_latency_us(starts["ag.2"]) == pytest.approx(launch + 50.4) != pytest.approx(ours)
    assert model.async_latency_us(starts["ar"]) == pytest.approx(base.async_latency_us(starts["ar"]))  # not estimated
    assert model.hits == 1
    assert model.node_time_us(starts["x"]) == base.node_time_us(starts["x"])
    assert model.device is model.base.device  # what it does not override is the base model's


def test_step_3_passes_time_the_target_and_the_scheduler_takes_the_collective_model():
    spec = "priority-fusion{triton_softmax_priority_fusion=true},fix(multi-output-fusion{device=a100},dce)," \
           "latency-hiding-scheduler"
    passes = reemit.after_xla_passes(spec, "b200")
    assert passes[0].device == "b200" and passes[0].triton_softmax_priority_fusion
    assert passes[1].passes[0].device == "a100"  # named in the spec: kept
    assert passes[2].device == "b200"
    scheduled = reemit.after_xla_passes(spec, "b200", "b200+xla-collective-estimates-0")
    assert scheduled[2].device == "b200+xla-collective-estimates-0" and scheduled[0].device == "b200"
    # h100, the passes' default, gives the spec's own passes back
    assert [p.describe() for p in reemit.after_xla_passes(reemit.AFTER_XLA, "h100")] == \
        reemit.AFTER_XLA.split(",")


@pytest.mark.xla_gpu
@needs_compiler
def test_a_sharded_scan_is_scheduled_on_xla_collective_estimates(monkeypatch):
    """fsdp_scan_stats: XLA's estimates call its per-layer all-gather long (about 50 us) and its scalar all-reduce
    short, hlopt's model the other way round; scheduled on hlopt's model the scan body overlaps the wrong one and
    the executable is 1.011x XLA:GPU's default by XLA's estimates, on XLA's figures it is faster than XLA's."""
    from hlopt.corpus.unseen_programs import unseen_texts

    text, devices = unseen_texts(["fsdp_scan_stats"])["fsdp_scan_stats"]
    result = reemit.compile_for_gpu(text, "h100", devices)
    figures = result.report["hlopt_after_xla"]["xla_collective_estimates"]
    assert figures["collectives"] > 0 and figures["answered"] > 0
    assert result.report["hlopt_after_xla"]["device"] == "h100" and result.kept == "hlopt"
    summary = result.report["fidelity"]["summary"]
    assert summary["kept"] == summary["launches"] and summary["order_kept"]
    assert result.ratio < 1.0

    # without XLA's figures (none found in its default compile) the scheduler times collectives on hlopt's model
    monkeypatch.setattr("hlopt.cost_model.xla_estimates.xla_collective_latencies", lambda module: {})
    without = reemit.compile_for_gpu(text, "h100", devices)
    assert without.report["hlopt_after_xla"]["xla_collective_estimates"] == {"collectives": 0, "answered": 0}
    assert without.ratio > result.ratio
