"""cost_model: devices and their files, the kernel roofline against XLA:GPU's own estimates, launch grids,
collectives, the CostModel interface, `hlopt cost`."""

from __future__ import annotations

import json

import pytest
from hlopt.cli.main import main
from hlopt.cost_model import (
    DEVICES,
    AnalyticalGpuModel,
    CostModel,
    DeviceSpec,
    collective_estimate,
    collective_time_us,
    get_device,
    load_device,
    module_cost,
)
from hlopt.cost_model.devices import _BUILTIN, device_from_txtpb
from hlopt.cost_model.kernel import KernelModel, gemm_tile, read_time_s
from hlopt.cost_model.launch import launch_dims
from hlopt.cost_model.txtpb import parse_txtpb, repeated

from hlopt import hlo

H100 = get_device("h100")

# ------------------------------------------------------------------------------------------ devices


def test_txtpb_reader():
    msg = parse_txtpb("""
        # a comment
        name: "gpu \\"x\\""  # trailing comment
        count: 3
        rate: 1.5
        flag: true
        kind: ACCELERATED
        sub { a: 1 b { c: 2 } }
        sub: { a: 3 }
        vals: [1, 2, 3]
        rate_infos { key: 4 value { clock_rate_ghz: 1.98 units_per_core: 64 ops_per_clock: 1 } }
    """)
    assert msg["name"] == 'gpu "x"' and msg["count"] == 3 and msg["rate"] == 1.5 and msg["flag"] is True
    assert msg["kind"] == "ACCELERATED" and msg["vals"] == [1, 2, 3]
    assert [s["a"] for s in repeated(msg, "sub")] == [1, 3] and msg["sub"][0]["b"]["c"] == 2
    assert repeated(msg, "rate_infos")[0]["value"]["units_per_core"] == 64 and repeated(msg, "missing") == []


@pytest.mark.parametrize("name", DEVICES)
def test_builtin_devices(name):
    d = get_device(name)
    assert d.sm_count > 100 and d.hbm_bandwidth > 2e12 and d.l2_bytes > 40e6
    assert d.tensor_flops("bf16") > 10 * d.fp32_flops and d.tensor_flops("f32") < d.tensor_flops("bf16")
    if name != "a100":
        assert d.tensor_flops("f8e4m3fn") == pytest.approx(2 * d.tensor_flops("bf16"), rel=0.01)
    assert d.nvlink_bandwidth >= 300e9 and d.network_bandwidth >= 25e9 and d.gpus_per_node == 8
    assert d.nvls == (name != "a100")
    if name == "b200":
        assert d.tensor_flops("f4e2m1fn") == pytest.approx(2 * d.tensor_flops("f8e4m3fn"), rel=0.01)


@pytest.mark.parametrize("name", DEVICES)
def test_builtin_devices_pass_pydantic_validation(name):
    """Built-in specs are built without pydantic: what pydantic makes of their fields is the same spec, with
    the same types (floats where the field is a float)."""
    d = get_device(name)
    checked = DeviceSpec.model_validate(d.model_dump())
    assert checked == d
    assert {k: type(v) for k, v in vars(checked).items()} == {k: type(v) for k, v in vars(d).items()}
    assert all(type(v) is float for v in d.tensor_tflops.values())
    assert all(type(r.clock_ghz) is float and type(r.ops_per_clock) is float for r in d.scalar_rates.values())


def test_device_spec_validation_names_the_field():
    fields = get_device("h100").model_dump()
    with pytest.raises(ValueError, match="sm_count"):
        DeviceSpec.model_validate({**fields, "sm_count": 0})
    with pytest.raises(ValueError, match="warp_size"):
        DeviceSpec.model_validate({**fields, "warp_size": 32})
    with pytest.raises(ValueError, match="ops_per_clock"):
        DeviceSpec.model_validate({**fields, "scalar_rates": {"f32": {"clock_ghz": 1.0, "units_per_sm": 4,
                                                                       "ops_per_clock": -1}}})
    copy = get_device("h100").model_copy(update={"gpus_per_node": 4})
    assert copy.gpus_per_node == 4 and get_device("h100").gpus_per_node == 8


def test_devices_read_from_xla_protos(shared_dir):
    for name, file in (("h100", "h100_sxm.txtpb"), ("b200", "b200.txtpb"), ("a100", "a100_sxm_80.txtpb")):
        d = device_from_txtpb((shared_dir / "gpu_specs" / file).read_text(), name,
                              {"tensor_tflops": {"bf16": 1.0}, "nvlink_bandwidth": 1e11, "network_bandwidth": 1e10})
        ref = _BUILTIN[name]
        assert (d.sm_count, d.clock_ghz, d.hbm_bandwidth) == (ref["core_count"], ref["clock_rate_ghz"],
                                                                ref["memory_bandwidth"])
    h100 = get_device("h100")
    assert h100.tensor_tflops["bf16"] == pytest.approx(989, rel=0.01)  # from the proto's matrix units
    assert h100.op_profile == "sm_90" and h100.description == "NVIDIA H100 80GB HBM3"


