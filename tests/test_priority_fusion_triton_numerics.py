"""priority-fusion growing Triton fusions: the module before and after computes the same on XLA:CPU (the Triton
fusions run there as plain loop fusions)."""

from __future__ import annotations

import pytest
from hlopt.passes.fusion.priority_fusion import PriorityFusion
from hlopt.passes.fusion.triton_tiling import is_generic_triton_fusion
from test_priority_fusion_triton import HEROLESS, LAYER_NORM, SOFTMAX, SOFTMAX_OUT, TWO_CANDIDATES, grow

from hlopt import hlo, runtime


def _as_plain_fusions(module: hlo.Module) -> hlo.Module:
    out = module.clone()
    for inst in out.instructions():
        if is_generic_triton_fusion(inst):
            inst.attrs["kind"] = "kLoop"
            inst.attrs.pop("backend_config", None)
    return out


@pytest.mark.parametrize("text", [LAYER_NORM, SOFTMAX], ids=["layer_norm", "softmax"])
def test_grown_triton_fusions_compute_the_same(text):
    before, after = hlo.parse(text), grow(text)
    result = runtime.run_and_compare(_as_plain_fusions(before), _as_plain_fusions(after), rtol=1e-4, atol=1e-4)
    assert result.ok, result


def test_heroless_triton_fusions_compute_the_same():
    before, after = hlo.parse(HEROLESS), hlo.parse(HEROLESS)
    PriorityFusion(triton_heroless_priority_fusion=True).run(after)
    assert any(is_generic_triton_fusion(i) for i in after.entry.instructions)
    result = runtime.run_and_compare(_as_plain_fusions(before), _as_plain_fusions(after), rtol=1e-5, atol=1e-5)
    assert result.ok, result


def test_multi_output_triton_fusion_computes_the_same_and_round_trips_through_xla():
    before, after = hlo.parse(SOFTMAX_OUT), hlo.parse(SOFTMAX_OUT)
    assert PriorityFusion(triton_heroless_priority_fusion=True, triton_multi_output_fusion=True).run(after)
    hlo.verify(after)
    assert any(is_generic_triton_fusion(i) and i.shape.is_tuple for i in after.entry.instructions)
    xla_text = runtime.xla_canonical_text(after.to_text())  # XLA's parser takes it
    assert runtime.xla_canonical_text(hlo.parse(xla_text).to_text()) == xla_text
    for b, a in ((before, after), (_as_plain_fusions(before), _as_plain_fusions(after))):
        result = runtime.run_and_compare(b, a, rtol=1e-5, atol=1e-5)
        assert result.ok, result


@pytest.mark.slow
@pytest.mark.xla_gpu
def test_multi_output_triton_fusion_is_xla_gpus():
    """XLA:GPU itself (jax 0.10.2, deviceless, H100) with heroless and multi-output Triton fusion on makes the same
    one fusion, with the same output tile per output; with two candidates its PriorityFusion makes none (the
    kLoop multi-output fusion there is its later MultiOutputFusion pass's)."""
    from hlopt.runtime.xla_gpu_path import xla_gpu

    if not xla_gpu.available():
        pytest.skip(f"no XLA:GPU compiler ({xla_gpu.INSTALL_COMMAND})")
    flags = ("--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true "
             "--xla_gpu_unsupported_enable_triton_multi_output_fusion=true")
    final = hlo.parse(xla_gpu.run_driver(SOFTMAX_OUT, "h100", xla_flags=flags).final_text)
    ours = hlo.parse(SOFTMAX_OUT)
    PriorityFusion(triton_heroless_priority_fusion=True, triton_multi_output_fusion=True).run(ours)

    def fusions(module: hlo.Module) -> list[tuple[int, list]]:
        out = []
        for inst in module.entry.instructions:
            if inst.opcode == "fusion":
                block = inst.backend_config_json()["fusion_backend_config"]["block_level_fusion_config"]
                out.append((len(inst.shape.elements), [t["sizes"] for t in block["output_tiles"]]))
        return out

    assert fusions(final) == fusions(ours) == [(2, [["1", "256"], ["1", "256"]])]
    final = hlo.parse(xla_gpu.run_driver(TWO_CANDIDATES, "h100", xla_flags=flags).final_text)
    assert not any(i.opcode == "fusion" and i.shape.is_tuple and str(i.attrs["kind"]) == "kCustom"
                   for i in final.entry.instructions)
