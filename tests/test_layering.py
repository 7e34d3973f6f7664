"""The import rules of the model / ops seam and the executor, read from the source (every
`import`, lazy or type-only included):

    ninfer/forward.py     imports nothing from ninfer: it sits below models and ops
    ninfer/ops/           imports nothing from models, engine, memory or cache
    ninfer/engine/        only its executor (ninfer/engine/executor/) imports ninfer.ops
"""

from __future__ import annotations

import ast
from pathlib import Path

import ninfer

ROOT = Path(ninfer.__file__).parent


def _imports(path: Path, package: str | None = None) -> list[str]:
    """Absolute module names `path` imports, relative imports resolved against its package
    (`package`, default: where `path` lies under ninfer/)."""
    package = package or ".".join(("ninfer", *path.relative_to(ROOT).parent.parts))
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.append(".".join(anchor + ([node.module] if node.module else [])))
            else:
                names.append(node.module or "")
            names += [f"{names[-1]}.{a.name}" for a in node.names]
    return names


def _violations(
    files: list[Path], forbidden: tuple[str, ...], package: str | None = None
) -> list[tuple[str, str]]:
    """(file, imported name) for every import of a `forbidden` module or one below it."""
    return sorted(
        {
            (f.name if package else str(f.relative_to(ROOT)), name)
            for f in files
            for name in _imports(f, package)
            if any(name == x or name.startswith(x + ".") for x in forbidden)
        }
    )


def test_forward_imports_nothing_from_ninfer():
    assert _violations([ROOT / "forward.py"], ("ninfer",)) == []


def test_ops_import_no_model_engine_memory_or_cache_code():
    files = sorted((ROOT / "ops").rglob("*.py"))
    assert len(files) >= 15
    forbidden = ("ninfer.models", "ninfer.engine", "ninfer.memory", "ninfer.cache")
    assert _violations(files, forbidden) == []


def test_only_the_executor_imports_ops_in_the_engine():
    files = sorted((ROOT / "engine").rglob("*.py"))
    outside = [f for f in files if "executor" not in f.relative_to(ROOT).parts]
    assert len(outside) >= 5 and len(outside) < len(files)
    assert _violations(outside, ("ninfer.ops",)) == []
    inside = [f for f in files if f not in outside]
    assert ("engine/executor/backend.py", "ninfer.ops.cuda.CudaOps") in _violations(
        inside, ("ninfer.ops",)
    )


def test_checker_sees_lazy_relative_and_from_imports(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text(
        "import torch\nfrom ..ops import base\ndef g():\n    from ninfer.ops.cuda import passmeta\n"
    )
    assert sorted(_imports(probe, "ninfer.engine")) == [
        "ninfer.ops", "ninfer.ops.base", "ninfer.ops.cuda", "ninfer.ops.cuda.passmeta", "torch",
    ]  # fmt: skip
    assert _violations([probe], ("ninfer.ops.cuda",), "ninfer.engine") == [
        ("m.py", "ninfer.ops.cuda"), ("m.py", "ninfer.ops.cuda.passmeta"),
    ]  # fmt: skip
