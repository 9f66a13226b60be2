"""Modules that moved into subpackages (`passes.framework`, `passes.fusion`, `passes.collectives`,
`runtime.execution`, `runtime.jax_integration`, `runtime.xla_gpu_path`, `runtime.tuning`): their old paths
still import, as the same module object, with a DeprecationWarning; nothing in the repository uses them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from hlopt._moved import MOVED

ROOT = Path(__file__).resolve().parent.parent


def test_old_paths_give_the_moved_module_with_a_deprecation_warning():
    code = (
        "import importlib, json, sys, warnings\n"
        "from hlopt._moved import MOVED\n"
        "out = {}\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    out[old] = [module is importlib.import_module(new),\n"
        "                any(w.category is DeprecationWarning and new in str(w.message) for w in seen)]\n"
        "from hlopt.passes import priority_fusion\n"
        "out['from-import'] = [priority_fusion.__name__ == 'hlopt.passes.fusion.priority_fusion', True]\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result) == len(MOVED) + 1
    assert {k: v for k, v in result.items() if v != [True, True]} == {}


def test_nothing_in_the_repository_uses_an_old_path():
    old = re.compile(r"(?<![\w.])(" + "|".join(re.escape(o) for o in MOVED) + r")(?!\w)")
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    users = [f"{name}: {m.group(1)}" for name in files if name != "hlopt/_moved.py" and (ROOT / name).is_file()
             for m in old.finditer((ROOT / name).read_text())]
    assert users == []
