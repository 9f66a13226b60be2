"""A stream-aware forward list schedule (not an XLA rule): one more candidate order for the portfolio.

XLA's latency-hiding scheduler works bottom-up and never looks at when the collective stream will run
out of work. On XLA:GPU's machine (every async collective on the one collective stream, one after
another: `async_ops`), the stream is often the bottleneck, and then what matters is that it never idles:
the next collective must be issued (its start reached by the compute stream) by the time the previous
one ends. This scheduler builds the program order top-down while simulating both streams (the same
model as `simulator.simulate`):

- a done whose collective has ended is placed at once (it costs nothing and frees a slot);
- a ready start is issued as soon as its stream has a free slot (the stream's overlap limit counts the
  starts issued whose dones are not placed yet); among several, the one with the longest path after it
  (its node `height`: the collective, then what waits for it) goes first, so the stream runs the
  collectives the critical path needs before the ones nothing waits for (Jackson's rule, longest tail
  first);
- otherwise compute runs, the ready node with the longest path to the end first, except where the stream
  is the bottleneck (its remaining work from when it is next free is at least the compute stream's): then
  a start held back by the overlap limit makes the compute stream pick work that ends before the stream
  runs dry, or wait for the done where nothing fits, and a stream about to run dry with no collective
  ready makes it run the compute node that completes a start's operands first.

Its order is a topological order of the `ScheduleGraph` (operands, control and loop-carried edges), so it
is as legal as the list schedule's; the latency-hiding scheduler keeps it only where it simulates
shorter (`latency_hiding_scheduler._best_of_alternatives`).
"""

from __future__ import annotations

import heapq

from hlopt.cost_model.streams import claim_slot
from hlopt.scheduler.async_ops import stream_slots
from hlopt.scheduler.graph import Node, ScheduleGraph

__all__ = ["forward_schedule"]

_EPS = 1e-9
#: How many more critical collectives, and how many of their unplaced ancestors, `_defer` looks at.
LOOKAHEAD_STARTS = 4
LOOKAHEAD_NODES = 200
SCAN_PENDING = 64
ENABLER_NODES = 16
#: How many ready compute nodes (in heap order, best first roughly) a step looks at for one that fits.
FIT_SCAN = 256
FIT_SCAN_STARTS = 64


class _Stream:
    """One async resource: its collectives run one after another (`slots` at a time), `limit` in flight."""

    def __init__(self, limit: int, slots: int):
        self.limit = limit
        self.slots = slots
        self.ends: list[float] = []  # when the collectives issued on it end (the running ones)
        self.free = 0.0  # when its last issued collective ends
        self.in_flight: list[Node] = []  # issued starts whose dones are not placed, oldest first
        self.remaining = 0.0  # latency of its collectives not issued yet

    def claim(self, now: float, latency: float) -> float:
        """When a collective issued at `now` begins (the machine's rule, `cost_model.streams.claim_slot`)."""
        in_flight = {"stream": self.ends}
        begin = claim_slot(in_flight, "stream", now, latency, self.slots)
        self.ends = in_flight["stream"]
        self.free = max(self.free, begin + latency)
        return begin


class _Pending:
    """The starts of one stream not issued yet that are not ready, by static depth (the order they
    roughly become ready in), with lazy removal."""

    def __init__(self, starts: list[Node]):
        self.items = sorted(starts, key=lambda n: (n.depth, n.index))
        self.gone: set[Node] = set()
        self.head = 0

    def discard(self, n: Node) -> None:
        self.gone.add(n)

    def first(self, count: int, above: float = -1.0) -> list[Node]:
        """Up to `count` of them with a `height` above `above`, shallowest first (at most SCAN_PENDING
        looked at)."""
        items, gone = self.items, self.gone
        while self.head < len(items) and items[self.head] in gone:
            self.head += 1
        out: list[Node] = []
        for k in range(self.head, min(len(items), self.head + SCAN_PENDING)):
            n = items[k]
            if n not in gone and n.height > above:
                out.append(n)
                if len(out) >= count:
                    break
        return out


