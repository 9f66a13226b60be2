"""GPU device specs, read from XLA's GPU target-config text protos where they are at hand.

Built-in devices: `h100` (H100 SXM 80GB), `h200`, `b200`, `a100` (A100 SXM 80GB). The kernel-level figures
(SM count, clock, FP32 lanes per SM, HBM bandwidth, L2, shared memory, per-dtype tensor-core and scalar
rates) come from XLA's `xla/backends/gpu/target_config/specs/*.txtpb`, shipped as package data in
`hlopt/cost_model/specs/`; when those files are absent the same values are built in (`_BUILTIN`). Figures the protos lack come from
vendor documents, cited where they are set below. A user adds a device with `load_device(path)`: a JSON
or YAML file of `DeviceSpec` fields (optionally `"base": "h100"` plus overrides), or an XLA `.txtpb`
(optionally with a sidecar `.json`/`.yaml` of the figures the proto lacks).

`DeviceSpec` and `UnitRate` are dataclasses whose field constraints pydantic checks (`annotated_types`
markers, unknown fields refused): every spec built from a user's file or proto is validated with pydantic
(`DeviceSpec.model_validate`). The built-in specs are built from the package's own data without it, so that a
command that only needs a built-in device does not import pydantic (a test validates each of them).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar

from annotated_types import Gt
from hlopt.cost_model.txtpb import parse_txtpb, repeated

__all__ = ["DeviceSpec", "UnitRate", "get_device", "load_device", "device_from_txtpb", "DEVICES", "SPEC_DIR",
           "parse_txtpb", "canonical_dtype"]

SPEC_DIR = Path(__file__).resolve().parent / "specs"
DEVICES = ("h100", "h200", "b200", "a100")

#: XLA PrimitiveType enum values (xla/xla_data.proto) -> hlopt dtype names.
PRIMITIVE_TYPES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64", 10: "f16",
    11: "f32", 12: "f64", 15: "c64", 16: "bf16", 18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2", 28: "f8e4m3", 29: "f8e3m4",
    30: "s1", 31: "u1", 32: "f4e2m1fn", 33: "f8e8m0fnu",
}


Positive = Gt(0)


class _Validated:
    """What the device dataclasses share: pydantic validation on demand, pydantic-style dump and copy, and the
    float fields held as floats (as pydantic's validation leaves them) however a spec was built."""

    #: pydantic's configuration of a dataclass it validates: unknown fields are errors.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}
    _floats: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._floats = tuple(name for name, hint in typing.get_type_hints(cls).items() if hint is float)

    def __post_init__(self) -> None:
        for name in self._floats:
            setattr(self, name, float(getattr(self, name)))

    @classmethod
    def model_validate(cls, fields: dict[str, Any]) -> Any:
        """A spec from `fields`, checked with pydantic (a `pydantic.ValidationError`, a ValueError, names each
        field that is missing, unknown, of the wrong type or out of range)."""
        from pydantic import TypeAdapter

        return TypeAdapter(cls).validate_python(_plain(fields))

    def model_dump(self) -> dict[str, Any]:
        """The fields as plain data (nested specs as dicts)."""
        return dataclasses.asdict(self)

    def model_copy(self, update: dict[str, Any] | None = None) -> Any:
        """A copy with the fields in `update` replaced (not validated, as pydantic's `model_copy`)."""
        return dataclasses.replace(self, **(update or {}))


def _plain(value: Any) -> Any:
    """`value` with the dataclass specs in it turned into dicts, so that pydantic checks their fields too."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass
class UnitRate(_Validated):
    """Throughput of one execution unit kind for one dtype (XLA's ExecutionUnitDescription.RateInfo)."""

    clock_ghz: Annotated[float, Positive]
    units_per_sm: Annotated[int, Positive]
    ops_per_clock: Annotated[float, Positive]  # FMAs per unit per clock

    def flops(self, sm_count: int) -> float:
        """Peak flop/s (an FMA counts 2)."""
        return 2.0 * self.ops_per_clock * self.units_per_sm * sm_count * self.clock_ghz * 1e9


@dataclass
class DeviceSpec(_Validated):
    """What the cost model needs of a GPU. Bandwidths in bytes/s, latencies in microseconds."""

    name: str
    sm_count: Annotated[int, Positive]
    clock_ghz: Annotated[float, Positive]
    fp32_lanes_per_sm: Annotated[int, Positive]
    hbm_bandwidth: Annotated[float, Positive]
    l2_bytes: Annotated[int, Positive]
    shared_memory_per_sm: Annotated[int, Positive]
    memory_bytes: Annotated[int, Positive]
    #: Dense tensor-core TFLOP/s per input dtype.
    tensor_tflops: dict[str, float]
    #: NVLink bytes/s per GPU, one direction.
    nvlink_bandwidth: Annotated[float, Positive]
    #: Inter-node bytes/s per GPU (its NIC).
    network_bandwidth: Annotated[float, Positive]
    description: str = ""
    #: CUDA compute capability, e.g. 9.0.
    compute_capability: str = "9.0"
    #: Per-op cycle table (cost_model.op_profiles).
    op_profile: str = "sm_90"
    threads_per_warp: int = 32
    threads_per_block_limit: int = 1024
    threads_per_sm_limit: int = 2048
    #: XLA's assumption for data "much smaller than L1" (DeviceDescription::l1_cache_size_per_SM).
    l1_bytes_per_sm: int = 2048
    shared_memory_per_block: int = 49152
    #: XLA's AdjustBandwidth: an SM issues one 32-byte memory transaction per clock.
    memory_transactions_per_clock: int = 32
    #: XLA's DRAM->L2 transaction size (two 32-byte sectors), for the uncoalesced-read waste factor.
    dram_to_l2_transaction_bytes: int = 64
    scalar_rates: dict[str, UnitRate] = field(default_factory=dict)
    #: Per-op cycle overrides.
    op_cycles: dict[str, dict[str, int]] = field(default_factory=dict)
    nvlink_links: int = 18
    gpus_per_node: Annotated[int, Positive] = 8
    #: NVLink SHARP (in-switch reductions) available.
    nvls: bool = False
    #: Per-step latency over NVLink (NCCL LL protocol).
    nvlink_latency_us: float = 0.6
    #: Per-step latency over the network (NCCL LL ring).
    network_latency_us: float = 2.7
    kernel_launch_us: float = 1.0
    collective_launch_us: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tensor_tflops = {k: float(v) for k, v in self.tensor_tflops.items()}

    @property
    def fp32_flops(self) -> float:
        """FP32 (non-tensor-core) flop/s: 2 flops per FMA lane per cycle."""
        return 2.0 * self.sm_count * self.fp32_lanes_per_sm * self.clock_ghz * 1e9

    def tensor_flops(self, dtype: str) -> float:
        """Dense tensor-core flop/s for inputs of `dtype` (f32 inputs run as tf32)."""
        key = canonical_dtype(dtype)
        tflops = self.tensor_tflops.get(key)
        if tflops is None:
            tflops = self.tensor_tflops.get("bf16", self.fp32_flops / 1e12)
        return tflops * 1e12

    def scalar_flops(self, dtype: str) -> float:
        """Non-tensor-core flop/s for `dtype` (FP32 lanes when the spec has no rate for it)."""
        rate = self.scalar_rates.get(dtype)
        return rate.flops(self.sm_count) if rate is not None else self.fp32_flops

    @property
    def block_bandwidth(self) -> float:
        """Bytes/s one thread block can move (XLA: one transaction per clock per SM)."""
        return self.clock_ghz * 1e9 * self.memory_transactions_per_clock


def canonical_dtype(dtype: str) -> str:
    """The tensor-core rate key of an input dtype: bf16, f16, f8, f4, tf32 (for f32), f64, s8."""
    if dtype in ("bf16", "f16", "f64"):
        return dtype
    if dtype == "f32":
        return "tf32"
    if dtype.startswith("f8"):
        return "f8"
    if dtype.startswith("f4"):
        return "f4"
    if dtype in ("s8", "u8", "s4", "u4"):
        return "s8"
    return dtype


# ----------------------------------------------------------------------------------------- built-ins

#: Figures XLA's protos do not carry, with their sources.
_EXTRA: dict[str, dict[str, Any]] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): dense 989 TFLOP/s bf16/f16, 1979 f8/int8, 494 tf32,
    # 67 f64; NVLink 4: 900 GB/s bidirectional = 18 links x 25 GB/s each way; HGX/DGX H100: 8 GPUs on
    # third-generation NVSwitch (NVLink SHARP, "NVLS"), one ConnectX-7 400 Gb/s (50 GB/s) NIC per GPU.
    "h100": dict(description="NVIDIA H100 SXM5 80GB", compute_capability="9.0", op_profile="sm_90",
                 tensor_tflops={"bf16": 989, "f16": 989, "f8": 1979, "s8": 1979, "tf32": 494, "f64": 67},
                 nvlink_bandwidth=450e9, nvlink_links=18, gpus_per_node=8, nvls=True, network_bandwidth=50e9),
    # NVIDIA H200 datasheet: H100's compute, 141 GB HBM3e at 4.8 TB/s; same NVLink 4 / HGX topology.
    "h200": dict(description="NVIDIA H200 SXM 141GB", compute_capability="9.0", op_profile="sm_90",
                 tensor_tflops={"bf16": 989, "f16": 989, "f8": 1979, "s8": 1979, "tf32": 494, "f64": 67},
                 nvlink_bandwidth=450e9, nvlink_links=18, gpus_per_node=8, nvls=True, network_bandwidth=50e9),
    # NVIDIA DGX B200 datasheet (per GPU, dense): 2.25 PFLOP/s bf16, 4.5 f8, 9 f4, 1.1 tf32, 40 TFLOP/s f64;
    # NVLink 5: 1.8 TB/s bidirectional = 18 links x 50 GB/s each way; 8 GPUs per node on NVSwitch (NVLS);
    # 400 Gb/s ConnectX-7 per GPU.
    "b200": dict(description="NVIDIA B200 180GB", compute_capability="10.0", op_profile="sm_100",
                 tensor_tflops={"bf16": 2250, "f16": 2250, "f8": 4500, "s8": 4500, "f4": 9000, "tf32": 1100,
                                "f64": 40},
                 nvlink_bandwidth=900e9, nvlink_links=18, gpus_per_node=8, nvls=True, network_bandwidth=50e9),
    # NVIDIA A100 datasheet (SXM4 80GB, dense): 312 TFLOP/s bf16/f16, 624 int8, 156 tf32, 19.5 f64; no f8;
    # NVLink 3: 600 GB/s bidirectional = 12 links x 25 GB/s each way; HGX A100: 8 GPUs on second-generation
    # NVSwitch (no in-switch reductions); DGX A100: 200 Gb/s HDR InfiniBand (25 GB/s) per GPU.
    "a100": dict(description="NVIDIA A100 SXM4 80GB", compute_capability="8.0", op_profile="sm_80",
                 tensor_tflops={"bf16": 312, "f16": 312, "s8": 624, "tf32": 156, "f64": 19.5},
                 nvlink_bandwidth=300e9, nvlink_links=12, gpus_per_node=8, nvls=False, network_bandwidth=25e9),
}
_FILES = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb", "b200": "b200.txtpb", "a100": "a100_sxm_80.txtpb"}
#: The protos' kernel-level values, used when the packaged specs are not there.
_BUILTIN: dict[str, dict[str, Any]] = {
    "h100": dict(core_count=132, clock_rate_ghz=1.98, fpus_per_core=128, memory_bandwidth=3352320000000,
                 l2_cache_size=52428800, shared_memory_per_core=233472, device_memory_size=84942979072),
    "h200": dict(core_count=132, clock_rate_ghz=1.98, fpus_per_core=128, memory_bandwidth=4800000000000,
                 l2_cache_size=52428800, shared_memory_per_core=233472, device_memory_size=150754820096),
    "b200": dict(core_count=148, clock_rate_ghz=1.965, fpus_per_core=128, memory_bandwidth=7672320000000,
                 l2_cache_size=132644864, shared_memory_per_core=233472, device_memory_size=191514411008),
    "a100": dict(core_count=108, clock_rate_ghz=1.41, fpus_per_core=64, memory_bandwidth=2039040000000,
                 l2_cache_size=41943040, shared_memory_per_core=167936, device_memory_size=85100068864),
}
_ALIASES = {"h100sxm": "h100", "h100_sxm": "h100", "a100sxm80": "a100", "a100_sxm_80": "a100", "a10080": "a100"}


