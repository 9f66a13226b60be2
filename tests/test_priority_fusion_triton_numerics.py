"""priority-fusion growing Triton fusions: the module before and after computes the same on XLA:CPU (the Triton
fusions run there as plain loop fusions)."""

from __future__ import annotations

from hlopt.passes.triton_softmax_priority_fusion import triton_row_geometry
from test_priority_fusion_triton import LAYER_NORM, grow

from hlopt import hlo, runtime


def _as_plain_fusions(module: hlo.Module) -> hlo.Module:
    out = module.clone()
    for inst in out.instructions():
        if triton_row_geometry(inst) is not None:
            inst.attrs["kind"] = "kLoop"
            inst.attrs.pop("backend_config", None)
    return out


def test_grown_layer_norm_computes_the_same():
    before, after = hlo.parse(LAYER_NORM), grow()
    result = runtime.run_and_compare(_as_plain_fusions(before), _as_plain_fusions(after), rtol=1e-4, atol=1e-4)
    assert result.ok, result
