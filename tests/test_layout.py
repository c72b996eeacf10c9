"""The package's layout: the kernels and the layer (the modules at the root of moe_lab, and _kernels/) never
import the tools (moe_lab.tools), the teaching layer (moe_lab.workbook) or the integrations with other
libraries (moe_lab.integrations); those import the core."""

import ast
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "moe_lab")
OUTSIDE_THE_CORE = ("tools", "workbook", "integrations")
LAYERS = tuple(f"moe_lab.{name}" for name in OUTSIDE_THE_CORE)
# `python -m moe_lab` is the command, moe_lab.tools.cli: not a module anything imports.
NOT_IMPORTED = {"moe_lab.__main__"}


def core_modules():
    """(module name, path) of every module of the core: moe_lab/*.py and moe_lab/_kernels/ (not tools/,
    workbook/ or integrations/)."""
    found = []
    for folder, dirs, files in os.walk(PACKAGE):
        rel = os.path.relpath(folder, PACKAGE)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in OUTSIDE_THE_CORE]
        dirs[:] = [d for d in dirs if os.path.exists(os.path.join(folder, d, "__init__.py"))]
        parts = ["moe_lab"] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(files):
            if f.endswith(".py"):
                name = ".".join(parts if f == "__init__.py" else parts + [f[:-3]])
                if name not in NOT_IMPORTED:
                    found.append((name, os.path.join(folder, f)))
    return sorted(found)


CORE = core_modules()


def test_the_core_is_found():
    names = {name for name, _ in CORE}
    assert {
        "moe_lab",
        "moe_lab.layer",
        "moe_lab.gemm",
        "moe_lab.plan",
        "moe_lab.runtime",
        "moe_lab._kernels",
        "moe_lab._kernels.common",
    } <= names
    assert not any(name.startswith(LAYERS) for name in names)


def _imported(module_name: str, path: str, node: ast.AST):
    """Absolute names an import statement of `module_name` (at `path`) asks for."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module_name.split(".") if path.endswith("__init__.py") else module_name.split(".")[:-1]
        base = package[: len(package) - (node.level - 1)]
    else:
        base = []
    stem = ".".join(base + ([node.module] if node.module else []))
    return [stem] + [f"{stem}.{alias.name}" for alias in node.names]  # `from moe_lab import tools` too


@pytest.mark.parametrize("module_name,path", CORE, ids=[name for name, _ in CORE])
def test_no_core_module_imports_the_tools_or_the_workbook(module_name, path):
    """Every import statement of the file, those inside functions included (which importing it would not run)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    bad = sorted(
        {
            name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _imported(module_name, path, node)
            if name in LAYERS or name.startswith(tuple(layer + "." for layer in LAYERS))
        }
    )
    assert not bad, f"{module_name} ({os.path.relpath(path, ROOT)}) imports {bad}: the core must not"


CHILD = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print("LOADED", json.dumps(sorted(m for m in sys.modules if m == "moe_lab" or m.startswith("moe_lab."))))
"""


def test_importing_the_core_loads_neither_tools_nor_workbook():
    """Every core module imported in one fresh interpreter (moe_lab/__init__ first, as Python does): if any
    of them imported the tools or the workbook, they would be in sys.modules. One interpreter, not one per
    module: importing torch dominates, and the union of the imports shows the same thing."""
    names = [name for name, _ in CORE]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *names], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED ")]
    assert proc.returncode == 0 and lines, f"importing the core failed:\n{proc.stderr[-2000:]}"
    loaded = json.loads(lines[-1][len("LOADED ") :])
    assert set(names) <= set(loaded)
    bad = [m for m in loaded if m.startswith(LAYERS)]
    assert not bad, f"importing the core modules loaded tools or workbook modules: {bad}"


def test_import_moe_lab_loads_no_optional_library():
    """`import moe_lab` imports neither the integrations nor the libraries only they, the tools or the notebooks
    need."""
    optional = ("moe_lab.integrations", "transformers", "ipywidgets", "matplotlib", "IPython")
    code = f"import moe_lab, sys; print('LOADED', [m for m in {optional!r} if m in sys.modules])"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "LOADED []" in proc.stdout, proc.stdout + proc.stderr[-2000:]


NO_GLUON = """
import sys

class NoGluon:  # a Triton without Gluon
    def find_spec(self, name, path=None, target=None):
        if name.startswith("triton.experimental.gluon"):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoGluon())
import moe_lab

print("GLUON_FP8", callable(moe_lab.gluon_fp8.grouped_matmul_fp8_gluon))
print("SUPPORT", moe_lab.capability.gluon_fp8_support())
"""


def test_moe_lab_gluon_fp8_is_imported_with_moe_lab_even_without_gluon():
    """`moe_lab.gluon_fp8` is an attribute after `import moe_lab`, which imports Gluon itself only at the
    first launch: a Triton without Gluon still imports moe_lab, and gluon_fp8_support says why not."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", NO_GLUON], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert "GLUON_FP8 True" in proc.stdout and "has no Gluon" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_the_child_imports_this_checkout():
    """The fresh interpreters import the moe_lab of this checkout, not an installed copy elsewhere."""
    code = "import moe_lab, os; print('AT', os.path.dirname(os.path.abspath(moe_lab.__file__)))"
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    ).stdout
    assert f"AT {PACKAGE}" in out, out
