"""The never-slower check of the fusion passes (passes/fusion/fusion_trial.py), structure (no jax): every fusion made
carries the cost model's figures and is never slower by them; a cost model that rates every fusion slow
stops both passes; the check leaves the module it inspects untouched."""

from __future__ import annotations

import pytest
from fusion_cases import SUM
from hlopt.cost_model import get_cost_model, register_cost_model, unregister_cost_model
from hlopt.passes.fusion.fusion_trial import FusionTrial, TrialVerdict
from hlopt.passes.fusion.multi_output_fusion import MultiOutputFusion
from hlopt.passes.fusion.priority_fusion import PriorityFusion

from hlopt import hlo

SIBLINGS = """HloModule siblings

""" + SUM + """
ENTRY %main (x: f32[512,1024], y: f32[512,1024]) -> (f32[512], f32[512], f32[512,1024]) {
  %x = f32[512,1024]{1,0} parameter(0)
  %y = f32[512,1024]{1,0} parameter(1)
  %a = f32[512,1024]{1,0} add(%x, %y)
  %e = f32[512,1024]{1,0} exponential(%a)
  %zero = f32[] constant(0)
  %r1 = f32[512]{0} reduce(%e, %zero), dimensions={1}, to_apply=%sum
  %n = f32[512,1024]{1,0} negate(%a)
  %r2 = f32[512]{0} reduce(%n, %zero), dimensions={1}, to_apply=%sum
  %t = f32[512,1024]{1,0} tanh(%a)
  ROOT %out = (f32[512], f32[512], f32[512,1024]{1,0}) tuple(%r1, %r2, %t)
}
"""


class _SlowFusions:
    """A user cost model: the analytical H100 model, except that a fusion costs 1 ms per fused instruction
    (its tuple root included), so that every fusion, of two kernels or of siblings, is slower than its parts."""

    def __init__(self) -> None:
        self.inner = get_cost_model("h100")

    def node_time_us(self, inst) -> float:
        if inst.opcode != "fusion":
            return self.inner.node_time_us(inst)
        return 1000.0 * sum(i.opcode != "parameter" for i in inst.attrs["calls"].instructions)

    def async_latency_us(self, start) -> float:
        return self.inner.async_latency_us(start)


@pytest.fixture
def slow_fusions():
    register_cost_model("slow-fusions", _SlowFusions)
    yield "slow-fusions"
    unregister_cost_model("slow-fusions")


def _run(p, text: str):
    m = hlo.parse(text)
    return m, p.run_with_result(m)


def test_every_fusion_made_is_not_slower_by_the_cost_model():
    m, pf = _run(PriorityFusion(), SIBLINGS)
    mof = MultiOutputFusion().run_with_result(m)
    taken = [e for e in pf.explanations + mof.explanations if e.taken and e.before_us is not None]
    assert taken, "no fusion carried the cost model's figures"
    for e in taken:
        assert e.after_us <= e.before_us + 1e-6, str(e)
        assert e.launches_saved >= 1 and e.rule
        assert "cost model" in str(e)


def test_a_model_that_rates_every_fusion_slow_stops_both_passes(slow_fusions):
    m, pf = _run(PriorityFusion(device=slow_fusions, fuse_constants=False), SIBLINGS)
    assert not pf.changed
    assert not [i for i in m.instructions() if i.opcode == "fusion"]
    refused = [e for e in pf.explanations if not e.taken and "slower as built" in e.reason]
    assert refused and all(e.after_us > e.before_us for e in refused)
    # multi-output fusion on fusions priority-fusion made with the check off, judged with it on
    m, _ = _run(PriorityFusion(never_slower=False), SIBLINGS)
    before = m.to_text()
    mof = MultiOutputFusion(device=slow_fusions).run_with_result(m)
    assert not mof.changed and m.to_text() == before
    assert any("slower as built" in e.reason for e in mof.explanations if not e.taken)


def test_the_check_can_be_switched_off(slow_fusions):
    m, pf = _run(PriorityFusion(device=slow_fusions, never_slower=False), SIBLINGS)
    assert pf.changed and all(e.before_us is None for e in pf.explanations)


def test_trial_leaves_the_module_untouched():
    m = hlo.parse(SIBLINGS)
    before, mutations = m.to_text(), m.mutations
    insts = {i.name: i for i in m.entry.instructions}
    trial = FusionTrial("h100")
    v = trial.producer_into_consumers(insts["a"], [insts["e"], insts["n"], insts["t"]])
    assert isinstance(v, TrialVerdict) and v.launches_saved == 1 and v.before_us > 0 and v.after_us > 0
    w = trial.siblings(insts["r1"], insts["r2"])
    assert w.launches_saved == 1
    assert m.to_text() == before and m.mutations == mutations
    assert [u.name for u in insts["a"].users] == ["e", "n", "t"]


