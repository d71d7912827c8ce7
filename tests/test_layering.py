"""The package's floors: each module imports only its own floor and the floors below it."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "bfp"
# Bottom to top (docs/architecture.md). A module may import its own floor and lower ones.
FLOORS = ["formats", "kernels", "precision", "hadamard", "tensorcore", "accumulate", "overflow", "quantizer", "functional", "layers", "census", "trace", "attention", "routes", "config", "coverage", "conversion", "diagnostics",
          "models", "amp", "optim", "distributed", "integrations", "data", "engine", "dynamic", "cli", "experiments"]
# Imports inside functions that reach bfp modules on purpose: backends that load on first use.
# (The backends' own modules load through bfp.kernels.runtime, by name, not by import statements.)
LAZY_OK = {("kernels", "bfp.kernels.triton_cuda.element")}
# The backend room: only bfp/kernels/runtime.py reaches a fast backend's folder (by name, on first use).
BACKEND_FOLDERS = ("bfp.kernels.numba_cpu", "bfp.kernels.triton_cuda")


def floor_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bfp_imports(name: str, is_package: bool, source: str):
    """(imported bfp module, line, inside a function) for every import in module ``name``."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(source)
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    in_func = {id(x) for f in funcs for x in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t == "bfp" or t.startswith("bfp."):
                yield t, node.lineno, id(node) in in_func


MODULES = sorted(p for p in PKG.rglob("*.py") if p != PKG / "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_module_imports_only_its_floor_and_below(path):
    own = floor_of(module_name(path))
    assert own in FLOORS, f"{path}: floor {own!r} is not in the layering list; add it to FLOORS and the docs"
    for target, line, lazy in bfp_imports(module_name(path), path.name == "__init__.py",
                                          path.read_text(encoding="utf-8")):
        where = f"{path.relative_to(PKG.parent)}:{line} imports {target}"
        if target in ("bfp", "bfp.__version__"):
            assert target == "bfp.__version__", f"{where}: import the sibling module, not the package root"
            continue
        floor = floor_of(target)
        assert floor in FLOORS, where
        assert FLOORS.index(floor) <= FLOORS.index(own), f"{where}: an upward import ({own} is below {floor})"
        assert not lazy or (own, target) in LAZY_OK, f"{where}: inside a function; import it at the top"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_outside_a_backend_folder_imports_a_backend(path):
    """Backends are reached through ``bfp.kernels.runtime.kernel(entry, backend)``: a module outside
    a backend's folder never imports one (adding a backend touches its folder and the registry)."""
    name = module_name(path)
    if name.startswith(BACKEND_FOLDERS):
        return
    for target, line, _ in bfp_imports(name, path.name == "__init__.py", path.read_text(encoding="utf-8")):
        assert not target.startswith(BACKEND_FOLDERS), \
            f"{path.relative_to(PKG.parent)}:{line} imports {target}; use bfp.kernels.runtime.kernel(...)"


def test_the_registry_says_what_each_backend_covers_and_loads_on_first_use():
    from bfp.kernels import runtime
    cov = runtime.covers()
    assert {"rule", "nvfp4", "scaled_tensorwise", "scaled_rowwise", "amax", "hadamard_rows", "hadamard_nvfp4",
            "fused_accumulator", "inplace"} <= set(cov["triton"])
    assert {"rule", "nvfp4", "scaled", "fused_accumulator"} <= set(cov["cpu"])
    assert set(cov["reference"]) >= set(cov["cpu"]) | set(cov["triton"])
    assert runtime.kernel("threads", "triton") is None  # no kernel: the caller's own path runs
    assert runtime.kernel("rule", "cuda") is runtime.kernel("rule", "triton")  # the earlier name
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        runtime.register("rule", "gpu", "x:y")


def test_importing_the_engine_loads_neither_the_cli_nor_dynamic_precision():
    code = ("import sys, bfp.engine; "
            "print(sorted(m for m in sys.modules if m.startswith(('bfp.cli', 'bfp.dynamic'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_checker_sees_upward_and_function_level_imports():
    src = "from ..cli import main\nimport bfp.formats\n\ndef f():\n    from ..conversion import convert\n"
    assert list(bfp_imports("bfp.engine.probe", False, src)) == [
        ("bfp.cli", 1, False), ("bfp.formats", 2, False), ("bfp.conversion", 5, True)]


def test_no_two_modules_import_each_other():
    """A module and one it imports (at the top or inside a function) never import each other back:
    what both need lives in a third module below them (e.g. bfp/kernels/nvfp4_codes.py)."""
    names = {module_name(p): p for p in MODULES}
    edges = {}
    for name, path in names.items():
        targets = {t for t, _, _ in bfp_imports(name, path.name == "__init__.py", path.read_text(encoding="utf-8"))}
        # "from .x import y" names module x, or a package's submodule y: keep what is a module here
        edges[name] = {t for t in targets if t in names and t != name}
    pairs = sorted({tuple(sorted((a, b))) for a, ts in edges.items() for b in ts if a in edges.get(b, ())
                    and not (a.startswith(b + ".") or b.startswith(a + "."))})
    assert not pairs, f"modules that import each other: {pairs}"