def _rates(desc: dict[str, Any] | None) -> dict[str, UnitRate]:
    out: dict[str, UnitRate] = {}
    for entry in repeated(desc or {}, "rate_infos"):
        dtype = PRIMITIVE_TYPES.get(entry.get("key"))
        value = entry.get("value", {})
        if dtype is None or not value.get("units_per_core"):
            continue
        out[dtype] = UnitRate(clock_ghz=value["clock_rate_ghz"], units_per_sm=value["units_per_core"],
                              ops_per_clock=value["ops_per_clock"])
    return out


def _tensor_tflops(matrix: dict[str, UnitRate], sm_count: int) -> dict[str, float]:
    """Dense TFLOP/s per rate key from the proto's matrix units (the first dtype of a key wins)."""
    out: dict[str, float] = {}
    for dtype, rate in matrix.items():
        out.setdefault(canonical_dtype(dtype), round(rate.flops(sm_count) / 1e12, 1))
    return out


def _kernel_fields(info: dict[str, Any]) -> dict[str, Any]:
    """DeviceSpec fields from a GpuDeviceInfoProto (or the built-in copy of its values)."""
    fields: dict[str, Any] = dict(
        sm_count=info["core_count"], clock_ghz=info["clock_rate_ghz"], fp32_lanes_per_sm=info["fpus_per_core"],
        hbm_bandwidth=float(info["memory_bandwidth"]), l2_bytes=info["l2_cache_size"],
        shared_memory_per_sm=info["shared_memory_per_core"], memory_bytes=info["device_memory_size"],
    )
    for src, dst in (("threads_per_warp", "threads_per_warp"), ("threads_per_block_limit", "threads_per_block_limit"),
                     ("threads_per_core_limit", "threads_per_sm_limit"),
                     ("shared_memory_per_block", "shared_memory_per_block")):
        if src in info:
            fields[dst] = info[src]
    cc = info.get("cuda_compute_capability")
    if isinstance(cc, dict):
        fields["compute_capability"] = f"{cc.get('major', 0)}.{cc.get('minor', 0)}"
        fields["op_profile"] = f"sm_{cc.get('major', 0)}{cc.get('minor', 0)}"
    if info.get("name"):
        fields["description"] = info["name"]
    scalar = _rates(info.get("scalar_unit_description"))
    if scalar:
        fields["scalar_rates"] = scalar
    matrix = _rates(info.get("matrix_unit_description"))
    if matrix:
        fields["tensor_tflops"] = _tensor_tflops(matrix, info["core_count"])
    links = info.get("device_interconnect_info", {}).get("active_links")
    if links:
        fields["nvlink_links"] = links
    return fields


