"""The packages depend one way: rayft (CLI, client) -> rayft_contract <- service; ray_jobs -> rayft_contract.

Read from the source (every ``import``, at module level or inside a function), so an import that only
runs on one code path still counts; then checked live, in a fresh interpreter, for what a client and the
service actually load.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO as ROOT

PACKAGES = ("rayft_contract", "rayft", "service", "ray_jobs")
MAY_IMPORT = {
    "rayft_contract": set(),
    "service": {"rayft_contract"},
    "ray_jobs": {"rayft_contract"},
    "rayft": {"rayft_contract", "service", "ray_jobs"},  # `rayft serve` / `rayft train`, imported lazily
}
TRAINING_STACK = ("torch", "ray.train", "ray.data", "transformers", "peft", "bitsandbytes")


def modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "_pb2" not in p.name)


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def package_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for package in PACKAGES:
        for path in modules(package):
            edges[package] |= {name.split(".")[0] for name in imports(path)} & set(PACKAGES) - {package}
    return edges


def test_each_package_imports_only_what_the_layering_allows():
    edges = package_edges()
    wrong = {p: sorted(e - MAY_IMPORT[p]) for p, e in edges.items() if e - MAY_IMPORT[p]}
    assert not wrong, f"imports against the layering: {wrong}"


def test_there_is_no_import_cycle_between_packages():
    edges = package_edges()

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(n == target or (n not in seen and reaches(n, target, seen | {n})) for n in edges[start])

    assert not [p for p in PACKAGES if reaches(p, p, set())]


@pytest.mark.parametrize("package", ["rayft_contract", "service"])
def test_the_contract_and_the_service_never_name_the_training_stack(package):
    named = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in modules(package)
        for name in imports(path)
        if any(name == heavy or name.startswith(heavy + ".") for heavy in TRAINING_STACK)
    }
    assert not named


SUBPACKAGES_MAY_IMPORT = {  # inside ray_jobs: the seams a change should not cross (ray_jobs/__init__.py)
    "cache": set(),
    "data": {"cache"},
    "observe": set(),
    "train": {"data", "cache", "observe"},
    "warm": {"train", "data", "cache", "observe"},
}
SHARED = ("storage", "chaos", "events", "background", "local_ray", "node_gpus")
"""ray_jobs' modules every subpackage may use; they import no subpackage."""


def job_edges(paths: list[Path]) -> set[str]:
    """The ray_jobs subpackages (and shared modules) that ``paths`` import, by their second name."""
    return {name.split(".")[1] for path in paths for name in imports(path) if name.startswith("ray_jobs.")}


@pytest.mark.parametrize("subpackage", sorted(SUBPACKAGES_MAY_IMPORT))
def test_each_job_subpackage_imports_only_those_below_it(subpackage):
    found = job_edges(modules(f"ray_jobs/{subpackage}")) & set(SUBPACKAGES_MAY_IMPORT) - {subpackage}
    assert found <= SUBPACKAGES_MAY_IMPORT[subpackage], f"ray_jobs.{subpackage} imports {sorted(found)}"


def test_the_jobs_shared_modules_import_no_subpackage():
    wrong = {m: sorted(e) for m in SHARED if (e := job_edges([ROOT / "ray_jobs" / f"{m}.py"]) & set(SUBPACKAGES_MAY_IMPORT))}
    assert not wrong
    assert {p.stem for p in (ROOT / "ray_jobs").glob("*.py")} >= set(SHARED)


def test_a_client_and_the_service_load_no_training_stack():
    """Import what ``rayft submit/watch/list`` and the service run, then look at ``sys.modules``."""
    light = [
        "rayft.client",
        "rayft.cli",
        "rayft.cli_service",
        "rayft.progress",
        "service.server",
        "service.app",
        "service.launcher",
        "service.store_sqlite",
        *(f"rayft_contract.{p.stem}" for p in modules("rayft_contract") if p.stem != "__init__"),
    ]
    code = (
        f"import importlib, sys\nfor m in {light!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {TRAINING_STACK!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_module_imports():
    """No module is broken on import (a moved name, a stale path), the heavy ones included."""
    names = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in PACKAGES
        for p in modules(package)
        if p.name != "__main__.py"
    ]
    code = f"import importlib\nfor m in {names!r}: importlib.import_module(m)\nprint(len({names!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_readme_layout_names_every_module():
    """The README's "How it is built" tree is how a new engineer finds their way: it must not drift."""
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## How it is built", 1)[1].split("```")[1]
    modules = [
        p.relative_to(ROOT)
        for package in ("rayft_contract", "service", "ray_jobs", "rayft")
        for p in (ROOT / package).rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "_pb2" not in p.name
    ]
    # A top-level module by its name under its package; a subpackage's as ``sub/name.py`` once its heading
    # (``sub/``) is named: the tree indents a subpackage's modules under it.
    missing = [str(p) for p in modules if (p.parts[-2] + "/" if len(p.parts) > 2 else "") + p.name not in _flat(layout)]
    assert not missing, f"add to the README's layout: {missing}"


def _flat(layout: str) -> str:
    """The layout with every module named under a subpackage's heading (``  data/``) written as ``data/name.py``."""
    out, heading, depth = [], "", 0
    for line in layout.splitlines():
        indent, words = len(line) - len(line.lstrip()), line.split()
        if heading and indent <= depth:
            heading = ""
        if indent and words and words[0].endswith("/"):
            heading, depth = words[0], indent
        elif heading:
            words = [heading + w if w.endswith(".py") else w for w in words]
        out.append(" ".join(words))
    return "\n".join(out)


NOT_ONE_MODULE = {
    "rayft_contract/test_proto.py": "the .proto against the spec, and the generated code against the .proto",
    "service/test_store_contract.py": "the JobStore protocol, run against every store",
}


def test_the_unit_tests_are_laid_out_as_the_modules_they_test():
    """``tests/unit/ray_jobs/data/test_packing.py`` tests ``ray_jobs/data/packing.py``: a module's tests are found
    where the module is, and a test file whose module moved or went away shows up here. A bench script may be a shell
    script: ``tests/unit/bench/test_scaling_2gpu.py`` tests ``bench/scaling_2gpu.sh``."""
    unit = ROOT / "tests" / "unit"
    stray = [
        str(rel)
        for path in unit.rglob("test_*.py")
        if (rel := path.relative_to(unit)).parent != Path(".")
        and str(rel) not in NOT_ONE_MODULE
        and not any((ROOT / rel.parent / f"{rel.stem.removeprefix('test_')}{ext}").exists() for ext in (".py", ".sh"))
    ]
    assert not stray, f"no module at the same path for {stray}"