def test_user_device_files(tmp_path):
    (tmp_path / "big.json").write_text(json.dumps({"base": "h100", "name": "h100x16", "gpus_per_node": 16}))
    d = get_device(str(tmp_path / "big.json"))
    assert d.name == "h100x16" and d.gpus_per_node == 16 and d.sm_count == 132
    (tmp_path / "mine.yaml").write_text("base: a100\nname: mine\nhbm_bandwidth: 1.0e12\n")
    assert load_device(tmp_path / "mine.yaml").hbm_bandwidth == 1e12
    (tmp_path / "tiny.txtpb").write_text("""gpu_device_info { core_count: 10 fpus_per_core: 64
        memory_bandwidth: 100000000000 l2_cache_size: 1048576 clock_rate_ghz: 1.0 device_memory_size: 1000000000
        shared_memory_per_core: 65536 cuda_compute_capability { major: 8 minor: 6 } }""")
    (tmp_path / "tiny.json").write_text(json.dumps({"network_bandwidth": 1e9}))
    tiny = load_device(tmp_path / "tiny.txtpb")
    assert (tiny.name, tiny.sm_count, tiny.op_profile, tiny.network_bandwidth) == ("tiny", 10, "sm_86", 1e9)
    (tmp_path / "bad.json").write_text(json.dumps({"base": "h100", "sm_count": -1}))
    with pytest.raises(ValueError):
        load_device(tmp_path / "bad.json")
    with pytest.raises(ValueError):
        get_device("tpu")


# ------------------------------------------------------------------------ kernels against XLA:GPU