class _Forward:
    """The state of one forward schedule (`forward_schedule`)."""

    def __init__(self, graph: ScheduleGraph, limits: dict[str, int], feed_streams: bool = True):
        self.graph = graph
        self.feed_streams = feed_streams
        self.nodes = graph.nodes
        self.missing = {n: len(n.preds) for n in self.nodes}
        self.latency: dict[Node, float] = {}
        self.done_of: dict[Node, Node] = {}
        self.start_of: dict[Node, Node] = {}
        self.streams: dict[str, _Stream] = {}
        for n in self.nodes:
            if n.is_start and n.kind:
                done = next((s for s, _ in n.succs if s.is_done), None)
                lat = next((lat for s, lat in n.succs if s is done), 0.0)
                self.latency[n] = lat
                if done is not None:
                    self.done_of[n], self.start_of[done] = done, n
                if n.kind not in self.streams:
                    limit = limits.get(n.kind, limits.get("default", 1))
                    self.streams[n.kind] = _Stream(max(limit, 1), stream_slots(limit))
                self.streams[n.kind].remaining += lat
        self.comm_end: dict[Node, float] = {}
        self.finish: dict[Node, float] = {}  # placed nodes: when they finish (a start: when it is issued)
        self.pending = {kind: _Pending([n for n in self.latency if n.kind == kind]) for kind in self.streams}
        self.t = 0.0
        self.remaining_compute = sum(n.cost for n in self.nodes)
        self.order: list[Node] = []
        self.compute: list[tuple[float, int, Node]] = []  # heap: (-height, index, node), lazy removal
        self.taken: set[Node] = set()  # nodes placed out of their heap's order (lazy removal)
        self.starts: dict[str, list[tuple[float, int, Node]]] = {k: [] for k in self.streams}  # ready, by height
        self.dones: list[Node] = []  # ready (their start issued and other operands placed)
        self.deferred: dict[str, tuple[Node, float, float] | None] = {}  # `_deferral`'s memory per stream
        for n in self.nodes:
            if self.missing[n] == 0:
                self._ready(n)

    def _ready(self, n: Node) -> None:
        if n in self.latency:
            self.pending[n.kind].discard(n)
            heapq.heappush(self.starts[n.kind], (-n.height, n.index, n))
        elif n.is_done and n.kind:
            self.dones.append(n)
        else:
            heapq.heappush(self.compute, (-n.height, n.index, n))

    def place(self, n: Node) -> None:
        """Append `n` to the order and advance the simulation."""
        self.order.append(n)
        if n in self.latency:  # an overlapped start: its collective goes on its stream
            stream = self.streams[n.kind]
            self.comm_end[n] = stream.claim(self.t, self.latency[n]) + self.latency[n]
            stream.in_flight.append(n)
            stream.remaining -= self.latency[n]
        elif n in self.start_of:
            start = self.start_of[n]
            self.t = max(self.t, self.comm_end[start])
            stream = self.streams[start.kind]
            if start in stream.in_flight:
                stream.in_flight.remove(start)
        else:
            self.t += n.cost
            self.remaining_compute -= n.cost
        self.finish[n] = self.t
        for s, _ in n.succs:
            self.missing[s] -= 1
            if self.missing[s] == 0:
                self._ready(s)

    def _issue_starts(self) -> bool:
        """Issue the best ready start of each stream with a free slot, unless a more critical collective
        of its stream will be ready before it would end (`_defer`); True if one was issued."""
        issued = False
        for kind, heap in self.starts.items():
            stream = self.streams[kind]
            while self._top_start(heap) is not None and len(stream.in_flight) < stream.limit:
                deadline = self._deferral(kind, heap[0][2])
                if deadline is None:
                    self.place(heapq.heappop(heap)[2])
                else:
                    fit = self._fitting_start(heap, max(self.t, stream.free), deadline)
                    if fit is None:
                        break
                    self.taken.add(fit)
                    self.place(fit)
                issued = True
        return issued

    def _deferral(self, kind: str, s: Node) -> float | None:
        """`_defer(s)`, remembered while `s` stays the stream's best ready start, now is before the time
        it was deferred to, and nothing was issued on its stream (only compute ran: waiting stays better)."""
        cached = self.deferred.get(kind)
        stream = self.streams[kind]
        if cached is not None and cached[0] is s and self.t < cached[1] - _EPS and cached[2] == stream.free:
            return cached[1]
        deadline = self._defer(s)
        self.deferred[kind] = (s, deadline, stream.free) if deadline is not None else None
        return deadline

    def _top_start(self, heap: list[tuple[float, int, Node]]) -> Node | None:
        """The best ready start of a stream (None if none), dropping those already placed."""
        while heap and heap[0][2] in self.taken:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _fitting_start(self, heap: list[tuple[float, int, Node]], begin: float, deadline: float) -> Node | None:
        """Among (a prefix of) the ready starts `heap`, the longest collective that, begun at `begin`, ends
        by `deadline` (fills the stream's idle time before a more critical one is ready)."""
        best = None
        for _, _, n in heap[:FIT_SCAN_STARTS]:
            lat = self.latency[n]
            if n not in self.taken and lat > 0 and begin + lat <= deadline + _EPS and \
                    (best is None or lat > self.latency[best]):
                best = n
        return best

    def _defer(self, s: Node) -> float | None:
        """Whether issuing `s` now would delay a more critical collective of its stream (larger `height`)
        that will be ready before `s` ends, by more than leaving the stream idle until it is ready costs:
        the two orders' makespans estimated from the ready time, the collectives' heights and the
        stream's remaining work. Returns that ready time (None: issue `s`)."""
        stream = self.streams[s.kind]
        begin = max(self.t, stream.free)
        lat = self.latency[s]
        rest = stream.remaining  # s included
        for c in self.pending[s.kind].first(LOOKAHEAD_STARTS, s.height):
            ready = self._estimated_ready(c)
            if ready is None or ready >= begin + lat - _EPS:
                continue
            issue_first = max(begin + lat + c.height, begin + rest)
            wait = max(ready, begin) + max(c.height, rest)
            if wait < issue_first - _EPS:
                return ready
        return None

    def _estimated_ready(self, c: Node) -> float | None:
        """The earliest time `c` can be ready: the longest path from the placed nodes (their finish times)
        and now through its unplaced ancestors, and now plus their total cost (the compute stream runs
        them one after another); None where more than LOOKAHEAD_NODES unplaced ancestors (far away)."""
        est: dict[Node, float] = {}
        stack = [(c, False)]
        while stack:
            v, expanded = stack.pop()
            if v in est:
                continue
            pending = [p for p, _ in v.preds if p not in self.finish and p not in est]
            if pending and not expanded:
                if len(est) + len(stack) > LOOKAHEAD_NODES:
                    return None
                stack.append((v, True))
                stack.extend((p, False) for p in pending)
                continue
            ready = self.t
            for p, lat in v.preds:
                if p in self.finish:
                    end = self.comm_end.get(p, self.finish[p]) if lat else self.finish[p]
                else:
                    end = est[p] + p.cost + lat
                if end > ready:
                    ready = end
            est[v] = ready
        work = sum(v.cost for v in est if v is not c)  # the unplaced ancestors, one after another
        return max(est[c], self.t + work)

    def _end_of(self, done: Node) -> float:
        start = self.start_of.get(done)
        return self.comm_end.get(start, 0.0) if start is not None else 0.0

    def _place_ended_dones(self) -> bool:
        """Place every ready done whose collective has ended by now; True if one was placed."""
        ended = [d for d in self.dones if self._end_of(d) <= self.t + _EPS]
        if not ended:
            return False
        for d in sorted(ended, key=lambda d: d.index):
            self.dones.remove(d)
            self.place(d)
        return True

    def _best_compute(self) -> Node | None:
        heap = self.compute
        while heap and heap[0][2] in self.taken:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def _stream_critical(self, stream: _Stream) -> bool:
        """Its work left from when it is next free ends no earlier than the compute stream's work left."""
        return max(stream.free, self.t) + stream.remaining >= self.t + self.remaining_compute - _EPS

    def _held_back(self) -> tuple[_Stream, Node] | None:
        """A critical stream with a ready start held back by its overlap limit, and the done to place."""
        for kind, heap in self.starts.items():
            stream = self.streams[kind]
            if self._top_start(heap) is not None and len(stream.in_flight) >= stream.limit and \
                    self._stream_critical(stream):
                oldest = self.done_of.get(stream.in_flight[0])
                if oldest is not None and oldest in self.dones:
                    return stream, oldest
        return None

    def _fitting(self, deadline: float) -> Node | None:
        """The best of (a prefix of) the ready compute nodes that ends by `deadline`."""
        best = None
        for key in self.compute[:FIT_SCAN]:
            n = key[2]
            if n not in self.taken and self.t + n.cost <= deadline + _EPS and (best is None or key < best):
                best = key
        return best[2] if best is not None else None

    def _enabler(self, candidate: Node) -> Node | None:
        """Where a stream runs dry before `candidate` ends with no start ready to issue: a ready compute
        node on the way to the start that the least compute makes ready (among the first
        2 * LOOKAHEAD_STARTS pending ones by static depth; ties: the longer path after it)."""
        for kind, stream in self.streams.items():
            if stream.remaining <= 0 or stream.free > self.t + candidate.cost or self._top_start(self.starts[kind]) or \
                    len(stream.in_flight) >= stream.limit:
                continue
            best = None
            for start in self.pending[kind].first(2 * LOOKAHEAD_STARTS):
                found = self._unplaced_compute_ancestors(start)
                if found is None or found[1] is None:
                    continue
                key = (found[0], -start.height, start.index)
                if best is None or key < best[0]:
                    best = (key, found[1])
            if best is not None:
                return best[1]
        return None

    def _unplaced_compute_ancestors(self, start: Node) -> tuple[float, Node | None] | None:
        """(total cost, a ready one) of the unplaced ancestors of `start`; None where one is an async op or
        there are more than ENABLER_NODES."""
        seen: set[Node] = set()
        stack = [p for p, _ in start.preds if p not in self.finish]
        ready = None
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            if v.is_start or v.is_done or len(seen) >= ENABLER_NODES:
                return None
            seen.add(v)
            if self.missing[v] == 0 and (ready is None or v.index < ready.index):
                ready = v
            stack.extend(p for p, _ in v.preds if p not in self.finish)
        return sum(v.cost for v in seen), ready

    def _wait_for(self, done: Node) -> None:
        self.dones.remove(done)
        self.place(done)

    def step(self) -> None:
        """Place the next node."""
        if self._place_ended_dones() or self._issue_starts():
            return
        best = self._best_compute()
        if best is None:  # nothing to compute: wait for the collective ending first
            if not self.dones:
                raise RuntimeError(f"forward schedule of {self.graph.comp.name} is stuck")
            self._wait_for(min(self.dones, key=lambda d: (self._end_of(d), d.index)))
            return
        held = self._held_back()
        choice = best
        if held is not None:
            stream, done = held
            if self.t + best.cost > stream.free + _EPS:
                fit = self._fitting(stream.free)
                if fit is not None:
                    choice = fit
                elif self._end_of(done) < self.t + best.cost - _EPS:
                    self._wait_for(done)
                    return
        elif self.feed_streams:
            choice = self._enabler(best) or best
        if choice is best:
            heapq.heappop(self.compute)
        else:
            self.taken.add(choice)
        self.place(choice)

    def run(self) -> list[Node]:
        """The whole order."""
        total = len(self.nodes)
        while len(self.order) < total:
            self.step()
        return self.order


def forward_schedule(graph: ScheduleGraph, limits: dict[str, int], feed_streams: bool = True) -> list[Node]:
    """The stream-aware forward list schedule of `graph`'s computation (module docstring) under the
    overlap `limits` per resource ("default" for the rest), in program order; `feed_streams=False` leaves
    out the compute picked to make a start ready for a stream about to run dry."""
    return _Forward(graph, limits, feed_streams).run()