def device_from_txtpb(text: str, name: str, extra: dict[str, Any] | None = None) -> DeviceSpec:
    """A DeviceSpec from an XLA GPU target config (GpuTargetConfigProto text), plus `extra` fields."""
    return DeviceSpec.model_validate(_txtpb_fields(text, name, extra))


def _txtpb_fields(text: str, name: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    proto = parse_txtpb(text)
    info = proto.get("gpu_device_info", proto)
    fields: dict[str, Any] = dict(extra or {})
    kernel = _kernel_fields(info)
    if "tensor_tflops" in fields and "tensor_tflops" in kernel:
        kernel["tensor_tflops"] = {**fields["tensor_tflops"], **kernel["tensor_tflops"]}
    fields.update(kernel)
    fields["name"] = name
    return fields


def builtin_target(name: str) -> str:
    """The built-in target a name means (`h100`, `h200`, `b200`, `a100`, or an alias such as `h100_sxm`,
    `H100-SXM`): the one resolver of target names for the cost model, the CLI and the XLA:GPU compile;
    ValueError naming the known ones otherwise."""
    key = _key(name)
    if key not in _FILES:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(_FILES)} (also h100_sxm, a100_sxm_80)")
    return key


def target_spec_file(name: str) -> Path:
    """The GpuTargetConfig text proto the package ships for a built-in target (package data)."""
    return Path(SPEC_DIR) / _FILES[builtin_target(name)]


