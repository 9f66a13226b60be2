"""Structural keys (hlo/structure.py), structure only (no jax): equal structure gives equal keys whatever the
names and whichever computation is called; a different opcode, shape, attribute, operand wiring or called region
gives a different key; an edit is seen. The kernel model's and the fusion trial's memos keyed by them answer as
a fresh computation does."""

from __future__ import annotations

from hlopt.cost_model.devices import get_device
from hlopt.cost_model.kernel import KernelModel
from hlopt.hlo.ir import Instruction
from hlopt.hlo.structure import StructureKeys
from hlopt.passes.fusion.fusion_trial import FusionTrial
from hlopt.passes.fusion.priority_fusion import PriorityFusion

from hlopt import hlo

TWO_LAYERS = """HloModule layers

%sum_1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%sum_2 (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %t = f32[] add(%p, %q)
}

%max_3 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

ENTRY %main (x: f32[64,128], y: f32[64,128]) -> (f32[64], f32[64], f32[64]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} parameter(1)
  %zero = f32[] constant(0)
  %e1 = f32[64,128]{1,0} exponential(%x)
  %r1 = f32[64]{0} reduce(%e1, %zero), dimensions={1}, to_apply=%sum_1
  %e2 = f32[64,128]{1,0} exponential(%y)
  %r2 = f32[64]{0} reduce(%e2, %zero), dimensions={1}, to_apply=%sum_2
  %e3 = f32[64,128]{1,0} exponential(%x)
  %r3 = f32[64]{0} reduce(%e3, %zero), dimensions={1}, to_apply=%max_3
  ROOT %out = (f32[64], f32[64], f32[64]) tuple(%r1, %r2, %r3)
}
"""


def _names(module) -> dict[str, Instruction]:
    return {i.name: i for i in module.entry.instructions}


def test_equal_structure_equal_key_whatever_the_names_and_the_called_computation():
    n = _names(hlo.parse(TWO_LAYERS))
    keys = StructureKeys()
    assert keys.of(n["r1"]) == keys.of(n["r2"])  # %sum_1 and %sum_2: the same region
    assert keys.of(n["r1"]) != keys.of(n["r3"])  # an add region against a maximum region
    assert keys.of(n["e1"]) == keys.of(n["e2"])


def test_a_different_shape_attribute_or_wiring_gives_a_different_key():
    keys = StructureKeys()
    a = Instruction("broadcast", hlo.parse_shape("f32[4,8]"), [Instruction("parameter", hlo.parse_shape("f32[4]"),
                                                                         parameter_number=0)], dimensions=(0,))
    b = Instruction("broadcast", hlo.parse_shape("f32[4,8]"), [Instruction("parameter", hlo.parse_shape("f32[8]"),
                                                                         parameter_number=0)], dimensions=(1,))
    assert keys.of(a) != keys.of(b)
    x = Instruction("parameter", hlo.parse_shape("f32[4]"), parameter_number=0)
    y = Instruction("parameter", hlo.parse_shape("f32[4]"), parameter_number=1)
    same = Instruction("add", x.shape, [x, x])
    two = Instruction("add", x.shape, [x, y])
    assert keys.of(same) == keys.of(two)  # operands by shape only...
    assert keys.of_kernel(same) != keys.of_kernel(two)  # ...but a kernel reads a shared operand once


def test_an_edit_of_a_called_computation_is_seen():
    module = hlo.parse(TWO_LAYERS)
    n = _names(module)
    keys = StructureKeys()
    before = keys.of(n["r1"])
    region = n["r1"].attrs["to_apply"]
    root = region.root
    new = region.add(Instruction("multiply", root.shape, list(root.operands), name="mul"))
    region.set_root(new)
    assert keys.of(n["r1"]) != before
    assert keys.of(n["r1"]) != keys.of(n["r2"])


