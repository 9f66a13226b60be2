"""Collective communication time: NCCL-style algorithms and protocols over NVLink and the network.

A collective of `nbytes` among `n` GPUs is timed for every algorithm/protocol that applies, and the fastest
wins (as NCCL's tuner picks):

- ring (all-reduce: 2(n-1) steps moving 2(n-1)/n of the buffer per GPU; all-gather and reduce-scatter:
  n-1 steps moving (n-1)/n);
- tree (all-reduce across nodes: 2 ceil(log2 n) steps, the buffer twice per GPU: up and down the tree);
- NVLS, NVLink SHARP (H100/H200/B200 NVSwitch, inside a node: the switch reduces and multicasts, so the
  ring's bytes move at the full link bandwidth in one step, at a high fixed latency: ~450 GB/s all-reduce
  bus bandwidth on H100, nccl-tests measure ~480);
- direct point-to-point for all-to-all (every peer at once), collective-permute and send/recv (one hop);
- with `library="nvshmem"` (or "auto"), intra-node one-shot / two-shot all-reduce kernels on symmetric
  memory (XLA's intra-node collective kernels): launch + (n-1) x buffer / NVLink bandwidth + a barrier,
  or two phases of (n-1)/n x buffer with a barrier each — the small-message variant.

Each NCCL protocol trades latency for bandwidth: LL (8-byte stores with flags: half the bandwidth, the
lowest latency), LL128 (120 of every 128 bytes useful), Simple (full bandwidth, the highest latency).
Latencies follow NCCL's tuning model (src/graph/tuning.cc: a base latency per algorithm and protocol and
a hardware latency per step and link); the device's `nvlink_latency_us` / `network_latency_us` (LL, per
step) scale the per-step latencies. Inside a node data moves at NVLink bandwidth; a group that spans nodes
(n > GPUs per node) pays network step latencies, and its rings/trees run one channel per NIC, so a node
moves data at GPUs-per-node x NIC bandwidth (point-to-point transfers get one NIC). NCCL ring bandwidth is discounted
to 92% of the link (XLA's kRingAlgorithmDiscountFactor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hlopt.cost_model.devices import DeviceSpec

__all__ = ["CollectiveEstimate", "collective_estimate", "collective_time_us", "KINDS", "PROTOCOLS"]

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send", "recv",
         "collective-broadcast")
#: Fraction of link bandwidth each protocol delivers.
PROTOCOLS = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
#: NCCL base latency (us) per algorithm and protocol.
_BASE_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
            "nvls": {"Simple": 0.0}, "direct": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
#: NCCL per-step hardware latency (us) per link, algorithm and protocol.
_STEP_US = {
    "nvlink": {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}, "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
               "nvls": {"Simple": 25.0}, "direct": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
    "network": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}, "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
                "direct": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}},
}
_DEFAULT_STEP_LL = {"nvlink": 0.6, "network": 2.7}
RING_DISCOUNT = 0.92
#: XLA's intra-node all-reduce kernels: barrier latency (H100) and the launch.
_NVSHMEM_BARRIER_US = 1.5


@dataclass(frozen=True)
class CollectiveEstimate:
    """The chosen way to run a collective and its modeled time."""

    kind: str
    nbytes: float
    group_size: int
    time_us: float
    algorithm: str
    protocol: str
    link: str
    latency_us: float
    transfer_us: float

    @property
    def bound(self) -> str:
        """latency when the fixed costs dominate, network when the transfer does."""
        return "latency" if self.latency_us >= self.transfer_us else "network"


def _link(n: int, device: DeviceSpec, cross_node: bool | None, channels: bool = True) -> tuple[str, float]:
    """The slowest link and the bandwidth per GPU. Rings and trees spanning nodes run one channel per NIC
    (a GPU each), so a node moves data at `gpus_per_node` x NIC bandwidth (capped by NVLink); a
    point-to-point transfer uses one GPU's NIC."""
    spans = n > device.gpus_per_node if cross_node is None else cross_node
    if not spans:
        return "nvlink", device.nvlink_bandwidth
    if channels:
        return "network", min(device.nvlink_bandwidth, device.network_bandwidth * min(device.gpus_per_node, n))
    return "network", device.network_bandwidth


def _step_us(device: DeviceSpec, link: str, algo: str, proto: str) -> float:
    scale = (device.network_latency_us if link == "network" else device.nvlink_latency_us) / _DEFAULT_STEP_LL[link]
    return _STEP_US[link][algo][proto] * scale


def _candidate(kind: str, nbytes: float, n: int, device: DeviceSpec, algo: str, proto: str, link: str,
               bw: float, steps: int, wire_bytes: float, discount: float = 1.0) -> CollectiveEstimate:
    latency = _BASE_US[algo][proto] + steps * _step_us(device, link, algo, proto)
    transfer = wire_bytes / (bw * PROTOCOLS[proto] * discount) * 1e6
    return CollectiveEstimate(kind, nbytes, n, latency + transfer, algo, proto, link, latency, transfer)


def _ring_plan(kind: str, n: int) -> tuple[int, float]:
    """(steps, fraction of the buffer each GPU sends) of a ring."""
    if kind == "all-reduce":
        return 2 * (n - 1), 2.0 * (n - 1) / n
    return n - 1, (n - 1) / n


