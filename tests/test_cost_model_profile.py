"""User cost models: the registry, measured profiles, and the scheduler reading them by name."""

from __future__ import annotations

import json

import pytest
from hlopt.cost_model import (
    AnalyticalGpuModel,
    MeasuredProfileModel,
    get_cost_model,
    module_time_us,
    register_cost_model,
    registered_cost_models,
    unregister_cost_model,
)
from hlopt.passes.framework.pipeline import run_pipeline
from hlopt.scheduler.costs import AnalyticalLatencyEstimator
from hlopt.scheduler.latency_hiding_scheduler import LatencyHidingScheduler
from hlopt.scheduler.simulator import simulate

from hlopt import hlo

TEXT = """HloModule m, replica_count=8

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[1024,1024], y: f32[1024,1024]) -> (f32[1024,1024], f32[1024,1024]) {
  %x = f32[1024,1024]{1,0} parameter(0)
  %y = f32[1024,1024]{1,0} parameter(1)
  %ar = f32[1024,1024]{1,0} all-reduce(%x), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%sum
  %e = f32[1024,1024]{1,0} exponential(%y)
  %t = f32[1024,1024]{1,0} tanh(%e)
  ROOT %r = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%ar, %t)
}
"""


@pytest.fixture
def profile_name():
    name = "test-measured-profile"
    yield name
    unregister_cost_model(name)


def test_registered_model_is_returned_by_name(profile_name):
    register_cost_model(profile_name, lambda: MeasuredProfileModel({"e": 100.0}, base="h100"))
    assert profile_name in registered_cost_models()
    model = get_cost_model(profile_name)
    assert isinstance(model, MeasuredProfileModel)
    assert isinstance(get_cost_model("h100"), AnalyticalGpuModel)
    m = hlo.parse(TEXT)
    analytical = module_time_us(m, "h100")
    measured = module_time_us(m, profile_name)
    e = next(i for i in m.entry.instructions if i.name == "e")
    assert measured == pytest.approx(analytical - AnalyticalGpuModel("h100").node_time_us(e) + 100.0)


def test_profile_from_cost_json_and_async_names(tmp_path, profile_name):
    m = hlo.parse(TEXT)
    run_pipeline(m, "async-collective-creator")
    start = next(i for i in m.entry.instructions if i.opcode == "all-reduce-start")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"instructions": [{"name": start.name.replace("-start", "", 1), "time_us": 777.0},
                                                 {"name": "t", "time_us": 5.0}]}))
    model = MeasuredProfileModel.from_json(path)
    assert model.async_latency_us(start) == 777.0 and model.node_time_us(start) == 0.0
    t = next(i for i in m.entry.instructions if i.name == "t")
    assert model.node_time_us(t) == 5.0 and model.hits >= 2


def test_scheduler_uses_the_registered_model(profile_name):
    # Measured: the all-reduce takes 500 us, the compute 50 + 50 us; the analytical model disagrees.
    register_cost_model(profile_name, lambda: MeasuredProfileModel({"ar": 500.0, "e": 50.0, "t": 50.0}))
    m = hlo.parse(TEXT)
    run_pipeline(m, f"async-collective-creator,latency-hiding-scheduler{{device={profile_name}}}")
    sim = simulate(m.entry, AnalyticalLatencyEstimator(profile_name),
                   limits=LatencyHidingScheduler(device=profile_name).kind_limits())
    assert sim.makespan_us == pytest.approx(500.0, rel=0.02)  # the compute hides under the collective


def test_bad_models_are_refused(tmp_path, profile_name):
    register_cost_model(profile_name, lambda: object())
    with pytest.raises(TypeError, match="node_time_us"):
        get_cost_model(profile_name)
    with pytest.raises(ValueError, match=">= 0"):
        MeasuredProfileModel({"x": -1.0})
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected an object"):
        MeasuredProfileModel.from_json(bad)


def test_fusion_runs_with_a_user_model_without_a_device_spec(profile_name):
    class UnitModel:
        def node_time_us(self, inst):
            return 1.0

        def async_latency_us(self, start):
            return 10.0

    register_cost_model(profile_name, UnitModel)
    m = hlo.parse(TEXT)
    run_pipeline(m, f"priority-fusion{{device={profile_name}}}")
    assert any(i.opcode == "fusion" for i in m.entry.instructions)
