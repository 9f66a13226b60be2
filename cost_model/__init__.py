"""cost_model: an analytical GPU cost model (H100, H200, B200, A100) for kernels and collectives.

- `devices`: pydantic device specs, from XLA's GPU target-config protos plus datasheet figures.
- `analysis`: flops / transcendentals / bytes per instruction with XLA's HloCostAnalysis semantics
  (`CostAnalysis`), and XLA:GPU's variant (`GpuCostAnalysis`).
- `kernel` / `launch`: a kernel's time, in the manner of XLA:GPU's GpuPerformanceModel.
- `collectives`: NCCL-style collective times over NVLink and the network.
- `model`: the `CostModel` protocol and `AnalyticalGpuModel`, which fusion and the scheduler use.
- `profile`: user models by name (`register_cost_model`) and `MeasuredProfileModel` (measured times).
"""

from hlopt.cost_model.analysis import Cost, CostAnalysis, GpuCostAnalysis, instruction_cost, module_cost
from hlopt.cost_model.collectives import CollectiveEstimate, collective_estimate
from hlopt.cost_model.devices import DEVICES, DeviceSpec, get_device, load_device
from hlopt.cost_model.kernel import KernelEstimate, KernelModel
from hlopt.cost_model.model import (
    AnalyticalGpuModel,
    CostModel,
    InstructionTime,
    collective_time_us,
    get_cost_model,
    module_time_us,
)
from hlopt.cost_model.profile import (
    MeasuredProfileModel,
    register_cost_model,
    registered_cost_models,
    unregister_cost_model,
)

__all__ = [
    "Cost", "CostAnalysis", "GpuCostAnalysis", "instruction_cost", "module_cost", "CollectiveEstimate",
    "collective_estimate", "DEVICES", "DeviceSpec", "get_device", "load_device", "KernelEstimate", "KernelModel",
    "AnalyticalGpuModel", "CostModel", "InstructionTime", "collective_time_us", "get_cost_model", "module_time_us",
    "MeasuredProfileModel", "register_cost_model", "registered_cost_models", "unregister_cost_model",
]
