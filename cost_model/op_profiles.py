"""Clock cycles per element of elementwise ops on NVIDIA GPUs, by compute capability and element type.

These are the measurements XLA:GPU's cost model uses (openxla/xla, xla/service/gpu/model/
hlo_op_profiles_data.h, measured with hlo_op_profiler_run on an H100 80GB HBM3 for sm_90, a B200 for
sm_100, an A100 for sm_80; sm_86 is XLA's fallback for devices it has no table for). An op/type pair
missing from a table costs `DEFAULT_CYCLES` (XLA: "elementwise instructions typically take at least a
few clock cycles"). Keys are HLO opcodes and hlopt dtype names. A device spec may override any entry
(`DeviceSpec.op_cycles`).
"""

from __future__ import annotations

__all__ = ["OP_PROFILES", "DEFAULT_CYCLES", "FALLBACK_PROFILE", "cycles_per_element", "mean_transcendental_cycles"]

DEFAULT_CYCLES = 3
FALLBACK_PROFILE = "sm_86"

OP_PROFILES: dict[str, dict[str, dict[str, int]]] = {
    "sm_100": {
        "add": {"f16": 7, "f32": 7, "f64": 15, "c64": 11, "c128": 15},
        "atan2": {"f16": 400, "f32": 373, "f64": 829, "c64": 6346, "c128": 13310},
        "cbrt": {"f16": 200, "f32": 180, "f64": 569},
        "cosine": {"f16": 1017, "f32": 1002, "f64": 538, "c64": 2511, "c128": 1862},
        "divide": {"s8": 373, "s16": 369, "s32": 306, "s64": 730, "u8": 302, "u16": 302, "u32": 125, "u64": 628,
            "f16": 43, "f32": 23, "f64": 483, "c64": 330, "c128": 2338},
        "erf": {"f16": 161, "f32": 161, "f64": 746},
        "exponential": {"f16": 106, "f32": 82, "f64": 314, "c64": 695, "c128": 1375},
        "exponential-minus-one": {"f16": 216, "f32": 196, "f64": 385, "c64": 864, "c128": 1513},
        "log": {"f16": 102, "f32": 165, "f64": 844, "c64": 703, "c128": 3859},
        "log-plus-one": {"f16": 216, "f32": 200, "f64": 793, "c64": 664, "c128": 5985},
        "logistic": {"f16": 220, "f32": 176, "f64": 428, "c64": 2314, "c128": 5973},
        "multiply": {"s8": 7, "s16": 7, "s32": 3, "s64": 11, "u8": 7, "u16": 7, "u32": 3, "u64": 11, "f16": 7,
            "f32": 7, "f64": 15, "c64": 31, "c128": 39},
        "power": {"s8": 153, "s16": 145, "s32": 172, "s64": 298, "u8": 153, "u16": 149, "u32": 172, "u64": 298,
            "f16": 451, "f32": 463, "f64": 1796, "c64": 5285, "c128": 8685},
        "rsqrt": {"f16": 98, "f32": 74, "f64": 231, "c64": 2507, "c128": 5792},
        "sine": {"f16": 1006, "f32": 990, "f64": 534, "c64": 2440, "c128": 1878},
        "sqrt": {"f16": 98, "f32": 74, "f64": 294, "c64": 4271, "c128": 6602},
        "subtract": {"f16": 7, "f32": 7, "f64": 15, "c64": 11, "c128": 15},
        "tanh": {"f16": 141, "f32": 137, "f64": 459, "c64": 2444, "c128": 4519},
    },
    "sm_90": {
        "add": {"f16": 7, "f32": 7, "f64": 15, "c64": 7, "c128": 15},
        "atan2": {"f16": 451, "f32": 431, "f64": 930, "c64": 6462, "c128": 13131},
        "cbrt": {"f16": 201, "f32": 178, "f64": 586},
        "cosine": {"f16": 997, "f32": 978, "f64": 558, "c64": 2415, "c128": 1750},
        "divide": {"s8": 356, "s16": 364, "s32": 297, "s64": 685, "u8": 300, "u16": 304, "u32": 122, "u64": 629,
            "f16": 43, "f32": 19, "f64": 526, "c64": 498, "c128": 2280},
        "exponential": {"f16": 102, "f32": 79, "f64": 376, "c64": 641, "c128": 1342},
        "exponential-minus-one": {"f16": 217, "f32": 190, "f64": 712, "c64": 2055, "c128": 1275},
        "log": {"f16": 182, "f32": 166, "f64": 815, "c64": 756, "c128": 2455},
        "log-plus-one": {"f16": 245, "f32": 229, "f64": 1259, "c64": 633, "c128": 2403},
        "multiply": {"s8": 7, "s16": 7, "s32": 3, "s64": 11, "u8": 7, "u16": 7, "u32": 3, "u64": 11, "f16": 7,
            "f32": 3, "f64": 15, "c64": 79, "c128": 39},
        "power": {"s8": 122, "s16": 122, "s32": 71, "s64": 253, "u8": 122, "u16": 126, "u32": 71, "u64": 253,
            "f16": 526, "f32": 510, "f64": 2205, "c64": 5532, "c128": 8363},
        "rsqrt": {"f16": 95, "f32": 75, "f64": 277, "c64": 3148, "c128": 5500},
        "sine": {"f16": 993, "f32": 958, "f64": 554, "c64": 2324, "c128": 1999},
        "sqrt": {"f16": 95, "f32": 75, "f64": 332, "c64": 4344, "c128": 6636},
        "subtract": {"f16": 7, "f32": 7, "f64": 15, "c64": 7, "c128": 15},
        "tanh": {"f16": 502, "f32": 467, "f64": 431, "c64": 2379, "c128": 4613},
    },
    "sm_86": {
        "add": {"f64": 97, "c128": 97},
        "atan2": {"f16": 482, "f32": 486, "f64": 3747, "c64": 5353, "c128": 39027},
        "cbrt": {"f16": 925, "f32": 867, "f64": 6339},
        "cosine": {"f16": 691, "f32": 662, "f64": 1717, "c128": 6613},
        "divide": {"s8": 370, "s16": 367, "s32": 306, "s64": 918, "u8": 306, "u16": 302, "u32": 115, "u64": 838,
            "f64": 2016, "c64": 687, "c128": 7941},
        "exponential": {"f16": 108, "f32": 86, "f64": 1652, "c64": 1360, "c128": 4028},
        "exponential-minus-one": {"f16": 396, "f32": 381, "f64": 1900, "c64": 1400, "c128": 4161},
        "log": {"f16": 266, "f32": 244, "f64": 608, "c64": 950, "c128": 7599},
        "log-plus-one": {"f16": 284, "f32": 262, "f64": 2073, "c64": 842, "c128": 6962},
        "logistic": {"f16": 226, "f32": 176, "f64": 2412},
        "multiply": {"f64": 97, "c128": 270},
        "power": {"s8": 392, "s16": 396, "s64": 601, "u8": 388, "u16": 399, "u64": 604, "f16": 975, "f32": 925,
            "f64": 5511, "c64": 3351, "c128": 18205},
        "rsqrt": {"f16": 97, "f32": 75, "f64": 698, "c64": 2383, "c128": 11318},
        "sine": {"f32": 662, "f64": 1789, "c128": 5878},
        "sqrt": {"f16": 97, "f32": 75, "f64": 986, "c64": 3193, "c128": 15606},
        "subtract": {"f64": 97, "c128": 97},
        "tanh": {"f16": 212, "f32": 190, "f64": 1609, "c128": 9939},
    },
    "sm_80": {
        "atan2": {"f64": 1080, "c64": 6618, "c128": 13564},
        "cbrt": {"f16": 1195, "f64": 1638},
        "cosine": {"c128": 2309},
        "divide": {"s8": 417, "s16": 468, "s64": 1094, "u8": 420, "u16": 391, "u64": 908, "f64": 831, "c128": 3037},
        "exponential-minus-one": {"f64": 572},
        "log": {"f16": 321, "f32": 259, "f64": 699, "c64": 1037, "c128": 2371},
        "log-plus-one": {"f16": 346, "f64": 1223, "c64": 1029, "c128": 2405},
        "power": {"u8": 417, "u16": 454, "u64": 744, "f32": 1221, "f64": 1861, "c64": 4131, "c128": 6054},
        "rsqrt": {"f64": 329, "c128": 3945},
        "sine": {"f64": 597, "c128": 2284},
        "sqrt": {"f16": 124, "f64": 397, "c128": 5304},
        "tanh": {"f16": 499, "f32": 504, "f64": 733, "c128": 3618},
    },
}


def cycles_per_element(profile: str, opcode: str, dtype: str,
                       overrides: dict[str, dict[str, int]] | None = None) -> int:
    """Cycles one element of `opcode` with result type `dtype` costs (XLA's flops per element)."""
    if overrides:
        got = overrides.get(opcode, {}).get(dtype)
        if got is not None:
            return got
    table = OP_PROFILES.get(profile, OP_PROFILES[FALLBACK_PROFILE])
    return table.get(opcode, {}).get(dtype, DEFAULT_CYCLES)


#: The ops XLA's HloCostAnalysis counts as transcendentals.
_TRANSCENDENTALS = ("exponential", "log", "logistic", "power", "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine",
                    "exponential-minus-one", "log-plus-one", "atan2", "erf", "tan")


def mean_transcendental_cycles(profile: str, overrides: dict[str, dict[str, int]] | None = None,
                               dtype: str = "f32") -> float:
    """Mean cycles per element of the transcendental ops (for a kernel known only by its counts)."""
    cycles = [cycles_per_element(profile, op, dtype, overrides) for op in _TRANSCENDENTALS]
    return sum(cycles) / len(cycles)
