"""The layers of hlopt: hlo < cost_model < passes < scheduler < runtime < cli < corpus, no import going upward.

Structure only (no jax): every import statement of every module, lazy imports inside functions included, is
read with `ast`; so are module names written as strings (`importlib.import_module` lists such as
`passes.BUILTIN_PASS_MODULES`). Passes of a higher layer register in hlopt/pipelines.py, with the named pipelines.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("hlo", "cost_model", "passes", "scheduler", "runtime", "cli", "corpus")
_MODULE_STRING = re.compile(r"^hlopt\.(\w+)(\.\w+)*$")


def _imported_packages(node: ast.AST) -> list[str]:
    """The hlopt subpackages an import node (or a module-name string) refers to."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
        if node.module == "hlopt":
            names += [f"hlopt.{a.name}" for a in node.names]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
        names = [node.value]
    return [n.split(".")[1] for n in names if n.startswith("hlopt.") and n.split(".")[1] in LAYERS]


def upward_imports(layer: str) -> list[str]:
    """'file:line: imports hlopt.X' for every reference from `layer` to a layer above it."""
    rank = LAYERS.index(layer)
    found = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for package in _imported_packages(node):
                if LAYERS.index(package) > rank:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports hlopt.{package}")
    return found


@pytest.mark.parametrize("layer", LAYERS)
def test_no_import_goes_upward(layer):
    assert upward_imports(layer) == []


def test_the_check_sees_lazy_and_string_imports(tmp_path):
    tree = ast.parse("def f():\n    from hlopt.runtime import jit\n    import hlopt.cli.main\n"
                     "    from hlopt import scheduler\nMODS = ['hlopt.scheduler.fill']\n")
    seen = [p for node in ast.walk(tree) for p in _imported_packages(node)]
    assert sorted(seen) == ["cli", "runtime", "scheduler", "scheduler"]


def test_cli_subcommands_live_in_the_cli_package():
    assert not (ROOT / "cost_model" / "cli.py").exists()
    assert not (ROOT / "scheduler" / "cli.py").exists()
    assert (ROOT / "cli" / "cost.py").is_file() and (ROOT / "cli" / "schedule.py").is_file()


def _names_module(tree: ast.AST, module: str) -> bool:
    """Whether `tree` imports `module` or writes its name as a string (docstrings aside)."""
    parent, _, leaf = module.rpartition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == module for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module == module or (
                node.module == parent and any(a.name == leaf for a in node.names))):
            return True
        if isinstance(node, ast.Constant) and node.value == module:
            return True
    return False


def test_named_pipelines_and_scheduler_passes_live_in_one_module_above_the_scheduler():
    """hlopt/pipelines.py names every pipeline and imports the scheduler's passes; it imports nothing above the
    scheduler, `passes/` reaches it only through the registry's OWN_PLUGIN_MODULE, and no product code reads
    pyproject.toml at run time (hlopt declares no entry points of its own)."""
    tree = ast.parse((ROOT / "hlopt" / "pipelines.py").read_text())
    used = {p for node in ast.walk(tree) for p in _imported_packages(node)}
    assert used == {"passes", "scheduler"}
    naming = sorted(str(p.relative_to(ROOT)) for layer in LAYERS for p in (ROOT / layer).rglob("*.py")
                    if _names_module(ast.parse(p.read_text()), "hlopt.pipelines"))
    assert naming == ["passes/framework/registry.py"]
    readers = sorted(str(p.relative_to(ROOT)) for layer in (*LAYERS, "hlopt") for p in (ROOT / layer).rglob("*.py")
                     if "pyproject" in p.read_text() and p != ROOT / "hlopt" / "__init__.py")
    assert readers == []
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "hlopt.passes" not in project.get("entry-points", {})
    from hlopt.passes import BUILTIN_PASS_MODULES
    from hlopt.passes.framework.registry import OWN_PLUGIN_MODULE

    assert all(m.startswith("hlopt.passes.") for m in BUILTIN_PASS_MODULES)
    assert OWN_PLUGIN_MODULE == "hlopt.pipelines"


def test_registry_finds_the_scheduler_passes_by_name_and_in_named_pipelines():
    from hlopt.passes.framework.pipeline import parse_pipeline
    from hlopt.passes.framework.registry import get_pass, registered_passes

    assert get_pass("latency-hiding-scheduler").__module__ == "hlopt.scheduler.latency_hiding_scheduler"
    assert {"async-collective-creator", "latency-hiding-scheduler"} <= set(registered_passes())
    assert parse_pipeline("default")[-1].name == "latency-hiding-scheduler"


def test_nothing_names_the_old_cli_modules():
    old = ("hlopt.scheduler" + ".cli", "hlopt.cost_model" + ".cli")
    users = [str(p.relative_to(ROOT)) for folder in ("benchmarks", "examples", "tests", *LAYERS)
             for p in (ROOT / folder).rglob("*.py") if any(o in p.read_text() for o in old)]
    assert users == []


def _structure_test_files() -> list[Path]:
    """The pass test files whose numerics live apart (`test_X.py` beside `test_X_numerics.py`)."""
    tests = ROOT / "tests"
    return sorted(tests / p.name.replace("_numerics.py", ".py") for p in tests.glob("test_*_numerics.py"))


def test_structure_tests_import_no_jax():
    files = _structure_test_files()
    assert {"test_priority_fusion.py", "test_multi_output_fusion.py", "test_match.py"} <= {f.name for f in files}
    for path in files:  # nothing that runs XLA is imported: not jax, not the runtime, not the jax-built corpus
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in ("jax", "jaxlib", "corpus", "benchmarks")
                   or n.startswith(("hlopt.runtime", "hlopt.corpus"))]
            assert not bad, f"{path.name}:{node.lineno} imports {bad}"
    code = "; ".join(f"import {f.stem}" for f in files) + "; print(sorted(m for m in sys.modules if m.startswith('jax')))"
    out = subprocess.run([sys.executable, "-c", "import sys; " + code], cwd=ROOT / "tests", capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_pipeline_of_built_in_passes_imports_neither_pydantic_nor_importlib_metadata():
    """`hlopt opt -p default` pays for neither at start-up: the built-in device specs are package data, option
    values of their plain type need no pydantic check, and the scheduler's passes load with the named pipelines
    (hlopt/pipelines.py) without reading every installed distribution's entry points."""
    code = ("import sys; from hlopt.passes.framework.pipeline import Pipeline; "
            "p = Pipeline.parse('default,collective-pipeliner{op=all-gather:reduce-scatter,cost_model=b200}'); "
            "from hlopt.cost_model import get_device; get_device('a100'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic' or m == 'importlib.metadata'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_benchmarks_and_tests_set_up_no_import_path():
    """The corpus is the installed `hlopt.corpus`: nothing in benchmarks/ or tests/ edits sys.path."""
    found = []
    for folder in ("benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                        and node.value.id == "sys"):
                    found.append(f"{name}:{node.lineno}")
    assert found == []


def test_a_benchmark_imports_no_other_benchmark_nor_a_test_module():
    """A benchmark runs as `python3 benchmarks/x.py` (no package around it): what it shares comes from hlopt."""
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.split(".")[0] in ("benchmarks", "conftest", "corpus", "tests")
                   or n.startswith("test_")]
            found += [f"{path.name}:{node.lineno} imports {n}" for n in bad]
    assert found == []


def test_a_benchmark_runs_as_a_script_from_anywhere(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "parse_print.py"), "--help"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr[-2000:]