def test_the_kernel_model_remembers_a_fusion_by_structure_with_the_same_estimate():
    module = hlo.parse(TWO_LAYERS)
    PriorityFusion().run(module)
    fusions = [i for i in module.entry.instructions if i.opcode == "fusion"]
    assert len(fusions) == 3
    shared = KernelModel(get_device("h100"))
    got = [shared.estimate(f) for f in fusions]
    assert got[0] is got[1]  # the same fusion in another layer: answered from the memo
    for f, estimate in zip(fusions, got, strict=True):
        assert estimate == KernelModel(get_device("h100")).estimate(f)  # as a fresh model computes it


def test_the_trial_answers_a_layer_whose_reduction_calls_another_region_from_its_cache():
    n = _names(hlo.parse(TWO_LAYERS))
    trial = FusionTrial("h100")
    first = trial.producer_into_consumers(n["e1"], [n["r1"]])
    built = trial.cached_verdicts
    assert trial.producer_into_consumers(n["e2"], [n["r2"]]) == first
    assert trial.cached_verdicts == built
    trial.producer_into_consumers(n["e3"], [n["r3"]])  # a maximum: built again
    assert trial.cached_verdicts == built + 1


def test_a_derived_number_is_the_walked_number_of_what_was_built():
    module = hlo.parse(TWO_LAYERS)
    keys = StructureKeys()
    sum_1, sum_2, max_3 = (c for c in module.computations if c.name in ("sum_1", "sum_2", "max_3"))
    first = keys.derive(sum_1, ("built", 1))
    assert first == keys.of_computation(sum_1)
    assert keys.derive(sum_2, ("built", 1)) == first  # the same move again: its number, no walk
    assert keys.of_computation(sum_2) == first
    assert keys.derive(max_3, ("built", 2)) != first  # another move: walked, another structure
    root = sum_2.root
    sum_2.set_root(sum_2.add(Instruction("multiply", root.shape, list(root.operands), name="mul")))
    assert keys.of_computation(sum_2) != first  # an edit ends the derived number


def test_priority_fusions_numbered_by_their_moves_compare_as_walked_ones():
    module = hlo.parse(TWO_LAYERS.replace("to_apply=%max_3", "to_apply=%sum_1"))  # three equal layers
    PriorityFusion().run(module)
    from hlopt.hlo.structure import shared_keys

    fusions = [i for c in module.computations for i in c.instructions if i.opcode == "fusion"]
    assert len(fusions) == 3
    fresh, keys = StructureKeys(), shared_keys(module)
    for a in fusions:
        for b in fusions:
            assert (keys.of(a) == keys.of(b)) == (fresh.of(a) == fresh.of(b)), (a.name, b.name)
    assert fresh.of(fusions[0]) == fresh.of(fusions[2])


def test_a_new_operand_shape_given_with_set_shape_is_seen_by_the_user_and_its_computation():
    m = hlo.parse("""HloModule reshaped

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %n = f32[8]{0} negate(%x)
  ROOT %e = f32[8]{0} exponential(%n)
}
""")
    keys = StructureKeys()
    n, e = (i for i in m.entry.instructions if i.name in ("n", "e"))
    user_before, comp_before = keys.of(e), keys.of_computation(m.entry)
    n.set_shape(hlo.parse_shape("f32[16]{0}"))
    assert keys.of(e) != user_before
    assert keys.of_computation(m.entry) != comp_before


def test_a_key_naming_a_region_is_remembered_until_the_region_reads_otherwise():
    module = hlo.parse(TWO_LAYERS)
    n = _names(module)
    keys = StructureKeys()
    first = keys.of(n["r1"])
    assert keys.of(n["r1"]) is first  # remembered: not built again while the region is as it was
    n["r1"].attrs["to_apply"] = n["r3"].attrs["to_apply"]  # another region (a maximum): a stamped edit
    assert keys.of(n["r1"]) == keys.of(n["r3"]) != first
    region = n["r3"].attrs["to_apply"]  # an edit inside the region both call, not of the instructions
    kept = keys.of(n["r1"])
    root = region.root
    region.set_root(region.add(Instruction("multiply", root.shape, list(root.operands), name="mul")))
    assert keys.of(n["r1"]) != kept and keys.of(n["r1"]) == keys.of(n["r3"])
