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


FUSIONS = """
HloModule m

fc1 {
  a = f32[64,128] parameter(0)
  b = f32[64,128] parameter(1)
  m = f32[64,128] multiply(a, b)
  z = f32[] parameter(2)
  ROOT r = f32[64] reduce(m, z), dimensions={1}, to_apply=sum
}

fc2 {
  a = f32[64,128] parameter(0)
  b = f32[64,128] parameter(1)
  m = f32[64,128] multiply(a, b)
  z = f32[] parameter(2)
  ROOT r = f32[64] reduce(m, z), dimensions={1}, to_apply=sum2
}

fc3 {
  a = f32[64,128] parameter(0)
  b = f32[64,128] parameter(1)
  m = f32[64,128] add(a, b)
  z = f32[] parameter(2)
  ROOT r = f32[64] reduce(m, z), dimensions={1}, to_apply=sum
}

sum {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

sum2 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  p = f32[64,128] parameter(0)
  q = f32[64,128] parameter(1)
  z = f32[] parameter(2)
  f1 = f32[64] fusion(p, q, z), kind=kInput, calls=fc1
  f2 = f32[64] fusion(q, p, z), kind=kInput, calls=fc2
  f3 = f32[64] fusion(p, q, z), kind=kInput, calls=fc3
  ROOT out = (f32[64], f32[64], f32[64]) tuple(f1, f2, f3)
}
"""


def test_fusion_profiles_by_structure_are_each_fusions_own():
    from hlopt.passes.fusion.fusion_cost import _fusion_profile

    module = hlo.parse(FUSIONS)
    flops = InstructionFlops()
    f1, f2, f3 = (module.entry.instruction(n) for n in ("f1", "f2", "f3"))
    assert flops.fusion_profile(f2) is flops.fusion_profile(f1)  # the same structure: walked once
    assert flops.fusion_profile(f3) is not flops.fusion_profile(f1)  # add, not multiply
    for f in (f1, f2, f3):
        assert flops.fusion_profile(f) == _fusion_profile(f, InstructionFlops()), f.name


def test_unfused_profiles_by_structure_are_each_instructions_own():
    from hlopt.passes.fusion.fusion_cost import _single_profile

    module = hlo.parse(MODULE)
    flops = InstructionFlops()
    n = {i.name: i for i in module.entry.instructions}
    assert flops.single_profile(n["t1"]) is flops.single_profile(n["t2"])  # tanh of f32[64,128] twice
    assert flops.single_profile(n["t3"]) is not flops.single_profile(n["t1"])  # bf16
    for inst in module.entry.instructions:
        assert flops.single_profile(inst) == _single_profile(inst, InstructionFlops()), inst.name
