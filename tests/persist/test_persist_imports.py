"""The persistence package's layering: its format and policy are pure Python (no torch, no
tensors, no engine), and the cache never imports the package that sits above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ninfer.cache
import ninfer.persist

PURE = ("tables.py", "plan.py")
FORBIDDEN = ("torch", "ninfer.models", "ninfer.ops", "ninfer.engine", "ninfer.memory")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against ninfer.persist
                base = "ninfer.persist." + base
            names += [base] + [f"{base}.{a.name}" for a in node.names]
    return names


def _hits(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return [n for n in _imports(path) if any(n == x or n.startswith(x + ".") for x in forbidden)]


def test_format_and_policy_import_no_tensor_or_engine_code():
    root = Path(ninfer.persist.__file__).parent
    assert {p.name for p in root.glob("*.py")} >= set(PURE)
    assert {name: _hits(root / name, FORBIDDEN) for name in PURE} == {n: [] for n in PURE}


def test_the_cache_never_imports_persistence():
    files = sorted(Path(ninfer.cache.__file__).parent.glob("*.py"))
    assert len(files) >= 10
    assert [(f.name, n) for f in files for n in _hits(f, ("ninfer.persist",))] == []


def test_the_pure_modules_load_without_torch():
    """Imported in a fresh interpreter, the format and the policy pull in no torch."""
    code = (
        "import sys; import ninfer.persist.tables, ninfer.persist.plan; "
        "print(sorted(m for m in ('torch', 'ninfer.memory', 'ninfer.engine') if m in sys.modules))"
    )
    root = Path(ninfer.persist.__file__).parents[2]  # this tree's ninfer comes first
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_checker_sees_relative_and_nested_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from .payload import x\nimport torch.nn\nfrom ninfer.memory import host_slabs\n")
    assert _hits(f, FORBIDDEN) == ["torch.nn", "ninfer.memory", "ninfer.memory.host_slabs"]
