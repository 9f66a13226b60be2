"""Synthetic modules for sweeping scheduling heuristics.

`synthetic_module(layers, pattern, ...)` writes an HLO module of `layers` layers, each a chain of dots:
- `fsdp`: per layer, all-gather the layer's weight shard before its dots, and reduce-scatter its gradient;
- `data-parallel`: per layer, an all-reduce of the layer's gradient;
- `pipeline`: per layer, a collective-permute of the activations.
`comm_ratio` scales the collective sizes against the compute, so a sweep can move from compute-bound
to communication-bound modules. Collectives are synchronous: run `async-collective-creator` first.
"""

from __future__ import annotations

from hlopt.hlo.ir import Module
from hlopt.hlo.parser import parse

__all__ = ["synthetic_module", "PATTERNS"]

PATTERNS = ("fsdp", "data-parallel", "pipeline", "mixed")


def synthetic_module(layers: int = 8, pattern: str = "fsdp", hidden: int = 1024, batch: int = 1024,
                     comm_ratio: float = 1.0, devices: int = 8, dots_per_layer: int = 2) -> Module:
    """An HLO module with `layers` layers of compute and collectives in the chosen pattern."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r} (one of {', '.join(PATTERNS)})")
    groups = "{" + ",".join(map(str, range(devices))) + "}"
    comm = max(8, int(hidden * comm_ratio) // devices * devices)
    lines = [f"HloModule synthetic_{pattern}_{layers}, num_partitions={devices}", "",
             "%sum (a: f32[], b: f32[]) -> f32[] {", "  %a = f32[] parameter(0)", "  %b = f32[] parameter(1)",
             "  ROOT %s = f32[] add(%a, %b)", "}", "", f"ENTRY %main (x: f32[{batch},{hidden}]) -> f32[{batch},{hidden}] {{",
             f"  %x = f32[{batch},{hidden}]{{1,0}} parameter(0)"]
    act = "%x"
    grads: list[str] = []
    for layer in range(layers):
        kind = pattern if pattern != "mixed" else PATTERNS[layer % 3]
        w = f"%w{layer}"
        if kind == "fsdp":
            shard = comm // devices
            lines.append(f"  %wshard{layer} = f32[{shard},{hidden}]{{1,0}} broadcast(f32[] constant({layer + 1})), dimensions={{}}")
            lines.append(f"  %wfull{layer} = f32[{comm},{hidden}]{{1,0}} all-gather(%wshard{layer}), channel_id={layer * 3 + 1}, "
                         f"replica_groups={{{groups}}}, dimensions={{0}}, use_global_device_ids=true")
            lines.append(f"  %wsl{layer} = f32[{hidden},{hidden}]{{1,0}} slice(%wfull{layer}), slice={{[0:{hidden}], [0:{hidden}]}}"
                         if comm >= hidden else
                         f"  %wsl{layer} = f32[{hidden},{hidden}]{{1,0}} pad(%wfull{layer}, f32[] constant(0)), padding=0_{hidden - comm}x0_0")
            w = f"%wsl{layer}"
        else:
            lines.append(f"  {w} = f32[{hidden},{hidden}]{{1,0}} broadcast(f32[] constant({layer + 1})), dimensions={{}}")
        for d in range(dots_per_layer):
            out = f"%h{layer}_{d}"
            lines.append(f"  {out} = f32[{batch},{hidden}]{{1,0}} dot({act}, {w}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}")
            lines.append(f"  %t{layer}_{d} = f32[{batch},{hidden}]{{1,0}} tanh({out})")
            act = f"%t{layer}_{d}"
        grad = f"%g{layer}"
        lines.append(f"  {grad} = f32[{comm},{hidden}]{{1,0}} broadcast(f32[] constant(0.5)), dimensions={{}}")
        if kind == "fsdp":
            lines.append(f"  %rs{layer} = f32[{comm // devices},{hidden}]{{1,0}} reduce-scatter({grad}), channel_id={layer * 3 + 2}, "
                         f"replica_groups={{{groups}}}, dimensions={{0}}, use_global_device_ids=true, to_apply=%sum")
            grads.append(f"%rs{layer}")
        elif kind == "data-parallel":
            lines.append(f"  %ar{layer} = f32[{comm},{hidden}]{{1,0}} all-reduce({grad}), channel_id={layer * 3 + 2}, "
                         f"replica_groups={{{groups}}}, use_global_device_ids=true, to_apply=%sum")
            grads.append(f"%ar{layer}")
        else:
            pairs = ",".join("{" + f"{i},{(i + 1) % devices}" + "}" for i in range(devices))
            lines.append(f"  %cp{layer} = f32[{batch},{hidden}]{{1,0}} collective-permute({act}), channel_id={layer * 3 + 3}, "
                         f"source_target_pairs={{{pairs}}}")
            act = f"%cp{layer}"
    outs = [act] + grads
    shapes = [f"f32[{batch},{hidden}]{{1,0}}"] + [_shape_of(lines, g) for g in grads]
    lines.append(f"  ROOT %out = ({', '.join(shapes)}) tuple({', '.join(outs)})")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    text = text.replace(f"-> f32[{batch},{hidden}] {{", f"-> ({', '.join(s.split('{')[0] for s in shapes)}) {{")
    return parse(text, filename=f"<synthetic {pattern} x{layers}>")


def _shape_of(lines: list[str], name: str) -> str:
    for line in lines:
        if line.strip().startswith(f"{name} = "):
            return line.split(" = ", 1)[1].split(" ", 1)[0]
    raise KeyError(name)