def test_verdict_slower_and_description():
    assert TrialVerdict(2.0, 2.5, 1).slower and not TrialVerdict(2.0, 2.0, 1).slower
    assert "2.000 -> 1.000 us, 1 launch(es) saved" in TrialVerdict(2.0, 1.0, 1).describe()


def test_audit_lines_list_each_fusion_made_with_its_figures():
    from hlopt.passes.fusion.fusion_trial import fusion_audit_lines

    m, pf = _run(PriorityFusion(), SIBLINGS)
    lines = fusion_audit_lines(pf.explanations)
    made = [e for e in pf.explanations if e.taken and e.before_us is not None]
    assert len(lines) == len(made) + 2 and lines[-1].startswith(f"{len(made)} fusion(s) made")
    assert all("priority-fusion" in line and "fused" in line for line in lines[1:-1])


def test_cli_opt_explain_fusion_prints_the_audit(tmp_path, capsys):
    from hlopt.cli.main import main

    src = tmp_path / "m.hlo"
    src.write_text(SIBLINGS)
    assert main(["opt", str(src), "-p", "priority-fusion,multi-output-fusion", "--explain-fusion",
                 "-o", str(tmp_path / "out.hlo")]) == 0
    err = capsys.readouterr().err
    assert "before us" in err and "fusion(s) made" in err and "none slower" in err


def test_trial_of_a_multi_output_sibling():
    from hlopt.passes.fusion.fusion_building import merge_into_multi_output

    m = hlo.parse(SIBLINGS)
    PriorityFusion().run(m)
    fusions = [i for i in m.entry.instructions if i.opcode == "fusion"]
    reductions = [f for f in fusions if f.shape.rank == 1]
    loop = next(f for f in fusions if f.shape.rank == 2)
    merge_into_multi_output(reductions[0], reductions[1])  # a multi-output sibling, read through get-tuple-elements
    before = m.to_text()
    v = FusionTrial("h100").siblings(loop, reductions[0])
    assert v.launches_saved == 1 and v.after_us > 0 and m.to_text() == before


def test_a_repeated_candidate_is_answered_from_the_cache_with_the_same_verdict():
    module = hlo.parse("""HloModule twice
ENTRY %main (x: f32[64,128], y: f32[64,128]) -> (f32[64,128], f32[64,128]) {
  %x = f32[64,128]{1,0} parameter(0)
  %y = f32[64,128]{1,0} parameter(1)
  %a1 = f32[64,128]{1,0} add(%x, %y)
  %m1 = f32[64,128]{1,0} multiply(%a1, %a1)
  %a2 = f32[64,128]{1,0} add(%y, %x)
  %m2 = f32[64,128]{1,0} multiply(%a2, %a2)
  %m3 = f32[64,128]{1,0} multiply(%a2, %x)
  ROOT %out = (f32[64,128]{1,0}, f32[64,128]{1,0}) tuple(%m1, %m2)
}
""")
    names = {i.name: i for i in module.entry.instructions}
    trial = FusionTrial("h100")
    first = trial.producer_into_consumers(names["a1"], [names["m1"]])
    built = trial.cached_verdicts
    assert trial.producer_into_consumers(names["a2"], [names["m2"]]) == first  # same structure: a cache hit
    assert trial.cached_verdicts == built
    other = trial.producer_into_consumers(names["a2"], [names["m3"]])  # reads a different operand twice
    assert trial.cached_verdicts == built + 1
    assert other == FusionTrial("h100").producer_into_consumers(names["a2"], [names["m3"]])
    assert first == FusionTrial("h100").producer_into_consumers(names["a1"], [names["m1"]])


CHAIN = """HloModule chain

ENTRY %main (x: u32[4096], y: u32[4096]) -> u32[4096] {
  %x = u32[4096]{0} parameter(0)
  %y = u32[4096]{0} parameter(1)
  %a = u32[4096]{0} add(%x, %y)
  %b = u32[4096]{0} xor(%a, %y)
  %c = u32[4096]{0} multiply(%b, %x)
  %d = u32[4096]{0} add(%c, %y)
  ROOT %e = u32[4096]{0} xor(%d, %x)
}
"""

BROADCAST_READ = """HloModule broadcast_read

ENTRY %main (x: f32[4096], y: f32[4096,64]) -> f32[4096,64] {
  %x = f32[4096]{0} parameter(0)
  %y = f32[4096,64]{1,0} parameter(1)
  %e = f32[4096]{0} exponential(%x)
  %b = f32[4096,64]{1,0} broadcast(%e), dimensions={0}
  ROOT %m = f32[4096,64]{1,0} multiply(%b, %y)
}
"""


