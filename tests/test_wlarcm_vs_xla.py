"""while-loop-all-reduce-code-motion against XLA:GPU's own pass, and numerics of the chain/reassociation rewrites.

For shard_map loop programs written as users write them (benchmarks/collective_motion.py LOOP_PROGRAMS: gradient
accumulation with psum, DUS losses, psum of mesh-invariant values, chained psums, scan over layers, the corpus'
shard_map loops, the demo step), the all-reduces left inside while bodies after hlopt's `default` pipeline are
never more than XLA:GPU leaves, and the outputs stay equal on 8 CPU devices. XLA:CPU does not run the pass, so
the reference is XLA:GPU deviceless on 8 devices: its counts are recorded in XLA_GPU_LEFT_IN_LOOPS, and
re-measured by the slow test below through hlopt's XLA:GPU driver where it is installed (marked xla_gpu).
"""

from __future__ import annotations

import pytest
from hlopt.corpus.loop_programs import LOOP_PROGRAMS, loop_program
from hlopt.passes.framework.pipeline import NAMED_PIPELINES, run_pipeline
from test_wlarcm_chains import CHAIN_ACC, CHAIN_DUS, CHAIN_RS, REVERSED_DUS, TWO_GRADIENTS, run, summed

from benchmarks.collective_motion import (
    XLA_GPU_LEFT_IN_LOOPS,
    _loop_computations,
    all_reduces_in_loops,
    compare_with_xla,
)
from hlopt import hlo, runtime

#: a fast subset in the default run (the issue's chained case, the corpus, check_vma programs, the demo)
FAST = {
    "DUS losses, psum twice", "grad of psum'ed loss, psum'ed again", "DS/DUS row accumulation, psum twice",
    "scan over layers, backward (check_vma)", "grad accumulation (check_vma)", "corpus: shmap_psum_in_scan",
    "pmean losses", "demo transformer step",
}
#: XLA's own behaviour: one round, no reassociation (hlopt's extensions off)
XLA_ROUND = NAMED_PIPELINES["default"].replace(
    "while-loop-all-reduce-code-motion,", "while-loop-all-reduce-code-motion{repeat=false,reassociate=false},")


def _params(names):
    return [pytest.param(n, marks=() if n in FAST else pytest.mark.slow, id=n) for n in names]


@pytest.mark.parametrize("text,options", [
    (CHAIN_DUS, {}), (CHAIN_DUS, {"repeat": False}), (CHAIN_ACC, {}), (CHAIN_ACC, {"repeat": False}),
    (summed(), {}), (REVERSED_DUS, {}), (CHAIN_RS, {"enable_reduce_scatter": True}),
    (CHAIN_RS, {"enable_reduce_scatter": True, "repeat": False}), (TWO_GRADIENTS, {}),
], ids=["chain-dus", "chain-dus-one-round", "chain-acc", "chain-acc-one-round", "summed", "reversed-dus",
        "chain-rs", "chain-rs-one-round", "two-gradients"])
def test_rewrites_keep_outputs(text, options):
    after, changed = run(text, **options)
    assert changed
    result = runtime.run_and_compare(hlo.parse(text), after, rtol=1e-4, atol=1e-4)
    assert result.ok, str(result)


def test_every_program_has_a_recorded_xla_count():
    assert set(XLA_GPU_LEFT_IN_LOOPS) == set(LOOP_PROGRAMS)


@pytest.mark.parametrize("name", _params(LOOP_PROGRAMS))
def test_never_more_all_reduces_in_loops_than_xla(name):
    row = compare_with_xla(name)
    assert row["in_loops_hlopt"] <= row["in_loops_xla_gpu"], row
    assert row["outputs_equal"], row


@pytest.mark.parametrize("name", _params(["DUS losses, psum twice", "DS/DUS row accumulation, psum twice",
                                          "grad of psum'ed loss, psum'ed again", "scan over layers, backward "
                                          "(check_vma)", "pmean losses"]))
def test_one_round_without_reassociation_leaves_what_xla_leaves(name):
    row = compare_with_xla(name, pipeline=XLA_ROUND)
    assert row["in_loops_hlopt"] == row["in_loops_xla_gpu"], row
    assert row["outputs_equal"], row


@pytest.mark.slow
@pytest.mark.xla_gpu
@pytest.mark.parametrize("name", ["DUS losses, psum twice", "scan over layers, backward (check_vma)",
                                  "demo transformer step"])
def test_recorded_counts_match_xla_gpu(name):
    from hlopt.corpus.xla_reference import available

    from benchmarks.collective_motion import xla_gpu_all_reduces_in_loops

    if not available():
        pytest.skip("no XLA:GPU compiler (python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install)")
    fn, args = loop_program(name)
    module = runtime.capture(fn, *args)
    assert xla_gpu_all_reduces_in_loops(str(module)) == XLA_GPU_LEFT_IN_LOOPS[name]
    assert all_reduces_in_loops(module) >= XLA_GPU_LEFT_IN_LOOPS[name]


def _moved_channel_ids(module) -> list[int]:
    """Channel ids of the all-reduces outside while loops."""
    inside = {id(c) for c in _loop_computations(module)}
    return sorted(i.get("channel_id") for c in module.computations if id(c) not in inside
                  for i in c.instructions if i.opcode == "all-reduce")


@pytest.mark.slow
@pytest.mark.xla_gpu
@pytest.mark.parametrize("name", ["pytree gradients", "DUS losses, psum twice"])
def test_moved_channel_ids_match_xla_gpus_pass(name, tmp_path):
    """The module right after XLA:GPU's own while-loop-all-reduce-code-motion (an XLA dump of the deviceless
    compile): the all-reduces it moved out carry the channel ids hlopt gives them."""
    from hlopt.corpus.xla_reference import available, xla_gpu_compile

    if not available():
        pytest.skip("no XLA:GPU compiler (python3 -m hlopt.runtime.xla_gpu_path.xla_gpu install)")
    fn, args = loop_program(name)
    module = runtime.capture(fn, *args)
    xla_gpu_compile(str(module), devices=8, xla_flags=f"--xla_dump_to={tmp_path} "
                    "--xla_dump_hlo_pass_re=while-loop-all-reduce-code-motion")
    (dump,) = tmp_path.glob("*after_while-loop-all-reduce-code-motion*.txt")
    after = module.clone()
    run_pipeline(after, XLA_ROUND.split("while-loop-all-reduce-code-motion")[0] +
                 "while-loop-all-reduce-code-motion{repeat=false,reassociate=false}")
    assert _moved_channel_ids(after) == _moved_channel_ids(hlo.parse(dump.read_text()))
