"""How long each of XLA's HLO passes took (`run_driver(..., pass_times=True)`, `parse_pass_metadata`): what
`benchmarks/passes_vs_xla.py` compares hlopt's passes with."""

from __future__ import annotations

import pytest
from hlopt.runtime.xla_gpu_path import xla_gpu

#: an HloModuleMetadataProto as XLA dumps it (`--xla_dump_module_metadata`), a nested message included
METADATA = """canonical_module_id: 0
module_group_name: "jit_step"
pass_metadata {
  pass_id: 1
  pass_name: "pipeline-start"
  pipeline_name: "fusion"
  start_timestamp_usec: 1000
  end_timestamp_usec: 1003
}
pass_metadata {
  pass_id: 2
  pass_name: "priority-fusion"
  pipeline_name: "fusion"
  module_changed: true
  custom_metadata {
    type_url: "type.googleapis.com/xla.Something"
    value: "{not a field}"
  }
  start_timestamp_usec: 1003
  end_timestamp_usec: 2501003
}
pass_metadata {
  pass_id: 3
  pass_name: "cse"
  pipeline_name: "fusion"
  start_timestamp_usec: 2501010
  end_timestamp_usec: 2501510
}
"""

TEXT = """HloModule softplus_rows

add_f32 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  a = f32[128,512] parameter(0)
  e = f32[128,512] exponential(a)
  one = f32[] constant(1)
  ones = f32[128,512] broadcast(one), dimensions={}
  p = f32[128,512] add(e, ones)
  l = f32[128,512] log(p)
  zero = f32[] constant(0)
  ROOT r = f32[128] reduce(l, zero), dimensions={1}, to_apply=add_f32
}
"""


def test_parse_pass_metadata_reads_each_entry_in_order():
    times = xla_gpu.parse_pass_metadata(METADATA)
    assert [(t.pipeline, t.name, t.changed) for t in times] == [
        ("fusion", "pipeline-start", False), ("fusion", "priority-fusion", True), ("fusion", "cse", False)]
    assert times[1].seconds == pytest.approx(2.5)
    assert times[2].seconds == pytest.approx(0.0005)


def test_parse_pass_metadata_names_the_entry_without_a_timestamp():
    broken = METADATA.replace("  end_timestamp_usec: 2501510\n", "")
    with pytest.raises(ValueError, match=r"line 22: pass_metadata entry without end_timestamp_usec"):
        xla_gpu.parse_pass_metadata(broken)


def test_pass_times_keeps_its_own_dump_folder():
    with pytest.raises(ValueError, match="--xla_dump_to"):  # before the compiler is looked for
        xla_gpu.run_driver(TEXT, "h100", xla_flags="--xla_dump_to=/tmp/mine", pass_times=True)


@pytest.mark.xla_gpu
@pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")
def test_run_driver_reports_xla_pass_times():
    result = xla_gpu.run_driver(TEXT, "h100", pass_times=True)
    names = [t.name for t in result.pass_times]
    assert "priority-fusion" in names and "layout-assignment" in names
    fusion = next(t for t in result.pass_times if t.name == "priority-fusion")
    assert fusion.pipeline == "fusion" and fusion.changed  # exponential, add, log into the reduce: fused
    assert all(0 <= t.seconds <= result.compile_seconds for t in result.pass_times)
    assert xla_gpu.run_driver(TEXT, "h100").pass_times == []  # asked for only


@pytest.mark.xla_gpu
@pytest.mark.skipif(not xla_gpu.available(), reason=f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")
def test_passes_vs_xla_benchmark_pairs_the_fusion_passes():
    from benchmarks.passes_vs_xla import measure

    got = measure(TEXT, "h100", 1)
    rows = {r["pass"]: r for r in got["rows"]}
    assert rows["priority-fusion"]["xla_pass"] == "priority-fusion" and rows["priority-fusion"]["xla_runs"] == 1
    assert rows["priority-fusion"]["runs"] == 1
    assert got["xla_compile"] > 0 and got["hlopt_passes"] > 0
    assert all(r["pass"] != "simplification" for r in got["xla_top"])  # a nested pipeline: counted by its passes