def target_aliases() -> dict[str, str]:
    """Every name a built-in target answers to -> the target."""
    return {**{k: k for k in _FILES}, **_ALIASES}


def _key(name: str) -> str:
    key = name.lower().replace("-", "")
    return _ALIASES.get(key, key)


@cache
def _builtin(key: str) -> DeviceSpec:
    """A built-in device, from the packaged proto (or the values built in): the package's own data, so not
    validated again (`tests/test_cost_model.py` validates each built-in spec with pydantic)."""
    proto = SPEC_DIR / _FILES[key]
    if proto.exists():
        return DeviceSpec(**_txtpb_fields(proto.read_text(), key, _EXTRA[key]))
    return DeviceSpec(**{**_EXTRA[key], **_kernel_fields(_BUILTIN[key]), "name": key})


def get_device(name: str | DeviceSpec) -> DeviceSpec:
    """A built-in device (h100, h200, b200, a100) or a device spec file (see `load_device`)."""
    if isinstance(name, DeviceSpec):
        return name
    key = _key(name)
    if key in _EXTRA:
        return _builtin(key)
    path = Path(name)
    if path.exists():
        return load_device(path)
    raise ValueError(f"unknown device {name!r} (h100, h200, b200, a100, or a spec file)")


def _read_mapping(path: Path) -> dict[str, Any]:
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a device spec is a mapping of DeviceSpec fields")
    return data


