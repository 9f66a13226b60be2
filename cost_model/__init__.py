"""cost_model: an analytical GPU cost model (H100, H200, B200, A100) for kernels and collectives."""

from cost_model.analysis import Cost, instruction_cost
from cost_model.devices import DEVICES, DeviceSpec, get_device, load_device
from cost_model.model import (
    AnalyticalGpuModel,
    CostModel,
    InstructionTime,
    collective_time_us,
    get_cost_model,
    module_time_us,
)

__all__ = [
    "Cost", "instruction_cost", "DEVICES", "DeviceSpec", "get_device", "load_device", "AnalyticalGpuModel",
    "CostModel", "InstructionTime", "collective_time_us", "get_cost_model", "module_time_us",
]
