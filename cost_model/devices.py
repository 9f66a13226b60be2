"""GPU device specs (pydantic), loadable from XLA's GPU target-config text protos.

Figures not in XLA's protos (tensor-core throughput, interconnect) come from vendor datasheets:
- H100 SXM: NVIDIA H100 datasheet (dense: 989 TFLOP/s bf16/f16, 1979 f8, 494 tf32); NVLink 4: 900 GB/s
  bidirectional per GPU (450 GB/s each way), 8 GPUs per HGX node; ConnectX-7 400 Gb/s per GPU.
- H200: same compute as H100 SXM, 4.8 TB/s HBM3e (datasheet); NVLink 4 as H100.
- B200: NVIDIA DGX B200 datasheet (dense: 2250 TFLOP/s bf16, 4500 f8, 9000 f4, 1100 tf32); NVLink 5:
  1.8 TB/s bidirectional (900 GB/s each way); 8 GPUs per node; 400 Gb/s network.
- A100 SXM 80GB: A100 datasheet (dense: 312 TFLOP/s bf16/f16, 156 tf32, no f8); NVLink 3: 600 GB/s
  bidirectional (300 GB/s each way); 8 GPUs per node; 200 Gb/s HDR network.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DeviceSpec", "get_device", "load_device", "parse_txtpb", "DEVICES", "SPEC_DIR"]

SPEC_DIR = Path(__file__).resolve().parents[2] / "shared" / "gpu_specs"


class DeviceSpec(BaseModel):
    """What the cost model needs of a GPU."""

    model_config = ConfigDict(extra="forbid")
    name: str
    sm_count: int = Field(gt=0)
    clock_ghz: float = Field(gt=0)
    fp32_lanes_per_sm: int = Field(gt=0)
    hbm_bandwidth: float = Field(gt=0, description="bytes/s")
    l2_bytes: int = Field(gt=0)
    shared_memory_per_sm: int = Field(gt=0)
    memory_bytes: int = Field(gt=0)
    tensor_tflops: dict[str, float] = Field(description="dense TFLOP/s per input type (bf16, f16, f8, f4, tf32)")
    nvlink_bandwidth: float = Field(gt=0, description="bytes/s per GPU, one direction")
    gpus_per_node: int = Field(8, gt=0)
    network_bandwidth: float = Field(gt=0, description="bytes/s per GPU across nodes")
    nvlink_latency_us: float = 3.0
    network_latency_us: float = 10.0
    kernel_launch_us: float = 1.0

    @property
    def fp32_flops(self) -> float:
        """FP32 (non-tensor-core) flop/s: 2 flops per FMA lane per cycle."""
        return 2.0 * self.sm_count * self.fp32_lanes_per_sm * self.clock_ghz * 1e9

    def tensor_flops(self, dtype: str) -> float:
        """Dense tensor-core flop/s for inputs of `dtype` (f32 inputs use tf32)."""
        key = {"bf16": "bf16", "f16": "f16", "f32": "tf32", "f64": "f64"}.get(dtype)
        if key is None:
            key = "f4" if dtype.startswith("f4") else "f8" if dtype.startswith("f8") else "bf16"
        tflops = self.tensor_tflops.get(key) or self.tensor_tflops.get("bf16", 1.0)
        return tflops * 1e12


def parse_txtpb(text: str) -> dict:
    """The scalar `key: value` fields of a text proto (nested messages flattened, first value wins)."""
    out: dict = {}
    for m in re.finditer(r"^\s*([A-Za-z_]\w*)\s*:\s*([^\s{]+)\s*$", text, re.M):
        key, value = m.group(1), m.group(2)
        if key in out:
            continue
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value.strip('"')
    return out


_EXTRA = {
    "h100": dict(tensor_tflops={"bf16": 989, "f16": 989, "f8": 1979, "tf32": 494, "f64": 67},
                 nvlink_bandwidth=450e9, network_bandwidth=50e9),
    "h200": dict(tensor_tflops={"bf16": 989, "f16": 989, "f8": 1979, "tf32": 494, "f64": 67},
                 nvlink_bandwidth=450e9, network_bandwidth=50e9),
    "b200": dict(tensor_tflops={"bf16": 2250, "f16": 2250, "f8": 4500, "f4": 9000, "tf32": 1100, "f64": 40},
                 nvlink_bandwidth=900e9, network_bandwidth=50e9),
    "a100": dict(tensor_tflops={"bf16": 312, "f16": 312, "tf32": 156, "f64": 19.5},
                 nvlink_bandwidth=300e9, network_bandwidth=25e9),
}
_FILES = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb", "b200": "b200.txtpb", "a100": "a100_sxm_80.txtpb"}
#: Fallback figures when XLA's protos are not at hand (values from those protos).
_BUILTIN = {
    "h100": dict(core_count=132, clock_rate_ghz=1.98, fpus_per_core=128, memory_bandwidth=3352320000000,
                 l2_cache_size=52428800, shared_memory_per_core=233472, device_memory_size=84942979072),
    "h200": dict(core_count=132, clock_rate_ghz=1.98, fpus_per_core=128, memory_bandwidth=4800000000000,
                 l2_cache_size=52428800, shared_memory_per_core=233472, device_memory_size=150754820096),
    "b200": dict(core_count=148, clock_rate_ghz=1.965, fpus_per_core=128, memory_bandwidth=7672320000000,
                 l2_cache_size=132644864, shared_memory_per_core=233472, device_memory_size=191514411008),
    "a100": dict(core_count=108, clock_rate_ghz=1.41, fpus_per_core=64, memory_bandwidth=2039040000000,
                 l2_cache_size=41943040, shared_memory_per_core=167936, device_memory_size=85100068864),
}


def _from_fields(name: str, f: dict, extra: dict) -> DeviceSpec:
    return DeviceSpec(
        name=name, sm_count=f["core_count"], clock_ghz=f["clock_rate_ghz"], fp32_lanes_per_sm=f["fpus_per_core"],
        hbm_bandwidth=float(f["memory_bandwidth"]), l2_bytes=f["l2_cache_size"],
        shared_memory_per_sm=f["shared_memory_per_core"], memory_bytes=f["device_memory_size"], **extra,
    )


@cache
def get_device(name: str) -> DeviceSpec:
    """A built-in device (h100, h200, b200, a100), read from XLA's proto when ../shared has it."""
    key = name.lower().replace("_sxm", "").replace("-", "")
    key = {"h100sxm": "h100", "a100sxm80": "a100", "a100_80": "a100"}.get(key, key)
    if key not in _EXTRA:
        path = Path(name)
        if path.exists():
            return load_device(path)
        raise ValueError(f"unknown device {name!r} (h100, h200, b200, a100, or a spec file)")
    proto = SPEC_DIR / _FILES[key]
    fields = parse_txtpb(proto.read_text()) if proto.exists() else _BUILTIN[key]
    return _from_fields(key, fields, _EXTRA[key])


def load_device(path: str | Path) -> DeviceSpec:
    """A user device: JSON/YAML with DeviceSpec's fields, or an XLA txtpb plus a `.json` of the extras."""
    p = Path(path)
    text = p.read_text()
    if p.suffix == ".txtpb":
        extra_path = p.with_suffix(".json")
        extra = json.loads(extra_path.read_text()) if extra_path.exists() else dict(_EXTRA["h100"])
        return _from_fields(p.stem, parse_txtpb(text), extra)
    if p.suffix in (".yaml", ".yml"):
        import yaml

        return DeviceSpec.model_validate(yaml.safe_load(text))
    return DeviceSpec.model_validate_json(text)


DEVICES = ("h100", "h200", "b200", "a100")