def load_device(path: str | Path) -> DeviceSpec:
    """A user device from a file.

    - `.json` / `.yaml`: DeviceSpec fields; with `"base": "h100"` (or another built-in) only the fields
      that differ need to be given; with `"xla_spec": "file.txtpb"` the kernel figures come from the proto.
    - `.txtpb`: an XLA GPU target config; figures it lacks (tensor-core rates when absent, interconnect)
      come from a sidecar `<stem>.json` / `<stem>.yaml` when present, else from the H100's.
    """
    p = Path(path)
    if p.suffix == ".txtpb":
        extra = dict(_EXTRA["h100"])
        for suffix in (".json", ".yaml", ".yml"):
            side = p.with_suffix(suffix)
            if side.exists():
                extra.update(_read_mapping(side))
                break
        extra.pop("name", None)
        return device_from_txtpb(p.read_text(), extra.pop("device_name", p.stem), extra)
    data = _read_mapping(p)
    base = data.pop("base", None)
    xla_spec = data.pop("xla_spec", None)
    fields: dict[str, Any] = get_device(base).model_dump() if base else {}
    if xla_spec:
        proto_path = (p.parent / xla_spec) if not Path(xla_spec).is_absolute() else Path(xla_spec)
        proto_fields = _kernel_fields(parse_txtpb(proto_path.read_text()).get("gpu_device_info", {}))
        fields.update(proto_fields)
    fields.update(data)
    fields.setdefault("name", p.stem)
    return DeviceSpec.model_validate(fields)