XLA_FUSIONS = [  # (label, XLA default estimate in us, the fusion as XLA:GPU emitted it for an H100)
    ("o1.input_reduce_fusion", 1.258, """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %b = f32[] parameter(1)
  %a = f32[] parameter(0)
  ROOT %s.1 = f32[] add(%a, %b)
}

%fused_reduce (param_0: f32[1024,1024]) -> f32[1024] {
  %param_0 = f32[1024,1024]{1,0} parameter(0)
  %z_2 = f32[] constant(0)
  ROOT %r.2 = f32[1024]{0} reduce(%param_0, %z_2), dimensions={1}, to_apply=%add
}

ENTRY e {
  p0 = f32[1024,1024]{1,0} parameter(0)
  ROOT f = f32[1024]{0} fusion(p0), kind=kInput, calls=fused_reduce
}"""),
    ("big_colsum.input_reduce_fusion", 20.20475, """HloModule m

%region_0.1 (reduce_sum.3: f32[], reduce_sum.4: f32[]) -> f32[] {
  %reduce_sum.4 = f32[] parameter(1)
  %reduce_sum.3 = f32[] parameter(0)
  ROOT %reduce_sum.5.0 = f32[] add(%reduce_sum.3, %reduce_sum.4)
}

%fused_reduce (param_0: f32[4096,4096]) -> f32[4096] {
  %param_0 = f32[4096,4096]{1,0} parameter(0)
  %constant_1_1 = f32[] constant(0)
  ROOT %reduce_sum.7.1 = f32[4096]{0} reduce(%param_0, %constant_1_1), dimensions={0}, to_apply=%region_0.1
}

ENTRY e {
  p0 = f32[4096,4096]{1,0} parameter(0)
  ROOT f = f32[4096]{0} fusion(p0), kind=kInput, calls=fused_reduce
}"""),
    ("big_transpose_add.input_transpose_fusion", 60.144, """HloModule m

%fused_transpose (param_0.1: f32[4096,4096], param_1.1: f32[4096,4096]) -> f32[4096,4096] {
  %param_1.1 = f32[4096,4096]{1,0} parameter(1)
  %transpose.1.1 = f32[4096,4096]{1,0} transpose(%param_1.1), dimensions={1,0}
  %param_0.1 = f32[4096,4096]{1,0} parameter(0)
  ROOT %add.1.1 = f32[4096,4096]{1,0} add(%transpose.1.1, %param_0.1)
}

ENTRY e {
  p0 = f32[4096,4096]{1,0} parameter(0)
  p1 = f32[4096,4096]{1,0} parameter(1)
  ROOT f = f32[4096,4096]{1,0} fusion(p0, p1), kind=kInput, calls=fused_transpose
}"""),
    ("big_layernorm_bf16.input_reduce_fusion", 11.27075, """HloModule m

%region_0.1.clone (reduce_sum.2: f32[], reduce_sum.6: f32[]) -> f32[] {
  %reduce_sum.6 = f32[] parameter(1)
  %reduce_sum.2 = f32[] parameter(0)
  ROOT %reduce_sum.7.0 = f32[] add(%reduce_sum.2, %reduce_sum.6)
}

%fused_reduce (param_0.23: f32[4096], param_1.25: bf16[4096,4096]) -> f32[4096] {
  %param_1.25 = bf16[4096,4096]{1,0} parameter(1)
  %convert_element_type.10.4 = f32[4096,4096]{1,0} convert(%param_1.25)
  %param_0.23 = f32[4096]{0} parameter(0)
  %sub.3.3 = f32[4096,4096]{1,0} broadcast(%param_0.23), dimensions={0}
  %sub.4.3 = f32[4096,4096]{1,0} subtract(%convert_element_type.10.4, %sub.3.3)
  %square.0.1 = f32[4096,4096]{1,0} multiply(%sub.4.3, %sub.4.3)
  %constant_15_2 = f32[] constant(0)
  ROOT %reduce_sum.1.1 = f32[4096]{0} reduce(%square.0.1, %constant_15_2), dimensions={1}, to_apply=%region_0.1.clone
}

ENTRY e {
  p0 = f32[4096]{0} parameter(0)
  p1 = bf16[4096,4096]{1,0} parameter(1)
  ROOT f = f32[4096]{0} fusion(p0, p1), kind=kInput, calls=fused_reduce
}"""),
    ("c_16_16_16.wrapped_concatenate", 0.203, """HloModule m

%wrapped_concatenate_computation (param_0: f32[16,16], param_1: f32[16,16]) -> f32[16,32] {
  %param_0 = f32[16,16]{1,0} parameter(0)
  %param_1 = f32[16,16]{1,0} parameter(1)
  ROOT %c.2 = f32[16,32]{1,0} concatenate(%param_0, %param_1), dimensions={1}
}

ENTRY e {
  p0 = f32[16,16]{1,0} parameter(0)
  p1 = f32[16,16]{1,0} parameter(1)
  ROOT f = f32[16,32]{1,0} fusion(p0, p1), kind=kLoop, calls=wrapped_concatenate_computation
}"""),
    ("random_threefry.loop_slice_xor_fusion", 0.53725, """HloModule m

%fused_slice_xor (param_0.626: u32[2], param_1.743: u32[2]) -> (u32[], u32[1], u32[1], u32[], u32[1,1]) {
  %param_0.626 = u32[2]{0} parameter(0)
  %slice.128.2 = u32[1]{0} slice(%param_0.626), slice={[0:1]}
  %bitcast.18.6 = u32[] bitcast(%slice.128.2)
  %bitcast.19.18 = u32[2,1]{1,0} bitcast(%param_0.626)
  %param_1.743 = u32[2]{0} parameter(1)
  %bitcast.20.11 = u32[2,1]{1,0} bitcast(%param_1.743)
  %stack.2.11 = u32[2,2]{1,0} concatenate(%bitcast.19.18, %bitcast.20.11), dimensions={1}
  %slice.50.7 = u32[1,2]{1,0} slice(%stack.2.11), slice={[0:1], [0:2]}
  %bitcast.21.7 = u32[2]{0} bitcast(%slice.50.7)
  %slice.43.7 = u32[1]{0} slice(%bitcast.21.7), slice={[1:2]}
  %bitcast.22.6 = u32[] bitcast(%slice.43.7)
  %xor.62.3 = u32[] xor(%bitcast.18.6, %bitcast.22.6)
  %constant_139_2 = u32[] constant(466688986)
  %xor.63.1 = u32[] xor(%xor.62.3, %constant_139_2)
  %slice.51.3.clone.1 = u32[1,2]{1,0} slice(%stack.2.11), slice={[1:2], [0:2]}
  %bitcast.24.1.clone.1 = u32[2]{0} bitcast(%slice.51.3.clone.1)
  %slice.53.1.clone.1 = u32[1]{0} slice(%bitcast.24.1.clone.1), slice={[1:2]}
  %slice.58.5.clone.1 = u32[1,1]{1,0} slice(%bitcast.19.18), slice={[1:2], [0:1]}
  %bitcast.23.9.clone.1 = u32[] bitcast(%slice.58.5.clone.1)
  %bitcast.25.9.clone.1 = u32[] bitcast(%slice.53.1.clone.1)
  %xor.65.3.clone.1 = u32[] xor(%bitcast.23.9.clone.1, %bitcast.25.9.clone.1)
  %xor.66.1.clone.1 = u32[] xor(%xor.65.3.clone.1, %constant_139_2)
  ROOT %tuple.75 = (u32[], u32[1]{0}, u32[1]{0}, u32[], u32[1,1]{1,0}) tuple(%xor.63.1, %slice.43.7, %slice.53.1.clone.1, %xor.66.1.clone.1, %slice.58.5.clone.1)
}

ENTRY e {
  p0 = u32[2]{0} parameter(0)
  p1 = u32[2]{0} parameter(1)
  ROOT f = (u32[], u32[1]{0}, u32[1]{0}, u32[], u32[1,1]{1,0}) fusion(p0, p1), kind=kLoop, calls=fused_slice_xor
}"""),
    ("big_gelu.loop_multiply_fusion", 125.624, """HloModule m

%fused_multiply (param_0.14: bf16[4096,4096]) -> bf16[4096,4096] {
  %param_0.14 = bf16[4096,4096]{1,0} parameter(0)
  %integer_pow.2.3 = bf16[4096,4096]{1,0} multiply(%param_0.14, %param_0.14)
  %integer_pow.3.3 = bf16[4096,4096]{1,0} multiply(%integer_pow.2.3, %param_0.14)
  %constant_7_1 = bf16[] constant(0.04468)
  %mul.9.1 = bf16[4096,4096]{1,0} broadcast(%constant_7_1), dimensions={}
  %mul.10.1 = bf16[4096,4096]{1,0} multiply(%integer_pow.3.3, %mul.9.1)
  %add.4.1 = bf16[4096,4096]{1,0} add(%param_0.14, %mul.10.1)
  %constant_6_1 = bf16[] constant(0.7969)
  %mul.8.1 = bf16[4096,4096]{1,0} broadcast(%constant_6_1), dimensions={}
  %mul.11.1 = bf16[4096,4096]{1,0} multiply(%add.4.1, %mul.8.1)
  %convert.11 = f32[4096,4096]{1,0} convert(%mul.11.1)
  %tanh.1.9 = f32[4096,4096]{1,0} tanh(%convert.11)
  %convert.1.7 = bf16[4096,4096]{1,0} convert(%tanh.1.9)
  %constant_5_1 = bf16[] constant(1)
  %add.3.1 = bf16[4096,4096]{1,0} broadcast(%constant_5_1), dimensions={}
  %add.5.5 = bf16[4096,4096]{1,0} add(%convert.1.7, %add.3.1)
  %constant_4_1 = bf16[] constant(0.5)
  %mul.7.1 = bf16[4096,4096]{1,0} broadcast(%constant_4_1), dimensions={}
  %mul.12.3 = bf16[4096,4096]{1,0} multiply(%add.5.5, %mul.7.1)
  ROOT %mul.13.1 = bf16[4096,4096]{1,0} multiply(%param_0.14, %mul.12.3)
}

ENTRY e {
  p0 = bf16[4096,4096]{1,0} parameter(0)
  ROOT f = bf16[4096,4096]{1,0} fusion(p0), kind=kLoop, calls=fused_multiply
}"""),
    ("big_scatter.input_scatter_fusion", 42.55125, """HloModule m

%region_0.1 (scatter-add.2: f32[], scatter-add.3: f32[]) -> f32[] {
  %scatter-add.3 = f32[] parameter(1)
  %scatter-add.2 = f32[] parameter(0)
  ROOT %add.3.0 = f32[] add(%scatter-add.2, %scatter-add.3)
}

%fused_scatter (param_0: f32[4096,4096], param_1.1: f32[512,4096], param_2.4: s32[512]) -> f32[4096,4096] {
  %param_0 = f32[4096,4096]{1,0} parameter(0)
  %param_2.4 = s32[512]{0} parameter(2)
  %constant_3_1 = s32[] constant(0)
  %lt.2.1 = s32[512]{0} broadcast(%constant_3_1), dimensions={}
  %lt.3.1 = pred[512]{0} compare(%param_2.4, %lt.2.1), direction=LT
  %constant_2_1 = s32[] constant(4096)
  %add.4.1 = s32[512]{0} broadcast(%constant_2_1), dimensions={}
  %add.5.1 = s32[512]{0} add(%param_2.4, %add.4.1)
  %select_n.1.1 = s32[512]{0} select(%lt.3.1, %add.5.1, %param_2.4)
  %bitcast.3 = s32[512,1]{1,0} bitcast(%select_n.1.1)
  %param_1.1 = f32[512,4096]{1,0} parameter(1)
  %bitcast.1.1 = f32[512,1,4096]{2,1,0} bitcast(%param_1.1)
  ROOT %scatter-add.5.1 = f32[4096,4096]{1,0} scatter(%param_0, %bitcast.3, %bitcast.1.1), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%region_0.1
}

ENTRY e {
  p0 = f32[4096,4096]{1,0} parameter(0)
  p1 = f32[512,4096]{1,0} parameter(1)
  p2 = s32[512]{0} parameter(2)
  ROOT f = f32[4096,4096]{1,0} fusion(p0, p1, p2), kind=kInput, calls=fused_scatter
}"""),
    ("transformer_train_step.fusion.65", 0.0215, """HloModule m

%region_2.3 (reduce_max.3: f32[], reduce_max.4: f32[]) -> f32[] {
  %reduce_max.4 = f32[] parameter(1)
  %reduce_max.3 = f32[] parameter(0)
  ROOT %reduce_max.5.0 = f32[] maximum(%reduce_max.3, %reduce_max.4)
}

%region_0.1.clone.1 (reduce_sum.6: f32[], reduce_sum.7: f32[]) -> f32[] {
  %reduce_sum.7 = f32[] parameter(1)
  %reduce_sum.6 = f32[] parameter(0)
  ROOT %reduce_sum.8.0 = f32[] add(%reduce_sum.6, %reduce_sum.7)
}

%region_0.1.clone.8 (reduce_sum.42: f32[], reduce_sum.43: f32[]) -> f32[] {
  %reduce_sum.43 = f32[] parameter(1)
  %reduce_sum.42 = f32[] parameter(0)
  ROOT %reduce_sum.44.0 = f32[] add(%reduce_sum.42, %reduce_sum.43)
}

%fused_computation.47 (param_0.114: f32[2,4,4], param_1.145: f32[2,4,4]) -> f32[2,4,4] {
  %param_1.145 = f32[2,4,4]{2,1,0} parameter(1)
  %param_0.114 = f32[2,4,4]{2,1,0} parameter(0)
  %constant_82 = f32[] constant(-inf)
  %reduce_max.27 = f32[2,4]{1,0} reduce(%param_0.114, %constant_82), dimensions={2}, to_apply=%region_2.3
  %sub.86 = f32[2,4,4]{2,1,0} broadcast(%reduce_max.27), dimensions={0,1}
  %sub.85 = f32[2,4,4]{2,1,0} subtract(%param_0.114, %sub.86)
  %exp.1.21 = f32[2,4,4]{2,1,0} exponential(%sub.85)
  %constant_37_7 = f32[] constant(0)
  %reduce_sum.114.5 = f32[2,4]{1,0} reduce(%exp.1.21, %constant_37_7), dimensions={2}, to_apply=%region_0.1.clone.1
  %div.23.2 = f32[2,4,4]{2,1,0} broadcast(%reduce_sum.114.5), dimensions={0,1}
  %div.34.1 = f32[2,4,4]{2,1,0} divide(%param_1.145, %div.23.2)
  %constant_25_2 = f32[] constant(1)
  %broadcast.44.1 = f32[2,4]{1,0} broadcast(%constant_25_2), dimensions={}
  %mul.0.5 = f32[2,4]{1,0} multiply(%reduce_sum.114.5, %reduce_sum.114.5)
  %div.0.7 = f32[2,4]{1,0} divide(%broadcast.44.1, %mul.0.5)
  %mul.112.7 = f32[2,4,4]{2,1,0} broadcast(%div.0.7), dimensions={0,1}
  %mul.113.7 = f32[2,4,4]{2,1,0} multiply(%param_1.145, %mul.112.7)
  %mul.114.7 = f32[2,4,4]{2,1,0} multiply(%mul.113.7, %exp.1.21)
  %reduce_sum.124.5 = f32[2,4]{1,0} reduce(%mul.114.7, %constant_37_7), dimensions={2}, to_apply=%region_0.1.clone.8
  %neg.0.3 = f32[2,4]{1,0} negate(%reduce_sum.124.5)
  %broadcast_in_dim.25.1 = f32[2,4,4]{2,1,0} broadcast(%neg.0.3), dimensions={0,1}
  %add_any.18.1 = f32[2,4,4]{2,1,0} add(%div.34.1, %broadcast_in_dim.25.1)
  %mul.115.3 = f32[2,4,4]{2,1,0} multiply(%add_any.18.1, %exp.1.21)
  %constant_2_1 = f32[] constant(0.25)
  %broadcast.2.1 = f32[2,4,4]{2,1,0} broadcast(%constant_2_1), dimensions={}
  ROOT %multiply.13.1 = f32[2,4,4]{2,1,0} multiply(%mul.115.3, %broadcast.2.1)
}

ENTRY e {
  p0 = f32[2,4,4]{2,1,0} parameter(0)
  p1 = f32[2,4,4]{2,1,0} parameter(1)
  ROOT f = f32[2,4,4]{2,1,0} fusion(p0, p1), kind=kCustom, calls=fused_computation.47, backend_config={"fusion_backend_config":{"kind":"__triton","block_level_fusion_config":{"num_warps":"1","output_tiles":[{"sizes":["1","1","1"]}],"num_ctas":1,"num_stages":1,"is_tma_allowed":false,"is_warp_specialization_allowed":false,"waves_per_eu":0}}}
}"""),
    ("shmap_all_to_all.loop_broadcast_fusion", 0.004, """HloModule m

%fused_broadcast (param_0.1: f32[1,8]) -> f32[8,8] {
  %param_0.1 = f32[1,8]{1,0} parameter(0)
  %bitcast.2 = f32[8]{0} bitcast(%param_0.1)
  ROOT %broadcast.4.1 = f32[8,8]{1,0} broadcast(%bitcast.2), dimensions={1}
}

ENTRY e {
  p0 = f32[1,8]{1,0} parameter(0)
  ROOT f = f32[8,8]{1,0} fusion(p0), kind=kLoop, calls=fused_broadcast
}"""),
]


