"""The machine hlopt times programs on: one compute stream and async streams beside it.

Read from XLA:GPU (DEVELOPERS.md, "XLA:GPU's streams"): compute ops run one at a time, in order, on the
compute stream; an async collective runs on its stream (XLA:GPU: one collective stream for every collective
type) once it is issued and a slot of that stream is free, `slots` collectives of one stream at a time (1 on
XLA:GPU: a CUDA stream runs its work in order); whoever waits for its result waits for its end.

`StreamMachine` is that state and its two moves; who decides what runs when is the caller's:
- the scheduler's simulator (`scheduler.simulator.simulate`) and its timeline (`scheduler.fill`) run a given
  order: a start issues its collective when the compute stream reaches it;
- the collective-pipeliner's gate (`passes.collectives.collective_pipeliner_cost`) list-schedules one loop iteration: a
  collective issues as soon as its operands are ready, as a latency-hiding scheduler starts it early.

Both move the clocks only through `StreamMachine` (and `claim_slot`), so a change of the stream rules reaches
both. Times come from a `cost_model.estimator.LatencyEstimator`.
"""

from __future__ import annotations

__all__ = ["claim_slot", "StreamMachine", "COLLECTIVE_STREAM"]

#: XLA:GPU's one collective stream (`AsyncStreamKind::kCollective`).
COLLECTIVE_STREAM = "collective"


def claim_slot(in_flight: dict[str, list[float]], kind: str, begin: float, latency: float, limit: int) -> float:
    """When a collective of `kind` ready at `begin` can run with at most `limit` of its kind in flight
    (`in_flight`: their end times, updated with this one's)."""
    running = [e for e in in_flight.get(kind, ()) if e > begin]
    if len(running) >= limit:
        running.sort()
        begin = running.pop(0)
    running.append(begin + latency)
    in_flight[kind] = running
    return begin


class StreamMachine:
    """One compute stream (`compute_free`: when it is free) and the async streams (`in_flight`: per stream, the
    end times of the collectives running on it)."""

    def __init__(self) -> None:
        self.compute_free = 0.0
        self.in_flight: dict[str, list[float]] = {}
        self.end = 0.0  # when the last work on any stream ends

    def compute(self, ready: float, cost: float) -> float:
        """Run `cost` of work on the compute stream once it is free and the operands are `ready`; its end."""
        start = self.compute_free if self.compute_free > ready else ready
        self.compute_free = start + cost
        self.end = max(self.end, self.compute_free)
        return self.compute_free

    def wait(self, until: float) -> float:
        """The compute stream waits until `until` (a done waiting for its collective); when it is free."""
        if until > self.compute_free:
            self.compute_free = until
        return self.compute_free

    def collective(self, issued: float, latency: float, stream: str = COLLECTIVE_STREAM, slots: int = 1) -> float:
        """Run a collective issued at `issued` on `stream` (`slots` of them at a time); when it begins (it ends
        `latency` later)."""
        begin = claim_slot(self.in_flight, stream, issued, latency, slots)
        self.end = max(self.end, begin + latency)
        return begin

    def stream_free(self, stream: str = COLLECTIVE_STREAM) -> float:
        """When the last collective issued on `stream` ends (0 before any)."""
        return max(self.in_flight.get(stream, ()), default=0.0)