SHARED_PRODUCER = """HloModule shared

""" + SUM + """
ENTRY %main (x: f32[512,1024], y: f32[512,1024], z: f32[512,1024]) -> (f32[512], f32[512,1024], f32[512,1024], f32[512]) {
  %x = f32[512,1024]{1,0} parameter(0)
  %y = f32[512,1024]{1,0} parameter(1)
  %z = f32[512,1024]{1,0} parameter(2)
  %c = f32[] constant(2)
  %b = f32[512,1024]{1,0} broadcast(%c), dimensions={}
  %m1 = f32[512,1024]{1,0} multiply(%x, %b)
  %zero = f32[] constant(0)
  %r1 = f32[512]{0} reduce(%m1, %zero), dimensions={1}, to_apply=%sum
  %m2 = f32[512,1024]{1,0} multiply(%y, %b)
  %a = f32[512,1024]{1,0} add(%b, %b)
  %m3 = f32[512,1024]{1,0} multiply(%z, %b)
  %r3 = f32[512]{0} reduce(%m3, %zero), dimensions={1}, to_apply=%sum
  ROOT %out = (f32[512], f32[512,1024], f32[512,1024], f32[512]) tuple(%r1, %m2, %a, %r3)
}
"""


def test_an_elementwise_chain_is_judged_without_building_it():
    """Loop kernels of one shape, each read once by the next: fusing cannot be slower by the analytical
    model, so the check builds nothing (a random number generator's rounds grow one fusion this way)."""
    m, pf = _run(PriorityFusion(), CHAIN)
    fusions = [i for i in m.entry.instructions if i.opcode == "fusion"]
    assert len(fusions) == 1 and pf.changed
    taken = [e for e in pf.explanations if e.taken]
    assert taken and all(e.before_us is None for e in taken)


def test_a_read_that_repeats_the_producer_is_still_built_and_timed():
    m, pf = _run(PriorityFusion(), BROADCAST_READ)
    timed = [e for e in pf.explanations if e.before_us is not None]
    assert timed, "the exponential read 64 times per element was not built and timed"


def test_a_user_model_is_always_asked(slow_fusions):
    m, pf = _run(PriorityFusion(device=slow_fusions, fuse_constants=False), CHAIN)
    assert not pf.changed
    assert any("slower as built" in e.reason for e in pf.explanations if not e.taken)


@pytest.mark.parametrize("stays", [False, True])
def test_a_producer_with_several_consumers_is_judged_as_on_one_scratch(monkeypatch, stays):
    module = hlo.parse(SHARED_PRODUCER)
    n = {i.name: i for i in module.entry.instructions}
    consumers = [n["m1"], n["m2"], n["a"], n["m3"]]
    by_consumer = FusionTrial("h100").producer_into_consumers(n["b"], consumers, producer_stays=stays)

    def whole(*_args):
        raise TypeError  # no per-consumer trials: one scratch with every consumer, as before

    one_scratch = FusionTrial("h100")
    monkeypatch.setattr(one_scratch, "_by_consumer", whole)
    assert one_scratch.producer_into_consumers(n["b"], consumers, producer_stays=stays) == by_consumer
    assert module.to_text() == hlo.parse(SHARED_PRODUCER).to_text()  # the module itself is untouched


TWO_READERS = """HloModule two_readers

ENTRY %main (x: f32[{n}], y: f32[{n}]) -> (f32[{n}], f32[{n}]) {{
  %x = f32[{n}]{{0}} parameter(0)
  %y = f32[{n}]{{0}} parameter(1)
  %t = f32[{n}]{{0}} add(%x, %y)
  %a = f32[{n}]{{0}} subtract(%t, %x)
  %m = f32[{n}]{{0}} multiply(%t, %y)
  ROOT %out = (f32[{n}], f32[{n}]) tuple(%a, %m)
}}
"""


def test_a_producer_duplicated_into_two_readers_is_built_only_when_its_work_could_outweigh_a_launch():
    """Two consumers: the producer runs twice after fusion; a small one (far less than a launch) cannot make
    the fusions slower, a large one is built and timed."""
    _, small = _run(PriorityFusion(), TWO_READERS.format(n=64))
    t_small = [e for e in small.explanations if e.taken and e.producer == "t"]
    assert t_small and t_small[0].before_us is None
    _, large = _run(PriorityFusion(), TWO_READERS.format(n=1 << 24))
    t_large = [e for e in large.explanations if e.producer == "t"]
    assert t_large and t_large[0].before_us is not None