@pytest.mark.parametrize("label,xla_us,text", XLA_FUSIONS, ids=[f[0] for f in XLA_FUSIONS])
def test_kernel_matches_xla_default_model(label, xla_us, text):
    """XLA:GPU's GpuPerformanceModel estimates (deviceless H100, recorded) of its own fusions."""
    est = KernelModel(H100).estimate(hlo.parse(text).entry.root)
    assert est.exec_us == pytest.approx(xla_us, rel=0.05)


#: (element type, input dims, permutation, XLA:GPU's emitter, its default estimate in us) of a fusion
#: exponential(transpose(p)), as XLA:GPU (jaxlib 0.10.2, deviceless H100) fused and rated it alone.
XLA_TRANSPOSES = [
    ("f32", (32, 3, 3, 3), (1, 2, 3, 0), "transpose", 0.13775),  # normalized: [32,27] -> [27,32]
    ("f32", (3, 3, 3, 32), (3, 0, 1, 2), "transpose", 0.13775),
    ("f32", (32, 1, 5, 48), (3, 1, 2, 0), "transpose", 0.12275),  # size-1 dimensions dropped
    ("f32", (32, 32, 2), (1, 0, 2), "transpose", 0.32625),  # minor kept, 64 bits of it: one 32x32x2 tile
    ("f32", (64, 64, 2), (1, 0, 2), "transpose", 0.32625),
    ("bf16", (2, 64, 4), (1, 0, 2), "transpose", 0.00825),
    ("f32", (2, 48, 40), (1, 0, 2), "loop", 0.0205),  # minor kept but 1280 bits wide
    ("f32", (4, 64, 64), (1, 0, 2), "loop", 0.04),
    ("bf16", (64, 128), (1, 0), "transpose", 0.1355),  # the packed transpose: 64x64 tiles, 2 blocks
    ("bf16", (16, 1, 40, 4), (2, 1, 0, 3), "transpose", 0.04225),
    ("bf16", (6, 256, 64), (0, 2, 1), "transpose", 0.18925),
    ("f32", (16, 16), (1, 0), "transpose", 0.04075),
    ("f32", (128, 128), (1, 0), "transpose", 0.16375),
    ("f32", (4, 16, 32), (0, 2, 1), "transpose", 0.0815),
    ("f32", (8, 64), (1, 0), "loop", 0.0205),
    ("f32", (1000, 6), (1, 0), "loop", 0.12275),
]


