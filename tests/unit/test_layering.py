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

ROOT = Path(__file__).resolve().parents[2]
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
        p
        for package in ("rayft_contract", "service", "ray_jobs", "rayft")
        for p in (ROOT / package).glob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    ]
    missing = [f"{p.parent.name}/{p.name}" for p in modules if p.name not in layout]
    assert not missing, f"add to the README's layout: {missing}"
