"""The fusion passes' flops cache (`InstructionFlops`): ops whose count follows from opcode and shapes share
an entry by those, and every cached count is what `instruction_flops` gives the instruction itself."""

from __future__ import annotations

from hlopt.passes.fusion.fusion_cost import InstructionFlops, instruction_flops

from hlopt import hlo

MODULE = """
HloModule m

ENTRY main {
  p = f32[64,128] parameter(0)
  q = bf16[64,128] parameter(1)
  a = bf16[64,128] convert(p)
  b = f32[64,128] convert(q)
  c = f32[64,128] convert(a)
  t1 = f32[64,128] tanh(p)
  t2 = f32[64,128] tanh(b)
  t3 = bf16[64,128] tanh(q)
  e = f32[64,128] exponential(c)
  r = f32[128,64] transpose(e), dimensions={1,0}
  s = f32[64,128] add(t1, t2)
  ROOT out = (f32[64,128], bf16[64,128], f32[128,64]) tuple(s, t3, r)
}
"""


def test_cached_flops_are_each_instructions_own():
    module = hlo.parse(MODULE)
    flops = InstructionFlops()
    for inst in module.entry.instructions:
        assert flops.flops_of(inst) == instruction_flops(inst, flops.cost.gpu_flops), inst.name
    again = InstructionFlops()  # a cache filled in the other order gives the same counts
    for inst in reversed(module.entry.instructions):
        assert again.flops_of(inst) == flops.flops_of(inst), inst.name