@pytest.mark.parametrize("dtype,dims,perm,emitter,xla_us", XLA_TRANSPOSES)
def test_transpose_emitter_and_grid_as_xla(dtype, dims, perm, emitter, xla_us):
    """XLA's transpose emitters on the normalized transpose (GetNormalizedLogicalTransposeShape): which
    transposes they tile and their grids, checked by XLA:GPU's own estimate of the fusion."""
    src = f"{dtype}[{','.join(map(str, dims))}]"
    out = f"{dtype}[{','.join(str(dims[p]) for p in perm)}]"
    m = hlo.parse(f"""HloModule m

%fused (p: {src}) -> {out} {{
  %p = {src} parameter(0)
  %t = {out} transpose(%p), dimensions={{{','.join(map(str, perm))}}}
  ROOT %e = {out} exponential(%t)
}}

ENTRY %main (a: {src}) -> {out} {{
  %a = {src} parameter(0)
  ROOT %f = {out} fusion(%a), kind={"kInput" if emitter == "transpose" else "kLoop"}, calls=%fused
}}
""")
    est = KernelModel(H100).estimate(m.entry.root)
    assert est.launch.emitter == emitter
    assert est.exec_us == pytest.approx(xla_us, rel=0.05)


def _module(body: str, params: str, result: str, extra: str = "") -> hlo.Module:
    return hlo.parse(f"HloModule t\n\n{extra}ENTRY %e ({params}) -> {result} {{\n{body}\n}}\n")


ADD = "%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n" \
      "  ROOT %s = f32[] add(%a, %b)\n}\n\n"


