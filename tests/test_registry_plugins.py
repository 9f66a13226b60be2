"""Plugins of other packages: passes through the `hlopt.passes` entry points (importlib.metadata), named
pipelines through `register_pipeline`; hlopt's own passes and pipelines need neither (hlopt/pipelines.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

from hlopt.passes import ModulePass, register
from hlopt.passes.framework.pipeline import register_pipeline


@register
@dataclass(frozen=True)
class CountAdds(ModulePass):
    """Counts adds (changes nothing)."""

    name: ClassVar[str] = "count-adds-entry-point"
    threshold: int = 1

    def run(self, module) -> bool:
        return False


register_pipeline("count-then-clean", "count-adds-entry-point{threshold=3},cleanup")
'''

PROBE = '''
import json, sys
from hlopt.passes.framework.pipeline import NAMED_PIPELINES, parse_pipeline
own = [p.name for p in parse_pipeline("default")][-1]
metadata_for_own = "importlib.metadata" in sys.modules
plugin = [p.describe() if hasattr(p, "describe") else p.name for p in parse_pipeline("count-then-clean")]
print(json.dumps({"own": own, "metadata_for_own": metadata_for_own, "plugin": plugin,
                  "named": "count-then-clean" in NAMED_PIPELINES}))
'''


def _installed_plugin(tmp_path: Path) -> Path:
    """A distribution on `tmp_path` declaring one `hlopt.passes` entry point, as pip would install it."""
    (tmp_path / "hlopt_count_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "hlopt_count_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hlopt-count-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hlopt.passes]\ncount-adds-entry-point = hlopt_count_plugin:CountAdds\n")
    return tmp_path


def test_an_installed_plugin_registers_a_pass_and_a_named_pipeline_through_entry_points(tmp_path):
    site = _installed_plugin(tmp_path)
    env_path = f"{site}:{ROOT}"
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": env_path})
    got = json.loads(out.stdout)
    assert got["own"] == "latency-hiding-scheduler"
    assert got["metadata_for_own"] is False  # hlopt's own pipelines read no distribution's metadata
    assert got["plugin"] == ["count-adds-entry-point{threshold=3}", "fix(tuple-simplifier,dce)"]
    assert got["named"] is True


def test_a_spec_naming_an_unknown_pipeline_is_still_an_unknown_pass():
    import pytest
    from hlopt.passes.framework.pipeline import PipelineError, parse_pipeline

    with pytest.raises(PipelineError, match="unknown pass 'defualt'; did you mean default"):
        parse_pipeline("defualt")
