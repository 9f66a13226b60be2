"""benchmarks/priority_fusion_split.py: priority-fusion's time split into building, priority updates, the
never-slower check and the rest, on a small transformer step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hlopt.corpus.transformer import module_of_size
from hlopt.hlo import parse
from hlopt.passes.fusion import fusion_building
from hlopt.passes.fusion import priority_fusion as pf


def test_split_adds_up_and_puts_the_pass_back():
    from benchmarks.priority_fusion_split import measure

    text, _ = module_of_size(1_000)
    got = measure(text, repeat=1)
    parts = got["parts"]
    assert set(parts) == {"building", "priority updates", "never-slower check", "rest"}
    timed = parts["building"] + parts["priority updates"] + parts["never-slower check"]
    assert 0 < timed <= got["seconds_timed"] and parts["rest"] >= 0
    assert abs(sum(parts.values()) - got["seconds_timed"]) < 1e-9
    assert got["decisions_seconds"] == got["seconds_timed"] - parts["building"]
    calls = got["calls"]
    # every fusion is built and then its operands' priorities are updated: more updates than builds
    assert 0 < calls["building"] < calls["priority updates"]
    assert calls["never-slower check"] > 0
    assert got["instructions_to_fuse"] < parse(text).instruction_count()  # simplified first, as -p default does
    assert got["output_instructions"] > got["instructions_to_fuse"]  # fused computations counted too
    # the timers are gone: the pass calls the builders and its own methods again
    assert pf.fuse_producer is fusion_building.fuse_producer
    assert pf.fuse_into_new_fusion is fusion_building.fuse_into_new_fusion
    queue = pf._Queue  # noqa: SLF001 - the benchmark wraps the queue's own methods
    assert queue.push.__qualname__ == "_Queue.push" and queue.check.__qualname__ == "_Queue.check"


def test_missing_file_is_one_error_line():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "priority_fusion_split.py"
    proc = subprocess.run([sys.executable, str(script), "--hlo", "/no/such/module.hlo"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "priority_fusion_split: error: [Errno 2] No such file or directory: '/no/such/module.hlo'"]