def test_roofline_bounds_and_devices():
    m = _module("""  %a = bf16[4096,4096] parameter(0)
  %b = bf16[4096,4096] parameter(1)
  %x = f32[4194304] parameter(2)
  %d = bf16[4096,4096] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %y = f32[4194304] add(%x, %x)
  %s = f32[8] slice(%x), slice={[0:8]}
  ROOT %t = (bf16[4096,4096], f32[4194304], f32[8]) tuple(%d, %y, %s)""",
                "a: bf16[4096,4096], b: bf16[4096,4096], x: f32[4194304]", "(bf16[4096,4096], f32[4194304], f32[8])")
    model = AnalyticalGpuModel("h100")
    dot, add, small = (model.instruction_time(m.entry.instruction(n)) for n in ("d", "y", "s"))
    assert dot.kernel.unit == "tensor-core:bf16" and dot.kernel.gemm_class == "large"
    assert 139 < dot.kernel.compute_us < 160  # 2*4096^3 flop at 989 TFLOP/s is 139 us, plus waves
    assert dot.time_us < 260  # tile re-reads through L2 cost about as much (cuBLAS: ~200 us)
    assert add.bound == "memory" and 10 < add.time_us < 12  # 32 MiB over 3.35 TB/s, plus the launch
    assert small.bound == "latency" and small.time_us == pytest.approx(1.0, abs=0.01)
    assert AnalyticalGpuModel("b200").instruction_time(m.entry.instruction("d")).time_us < dot.time_us / 2
    assert AnalyticalGpuModel("a100").instruction_time(m.entry.instruction("y")).time_us > add.time_us
    assert model.instruction_time(m.entry.instruction("t")).bound == "none"


