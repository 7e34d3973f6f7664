"""ninfer/cache is pure Python: no torch, and none of models / ops / engine / memory."""

from __future__ import annotations

import ast
from pathlib import Path

import ninfer.cache

FORBIDDEN = ("torch", "ninfer.models", "ninfer.ops", "ninfer.engine", "ninfer.memory")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against ninfer.cache
                names.append("ninfer.cache." + (node.module or ""))
            else:
                names.append(node.module or "")
    return names


def test_cache_package_imports_no_tensor_or_engine_code():
    files = sorted(Path(ninfer.cache.__file__).parent.glob("*.py"))
    assert len(files) >= 10
    bad = [
        (f.name, name)
        for f in files
        for name in _imports(f)
        if any(name == x or name.startswith(x + ".") for x in FORBIDDEN)
    ]
    assert bad == []


def test_checker_catches_a_forbidden_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom torch import nn\nimport ninfer.memory.kv_pool as k\n")
    assert _imports(f) == ["os", "torch", "ninfer.memory.kv_pool"]
