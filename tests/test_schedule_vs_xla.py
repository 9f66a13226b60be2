"""benchmarks/schedule_vs_xla.py: XLA's order and ours under the same simulator."""

from __future__ import annotations

import pytest
from hlopt.scheduler.costs import ApproximateLatencyEstimator  # noqa: E402

from benchmarks.schedule_vs_xla import evaluate  # noqa: E402

#: A scheduled module as XLA writes it: the all-reduce waits at once, the independent work comes after.
SCHEDULED = """HloModule m, is_scheduled=true

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p0: f32[1024], p1: f32[1024]) -> (f32[1024], f32[1024]) {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %ars = f32[1024]{0} all-reduce-start(f32[1024]{0} %p0), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%sum
  %ard = f32[1024]{0} all-reduce-done(f32[1024]{0} %ars)
  %c = f32[1024]{0} convolution(f32[1024]{0} %p1, f32[1024]{0} %p1), dim_labels=b_io->b
  %m = f32[1024]{0} multiply(f32[1024]{0} %c, f32[1024]{0} %c)
  ROOT %t = (f32[1024]{0}, f32[1024]{0}) tuple(f32[1024]{0} %ard, f32[1024]{0} %m)
}
"""


def test_ours_hides_what_xla_order_exposes() -> None:
    est = ApproximateLatencyEstimator()
    out = evaluate(SCHEDULED, est, ["xla-default", "xla-default+keep"])
    xla, ours = out["xla"], out["xla-default"]
    assert xla["exposed_comm_us"] == pytest.approx(5000.0)
    assert ours["makespan_us"] < xla["makespan_us"]
    assert ours["exposed_comm_us"] < xla["exposed_comm_us"]
    assert out["xla-default+keep"]["makespan_us"] <= xla["makespan_us"]
    for figures in out.values():
        assert figures["makespan_us"] >= figures["lower_bound_us"] - 1e-9
        assert figures["lower_bound_us"] >= figures["basic_lower_bound_us"]
        assert set(figures["computations"]) == {"main"}


@pytest.mark.slow
@pytest.mark.xla_gpu
def test_fsdp_against_xla_gpu() -> None:
    from hlopt.corpus.training_steps import fsdp_mlp_text as _fsdp_mlp
    from hlopt.runtime.xla_gpu_path.xla_gpu import available

    from benchmarks.schedule_vs_xla import estimator_of, xla_scheduled

    if not available():
        pytest.skip("no XLA:GPU compiler")
    text = xla_scheduled(_fsdp_mlp(layers=2, width=1024, batch=256))
    out = evaluate(text, estimator_of(text, "xla"), ["xla-default", "xla-default+keep"])
    assert out["xla"]["total_comm_us"] > 0
    assert out["xla-default"]["makespan_us"] <= out["xla"]["makespan_us"] + 1e-6
    assert out["xla-default+keep"]["makespan_us"] <= out["xla"]["makespan_us"] + 1e-6