def test_gemm_waves_quantize_over_sms():
    def gemm(m_rows: int):
        mod = _module(f"""  %a = bf16[{m_rows},8192] parameter(0)
  %b = bf16[8192,256] parameter(1)
  ROOT %d = bf16[{m_rows},256] dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}""",
                      f"a: bf16[{m_rows},8192], b: bf16[8192,256]", f"bf16[{m_rows},256]")
        return KernelModel(H100).estimate(mod.entry.root)

    _, tm, tn = gemm_tile(128 * 66, 256, 8192, 2)
    cols = 256 // tn
    full, one_more = gemm(tm * 132 // cols), gemm(tm * (132 // cols + 1))  # one wave on 132 SMs; then two
    assert full.launch.blocks == 132 and one_more.compute_us == pytest.approx(2 * full.compute_us, rel=0.01)
    assert gemm_tile(16, 4096, 4096, 2) == ("small", 16, 64)  # a skinny GEMM: tiles clamped to the problem


def test_launch_grids():
    m = _module("""  %x = f32[1024,4096] parameter(0)
  %z = f32[] constant(0)
  %e = f32[1024,4096] exponential(%x)
  %rows = f32[1024] reduce(%x, %z), dimensions={1}, to_apply=%add
  %cols = f32[4096] reduce(%x, %z), dimensions={0}, to_apply=%add
  %few = f32[100] slice(%rows), slice={[0:100]}
  ROOT %t = (f32[1024,4096], f32[1024], f32[4096], f32[100]) tuple(%e, %rows, %cols, %few)""",
                "x: f32[1024,4096]", "(f32[1024,4096], f32[1024], f32[4096], f32[100])", ADD)
    dims = {n: launch_dims(m.entry.instruction(n), H100) for n in ("e", "rows", "cols", "few")}
    assert (dims["e"].emitter, dims["e"].threads_per_block, dims["e"].blocks) == ("loop", 128, 1024 * 4096 // 512)
    assert dims["rows"].emitter == "reduction" and dims["rows"].blocks * dims["rows"].threads_per_block >= 1024
    assert dims["cols"].emitter == "reduction" and dims["cols"].threads_per_block == 1024
    assert (dims["few"].blocks, dims["few"].threads_per_block) == (1, 100)


def test_cache_reuse_and_coalescing():
    once = read_time_s(H100, 1000, 1e6, 1e6)
    thrice = read_time_s(H100, 1000, 1e6, 3e6)
    assert once < thrice < 3 * once  # re-reads of a small operand come from L2/L1
    assert read_time_s(H100, 1000, 1e9, 1e9, 4, coalesced=False) > 10 * read_time_s(H100, 1000, 1e9, 1e9)
    assert read_time_s(H100, 1, 1e6, 1e6) > 50 * once  # one block cannot saturate HBM


# -------------------------------------------------------------------------------------- collectives


def test_collective_algorithms_and_links():
    small = collective_estimate("all-reduce", 1e3, 8, H100)
    assert small.bound == "latency" and small.protocol == "LL" and 5 < small.time_us < 30
    big = collective_estimate("all-reduce", 1e9, 8, H100)
    assert big.algorithm == "nvls" and big.bound == "network"
    assert big.time_us > 1e9 / H100.nvlink_bandwidth * 1e6  # at least the buffer over one link
    a100 = collective_estimate("all-reduce", 1e9, 8, get_device("a100"))
    assert a100.algorithm == "ring" and a100.time_us > big.time_us
    cross = collective_estimate("all-reduce", 1e9, 16, H100)
    assert cross.link == "network" and cross.time_us > big.time_us
    assert collective_time_us("all-gather", 1e9, 8, H100) < big.time_us
    assert collective_time_us("reduce-scatter", 1e9, 8, H100) < big.time_us
    assert collective_time_us("all-to-all", 1e8, 16, H100) > collective_time_us("all-to-all", 1e8, 8, H100)
    p2p_far = collective_estimate("collective-permute", 1e8, 2, H100, cross_node=True)
    p2p_near = collective_estimate("collective-permute", 1e8, 2, H100, cross_node=False)
    assert p2p_far.link == "network" and p2p_far.time_us > 5 * p2p_near.time_us
    nvshmem = collective_estimate("all-reduce", 1e4, 8, H100, library="auto")
    assert nvshmem.protocol == "nvshmem" and nvshmem.time_us < small.time_us
    assert collective_time_us("all-reduce", 1e9, 1, H100) == H100.kernel_launch_us
    with pytest.raises(ValueError):
        collective_estimate("all-shuffle", 1, 2, H100)


def test_collectives_in_modules_use_replica_groups():
    m = _module("""  %x = f32[1048576] parameter(0)
  %in_node = f32[1048576] all-reduce(%x), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %across = f32[1048576] all-reduce(%x), replica_groups={{0,8}}, to_apply=%add
  %start = f32[1048576] all-reduce-start(%x), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %done = f32[1048576] all-reduce-done(%start)
  %perm = f32[1048576] collective-permute(%x), source_target_pairs={{0,8},{8,0}}
  ROOT %t = (f32[1048576], f32[1048576], f32[1048576], f32[1048576]) tuple(%in_node, %across, %done, %perm)""",
                "x: f32[1048576]", "(f32[1048576], f32[1048576], f32[1048576], f32[1048576])", ADD)
    model = AnalyticalGpuModel("h100", num_devices=16)
    get = m.entry.instruction
    in_node, across = model.collective(get("in_node")), model.collective(get("across"))
    assert (in_node.group_size, in_node.link, across.group_size, across.link) == (8, "nvlink", 2, "network")
    assert model.collective(get("perm")).link == "network"
    assert model.node_time_us(get("start")) == 0.0 and model.node_time_us(get("done")) == 0.0
    assert model.async_latency_us(get("start")) == pytest.approx(in_node.time_us)
    assert model.node_time_us(get("in_node")) == pytest.approx(in_node.time_us)


# ------------------------------------------------------------------------------------- the interface


class ConstantModel:
    """A user model: every node 2 us, every async pair 10 us."""

    def node_time_us(self, inst) -> float:
        return 2.0

    def async_latency_us(self, start) -> float:
        return 10.0


def test_cost_model_protocol_and_loops():
    assert isinstance(AnalyticalGpuModel("h100"), CostModel) and isinstance(ConstantModel(), CostModel)
    m = hlo.parse("""HloModule w

%body (t: (s32[], f32[4096])) -> (s32[], f32[4096]) {
  %t = (s32[], f32[4096]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4096] get-tuple-element(%t), index=1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  %y = f32[4096] tanh(%x)
  ROOT %o = (s32[], f32[4096]) tuple(%j, %y)
}

%cond (t: (s32[], f32[4096])) -> pred[] {
  %t = (s32[], f32[4096]) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(10)
  ROOT %c = pred[] compare(%i, %n), direction=LT
}

ENTRY %e (x: f32[4096]) -> f32[4096] {
  %x = f32[4096] parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[4096]) tuple(%z, %x)
  %loop = (s32[], f32[4096]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[4096] get-tuple-element(%loop), index=1
}
""")
    model = AnalyticalGpuModel("h100")
    body = model.computation_time_us(m.computation("body"))
    cond = model.computation_time_us(m.computation("cond"))
    assert body > 2.0 and model.module_time_us(m) == pytest.approx(10 * body + 11 * cond)
    assert module_cost(m).flops == 2  # XLA counts the body once: one add, one compare (tanh: a transcendental)
    assert module_cost(m).transcendentals == 4096


def test_quick_roofline_agrees_with_node_times():
    m = _module("""  %x = f32[16777216] parameter(0)
  %e = f32[16777216] exponential(%x)
  ROOT %n = f32[16777216] negate(%e)""", "x: f32[16777216]", "f32[16777216]")
    model = AnalyticalGpuModel("h100")
    times = {}
    for name in ("e", "n"):
        inst = m.entry.instruction(name)
        cost = model.instruction_time(inst).cost
        times[name] = (model.kernel_time_us(cost.flops, cost.transcendentals, cost.bytes_accessed),
                       model.node_time_us(inst))
    assert times["n"][0] == pytest.approx(times["n"][1], rel=0.05)
    assert times["e"][1] < times["e"][0] < 2 * times["e"][1]  # an unknown transcendental: the mean cost
    assert model.kernel_time_us(0, 0, 3.35232e12) == pytest.approx(1e6 + 1.0, rel=1e-3)
    e = m.entry.instruction("e")
    assert model.weighted_kernel_time_us(model.gpu_flops(e), 2 * 4 * 16777216) == pytest.approx(times["e"][1], rel=0.05)


# ----------------------------------------------------------------------------------------- the CLI


def test_cost_cli_json_schema(capsys, tmp_path):
    from hlopt.corpus.programs import corpus_texts
    from hlopt.runtime._xla import cost_analysis

    entry = next(e for e in corpus_texts() if e.id == "transformer_train_step")
    path = tmp_path / "t.hlo"
    path.write_text(entry.text)
    assert main(["cost", str(path), "--device", "h100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"device", "total", "instructions"} and report["device"] == "h100"
    assert set(report["total"]) == {"flops", "transcendentals", "bytes_accessed", "opaque_instructions", "time_us"}
    rows = report["instructions"]
    assert rows and all(set(r) == {"name", "opcode", "computation", "flops", "bytes_accessed", "time_us", "bound"}
                        for r in rows)
    assert {r["bound"] for r in rows} <= {"compute", "memory", "latency", "network"}
    xla = cost_analysis(entry.text)
    assert report["total"]["flops"] == xla["flops"] and report["total"]["bytes_accessed"] == xla["bytes accessed"]
    assert report["total"]["time_us"] >= max(r["time_us"] for r in rows)


def test_cost_cli_table_and_device_file(capsys, tmp_path):
    path = tmp_path / "m.hlo"
    path.write_text(_module("""  %x = f32[1024,1024] parameter(0)
  ROOT %e = f32[1024,1024] exponential(%x)""", "x: f32[1024,1024]", "f32[1024,1024]").to_text())
    spec = tmp_path / "slow.json"
    spec.write_text(json.dumps({"base": "h100", "name": "slow-h100", "hbm_bandwidth": 1e11}))
    assert main(["cost", str(path), "--device", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "slow-h100" in out and "module total" in out and "exponential" in out
    with pytest.raises(SystemExit):
        main(["cost", str(path), "--device", "nosuch"])


def test_estimates_remembered_by_structure_equal_fresh_ones():
    """`KernelModel.estimate` remembers a fusion's, a dot's and an elementwise op's estimate by its structure
    (`_BY_STRUCTURE`): each remembered one equals the estimate made afresh, also where the same structure comes
    again with an operand read twice (another key), and for a loop-emitted transpose of a broadcast after one of
    a parameter (not keyed: its coalescing reads the chain producing its operand)."""
    m = _module("""  %x = f32[64,4,256] parameter(0)
  %y = f32[64,4,256] parameter(1)
  %z = f32[4,256] parameter(2)
  %a1 = f32[64,4,256] add(%x, %y)
  %a2 = f32[64,4,256] add(%y, %x)
  %a3 = f32[64,4,256] add(%x, %x)
  %c = f32[64,4,256] copy(%a3)
  %n = f32[64,4,256] negate(%c)
  %b = f32[64,4,256] broadcast(%z), dimensions={1,2}
  %t1 = f32[64,256,4] transpose(%x), dimensions={0,2,1}
  %t2 = f32[64,256,4] transpose(%b), dimensions={0,2,1}
  ROOT %r = (f32[64,4,256], f32[64,4,256], f32[64,4,256], f32[64,256,4], f32[64,256,4]) tuple(%a1, %a2, %n, %t1, %t2)""",
                "x: f32[64,4,256], y: f32[64,4,256], z: f32[4,256]",
                "(f32[64,4,256], f32[64,4,256], f32[64,4,256], f32[64,256,4], f32[64,256,4])")
    shared = KernelModel(H100)
    for inst in m.entry.instructions:
        assert shared.estimate(inst) == KernelModel(H100).estimate(inst), inst.name  # a model of its own: afresh
    a1, a3, t1, t2 = (shared.estimate(m.entry.instruction(n)) for n in ("a1", "a3", "t1", "t2"))
    assert a3.bytes_read < a1.bytes_read  # x read once: another key than two operands
    assert t1.launch.emitter == "loop" and t2.memory_us < t1.memory_us  # a broadcast's transpose reads coalesced


def test_node_time_of_instructions_that_launch_nothing_is_their_instruction_time():
    """`AnalyticalGpuModel.node_time_us` answers 0 at once for opcodes that launch no kernel and are no collective
    (`_NO_TIME`): the same as their `instruction_time`, which every other instruction's node time is."""
    m = _module("""  %x = f32[512,1024] parameter(0)
  %c = f32[] constant(2)
  %b = f32[512,1024] broadcast(%c), dimensions={}
  %m = f32[512,1024] multiply(%x, %b)
  %bc = f32[524288] bitcast(%m)
  %t = (f32[524288], f32[512,1024]) tuple(%bc, %x)
  %g = f32[524288] get-tuple-element(%t), index=0
  ROOT %r = (f32[524288], f32[]) tuple(%g, %c)""", "x: f32[512,1024]", "(f32[524288], f32[])")
    model = AnalyticalGpuModel("h100")
    times = {i.name: model.node_time_us(i) for i in m.entry.instructions}
    assert times == {i.name: AnalyticalGpuModel("h100").instruction_time(i).time_us for i in m.entry.instructions}
    assert times["m"] > 0 and times["b"] > 0 and not any(times[n] for n in ("x", "c", "bc", "t", "g", "r"))


def test_a_map_is_costed_afresh_after_a_computation_its_computation_calls_changes():
    """A `map`'s estimate is not remembered by structure: its key holds its computation's number, which does not
    see an edit of a computation that one calls. Two maps alike until such an edit are costed apart after it,
    whichever comes first."""
    text = """HloModule m

c1 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}

c2 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}

a1 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT k = f32[] call(x, y), to_apply=c1
}

a2 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT k = f32[] call(x, y), to_apply=c2
}

ENTRY e {
  p = f32[1048576] parameter(0)
  q = f32[1048576] parameter(1)
  m1 = f32[1048576] map(p, q), dimensions={0}, to_apply=a1
  m2 = f32[1048576] map(p, q), dimensions={0}, to_apply=a2
  ROOT t = (f32[1048576], f32[1048576]) tuple(m1, m2)
}
"""
    m = hlo.parse(text)
    m1, m2 = m.entry.instruction("m1"), m.entry.instruction("m2")
    first = AnalyticalGpuModel("h100")
    assert first.node_time_us(m1) == first.node_time_us(m2)
    c2 = next(c for c in m.computations if c.name == "c2")
    a, b = c2.parameters
    old = c2.root
    c2.set_root(c2.add(hlo.Instruction("power", old.shape, [a, b], name="pw")))
    c2.remove(old)
    both = AnalyticalGpuModel("h100")
    t1, t2 = both.node_time_us(m1), both.node_time_us(m2)
    assert t2 == AnalyticalGpuModel("h100").node_time_us(m2) > t1
