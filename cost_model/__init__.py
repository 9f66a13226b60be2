"""cost_model: an analytical GPU cost model (H100, H200, B200, A100) for kernels and collectives.

- `devices`: pydantic device specs, from XLA's GPU target-config protos plus datasheet figures.
- `analysis`: flops / transcendentals / bytes per instruction with XLA's HloCostAnalysis semantics
  (`CostAnalysis`), and XLA:GPU's variant (`GpuCostAnalysis`).
- `kernel` / `launch`: a kernel's time, in the manner of XLA:GPU's GpuPerformanceModel.
- `collectives`: NCCL-style collective times over NVLink and the network.
- `model`: the `CostModel` protocol and `AnalyticalGpuModel`, which fusion and the scheduler use.
- `profile`: user models by name (`register_cost_model`) and `MeasuredProfileModel` (measured times).
- `estimator`: the one per-instruction time interface (`LatencyEstimator`: `node_cost`, `latency`) and its
  implementations (analytical, XLA's approximate units, measured profile); `xla_estimates`: XLA's own
  estimates read off a compiled module (`runtime.xla_gpu_path.xla_gpu.XlaEstimateLatency` adds loop simulation).
- `streams`: the one machine (a compute stream, async collective streams) that the scheduler's simulator and
  the collective-pipeliner's gate both run on (`StreamMachine`, `claim_slot`).
"""

from hlopt.cost_model.analysis import Cost, CostAnalysis, GpuCostAnalysis, instruction_cost, module_cost
from hlopt.cost_model.collectives import CollectiveEstimate, collective_estimate
from hlopt.cost_model.devices import DEVICES, DeviceSpec, get_device, load_device
from hlopt.cost_model.estimator import (
    AnalyticalLatencyEstimator,
    ApproximateLatencyEstimator,
    LatencyEstimator,
    MeasuredLatencyEstimator,
    estimator_for,
)
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
from hlopt.cost_model.streams import StreamMachine, claim_slot

__all__ = [
    "Cost", "CostAnalysis", "GpuCostAnalysis", "instruction_cost", "module_cost", "CollectiveEstimate",
    "collective_estimate", "DEVICES", "DeviceSpec", "get_device", "load_device", "KernelEstimate", "KernelModel",
    "AnalyticalGpuModel", "CostModel", "InstructionTime", "collective_time_us", "get_cost_model", "module_time_us",
    "MeasuredProfileModel", "register_cost_model", "registered_cost_models", "unregister_cost_model",
    "LatencyEstimator", "AnalyticalLatencyEstimator", "ApproximateLatencyEstimator", "MeasuredLatencyEstimator",
    "estimator_for", "StreamMachine", "claim_slot",
]
