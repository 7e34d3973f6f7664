"""The import rules of the model / ops seam and the executor, read from the source (every
`import`, lazy or type-only included):

    ninfer/forward.py     imports nothing from ninfer: it sits below models and ops
    ninfer/ops/           imports nothing from models, engine, memory or cache
    ninfer/engine/        only its executor (ninfer/engine/executor/) imports ninfer.ops
    ninfer/llm.py         imports nothing from ninfer.cache (the engine builds the prompt's
                          block keys) and reads no private attribute of the engine
    every module          imports no name of the package root `ninfer` (its face for users):
                          `__version__` is `ninfer.version`'s, the rest their own modules'

and the inspection seam (docs/engine.md): tests, tools and benchmarks reach the engine through
`LLM.engine` and public methods, never a private attribute of an LLM or an Engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ninfer

ROOT = Path(ninfer.__file__).parent
REPO = ROOT.parent
# names that hold an LLM or an Engine in tests, tools and benchmarks
_HOLDERS = {"llm", "engine", "eng"}


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


def _root_names(path: Path, package: str | None = None) -> list[str]:
    """Names `path` takes from the package root `ninfer` itself: `import ninfer`, or `from
    ninfer import X` / `from .. import X` resolving to the root, where X is no submodule."""
    package = package or ".".join(("ninfer", *path.relative_to(ROOT).parent.parts))
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name == "ninfer"]
        elif isinstance(node, ast.ImportFrom):
            module = node.module
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(anchor + ([node.module] if node.module else []))
            if module == "ninfer":
                names += [f"ninfer.{a.name}" for a in node.names if not _submodule(a.name)]
    return names


def _submodule(name: str) -> bool:
    return (ROOT / name).is_dir() or (ROOT / f"{name}.py").exists()


def test_no_module_imports_the_package_root():
    files = [f for f in sorted(ROOT.rglob("*.py")) if f != ROOT / "__init__.py"]
    assert len(files) >= 100
    bad = [(str(f.relative_to(ROOT)), n) for f in files for n in _root_names(f)]
    assert bad == []


def test_root_checker_tells_names_from_submodules(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("from ninfer import probe, __version__\nimport ninfer\nfrom .. import LLM\n")
    assert _root_names(probe, "ninfer.cli") == ["ninfer.__version__", "ninfer", "ninfer.LLM"]


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


def test_llm_imports_nothing_from_the_cache():
    assert _violations([ROOT / "llm.py"], ("ninfer.cache",)) == []


def _private_reads(path: Path) -> list[tuple[int, str]]:
    """(line, expression) of every `x._name` where x is a name or an attribute in `_HOLDERS`
    (an LLM or an Engine), and of every `._engine`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        value = node.value
        held = (isinstance(value, ast.Name) and value.id in _HOLDERS) or (
            isinstance(value, ast.Attribute) and value.attr in _HOLDERS
        )
        if node.attr == "_engine" or held:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_llm_reads_no_private_attribute_of_the_engine():
    tree = ast.parse((ROOT / "llm.py").read_text())
    reads = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and n.attr.startswith("_")
        and isinstance(n.value, ast.Attribute | ast.Name)
        and getattr(n.value, "attr", getattr(n.value, "id", None)) in ("_engine", "engine")
    ]
    assert reads == []


def test_tests_tools_and_benchmarks_use_the_inspection_seam():
    files = [
        f
        for folder in (REPO / "tests", REPO / "tools", ROOT / "bench")
        for f in sorted(folder.rglob("*.py"))
    ]
    assert len(files) > 50
    found = [
        f"{f.relative_to(REPO)}:{line}: {expr}" for f in files for line, expr in _private_reads(f)
    ]
    assert found == []


def test_the_seam_checker_sees_private_reads(tmp_path):
    probe = tmp_path / "t.py"
    probe.write_text(
        "a = llm._engine.kv_state\nb = llm.engine._thread\nc = engine._run\n"
        "d = x.llm._live\ne = llm.engine.kv_state._index\nf = llm.__class__\n"
        "g = served.engine.runner\n"
    )
    assert _private_reads(probe) == [
        (1, "llm._engine"), (2, "llm.engine._thread"), (3, "engine._run"), (4, "x.llm._live"),
    ]  # fmt: skip


def test_the_page_size_has_one_owner():
    """Only `ninfer/page.py` binds the 64-token page / block size; the rest import it."""
    owners = sorted(
        str(f.relative_to(ROOT))
        for f in ROOT.rglob("*.py")
        for node in ast.walk(ast.parse(f.read_text(), str(f)))
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id in ("PAGE_SIZE", "BLOCK_TOKENS")
    )
    assert owners == ["page.py"]


# The composition roots: they hold the whole `EngineConfig` and hand out its parts (`cli/info.py`
# prints every value, `EngineConfig.describe`).
CONFIG_ROOTS = ["cli/info.py", "engine/engine.py", "llm.py"]
# receiver -> {parameter: the part it is annotated with}: each takes the part(s) it reads
RECEIVERS = {
    ("engine/kv/state.py", "KVState.__init__"): {
        "memory": "MemoryGeometry", "cache": "CachePolicy",
    },
    ("engine/kv/state.py", "engine_cost_model"): {"cache": "CachePolicy"},
    ("engine/executor/warmup.py", "prepare_runner"): {
        "op_cfg": "OpsConfig", "memory": "MemoryGeometry",
    },
    ("persist/cache_file.py", "for_engine"): {
        "persistence": "Persistence", "memory": "MemoryGeometry",
    },
    ("persist/fingerprint.py", "fingerprint"): {"memory": "MemoryGeometry"},
    ("engine/engine.py", "Engine.__init__"): {"cfg": "EngineConfig"},
}  # fmt: skip


def _signatures(path: Path) -> dict[str, dict[str, str | None]]:
    """{qualified name: {parameter: its annotation's source, or None}} of every function and
    method of `path` (one class level deep)."""
    out = {}
    tree = ast.parse(path.read_text(), str(path))
    scopes = [("", tree.body)] + [
        (f"{n.name}.", n.body) for n in tree.body if isinstance(n, ast.ClassDef)
    ]
    for prefix, body in scopes:
        for fn in body:
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
                out[prefix + fn.name] = {
                    a.arg: None if a.annotation is None else ast.unparse(a.annotation) for a in args
                }
    return out


def test_only_the_composition_roots_import_the_whole_engine_config():
    """Every other module is handed a part (`MemoryGeometry`, `Scheduling`, `CachePolicy`,
    `OpsConfig`, `Persistence`), never the record of all of them."""
    files = [f for f in sorted(ROOT.rglob("*.py")) if f != ROOT / "config.py"]
    importers = [
        str(f.relative_to(ROOT)) for f in files if "ninfer.config.EngineConfig" in _imports(f)
    ]
    assert importers == CONFIG_ROOTS


def test_each_receiver_takes_its_parts_of_the_config():
    for (rel, qualname), parts in RECEIVERS.items():
        params = _signatures(ROOT / rel).get(qualname)
        assert params is not None, f"{rel}: no {qualname}"
        for param, part in parts.items():
            assert params.get(param) == part, (rel, qualname, param, params.get(param))
    # and no function outside the roots takes the whole record
    whole = [
        (str(f.relative_to(ROOT)), fn, p)
        for f in sorted(ROOT.rglob("*.py"))
        if str(f.relative_to(ROOT)) not in CONFIG_ROOTS
        for fn, params in _signatures(f).items()
        for p, ann in params.items()
        if ann is not None and "EngineConfig" in ann
    ]
    assert whole == []