def _nccl_candidates(kind: str, nbytes: float, n: int, device: DeviceSpec,
                     cross_node: bool | None) -> list[CollectiveEstimate]:
    link, bw = _link(n, device, cross_node)
    out: list[CollectiveEstimate] = []
    if kind in ("all-reduce", "all-gather", "reduce-scatter", "collective-broadcast"):
        steps, frac = _ring_plan(kind, n)
        for proto in PROTOCOLS:
            out.append(_candidate(kind, nbytes, n, device, "ring", proto, link, bw, steps, frac * nbytes,
                                  RING_DISCOUNT))
    if kind == "all-reduce" and link == "network":  # NCCL runs trees across nodes only
        steps = 2 * math.ceil(math.log2(n))
        for proto in PROTOCOLS:
            out.append(_candidate(kind, nbytes, n, device, "tree", proto, link, bw, steps, 2.0 * nbytes))
    if device.nvls and link == "nvlink" and kind in ("all-reduce", "all-gather", "reduce-scatter"):
        _, frac = _ring_plan(kind, n)
        out.append(_candidate(kind, nbytes, n, device, "nvls", "Simple", link, bw, 1, frac * nbytes))
    if kind == "all-to-all":
        out += _all_to_all(nbytes, n, device, cross_node)
    if kind in ("collective-permute", "send", "recv"):
        link, bw = _link(n, device, cross_node, channels=False)
        for proto in PROTOCOLS:
            out.append(_candidate(kind, nbytes, n, device, "direct", proto, link, bw, 1, nbytes))
    return out


def _all_to_all(nbytes: float, n: int, device: DeviceSpec, cross_node: bool | None) -> list[CollectiveEstimate]:
    """Every GPU sends 1/n of its buffer to each peer at once; NVLink and network parts overlap."""
    gpn = min(device.gpus_per_node, n) if cross_node is not False else n
    spans = n > device.gpus_per_node if cross_node is None else cross_node
    intra = nbytes * (gpn - 1) / n
    inter = nbytes * (n - gpn) / n if spans else 0.0
    out = []
    for proto in PROTOCOLS:
        eff = PROTOCOLS[proto]
        link = "network" if spans else "nvlink"
        latency = _BASE_US["direct"][proto] + math.ceil(math.log2(n)) * _step_us(device, link, "direct", proto)
        transfer = max(intra / (device.nvlink_bandwidth * eff), inter / (device.network_bandwidth * eff)) * 1e6
        out.append(CollectiveEstimate("all-to-all", nbytes, n, latency + transfer, "direct", proto, link,
                                      latency, transfer))
    return out


def _nvshmem_candidates(kind: str, nbytes: float, n: int, device: DeviceSpec) -> list[CollectiveEstimate]:
    if kind != "all-reduce" or n > device.gpus_per_node:
        return []
    bw = device.nvlink_bandwidth
    launch = device.kernel_launch_us
    one = (n - 1) * nbytes / bw * 1e6
    two = 2 * ((n - 1) / n * nbytes / bw * 1e6)
    return [
        CollectiveEstimate(kind, nbytes, n, launch + _NVSHMEM_BARRIER_US + one, "one-shot", "nvshmem", "nvlink",
                           launch + _NVSHMEM_BARRIER_US, one),
        CollectiveEstimate(kind, nbytes, n, launch + 2 * _NVSHMEM_BARRIER_US + two, "two-shot", "nvshmem",
                           "nvlink", launch + 2 * _NVSHMEM_BARRIER_US, two),
    ]


def collective_estimate(kind: str, nbytes: float, n: int, device: DeviceSpec, library: str = "nccl",
                        cross_node: bool | None = None) -> CollectiveEstimate:
    """The fastest way to run one collective of `kind` on a buffer of `nbytes` among `n` GPUs.

    `nbytes` is the full buffer: the all-reduce buffer, the all-gather output, the reduce-scatter input,
    each GPU's all-to-all buffer, the permuted buffer. `library` is "nccl", "nvshmem" or "auto" (both);
    `cross_node` forces (True) or forbids (False) the network, else a group larger than a node uses it.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r} ({', '.join(KINDS)})")
    if n <= 1 or nbytes <= 0:
        return CollectiveEstimate(kind, nbytes, n, device.kernel_launch_us, "local", "none", "local",
                                  device.kernel_launch_us, 0.0)
    candidates: list[CollectiveEstimate] = []
    if library in ("nccl", "auto"):
        candidates += _nccl_candidates(kind, nbytes, n, device, cross_node)
    if library in ("nvshmem", "auto"):
        candidates += _nvshmem_candidates(kind, nbytes, n, device)
    if not candidates:
        candidates = _nccl_candidates(kind, nbytes, n, device, cross_node)
    return min(candidates, key=lambda c: c.time_us)


def collective_time_us(kind: str, nbytes: float, n: int, device: DeviceSpec, library: str = "nccl") -> float:
    """Modeled time (us) of one collective (see `collective_estimate`)."""
    return collective_estimate(kind, nbytes, n, device, library).time_us
