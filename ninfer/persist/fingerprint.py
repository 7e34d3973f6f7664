"""What a prefix cache file must share with the running engine to be used (design §5.5): the
model's identity, its config, dtypes, RoPE, the ops backend and the ninfer and format versions.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ninfer.config import MemoryGeometry
from ninfer.persist.tables import FORMAT_VERSION
from ninfer.version import __version__


def _file_stat(p: Path) -> list:
    st = p.stat()
    return [p.name, st.st_size, st.st_mtime_ns]


def checkpoint_identity(path: str | os.PathLike) -> dict:
    """A checkpoint folder: its absolute path and the size and mtime of config.json and every
    weight file (any rewrite invalidates the file)."""
    from ninfer.models.weights import checkpoint_files

    root = Path(path).expanduser().resolve()
    files = [root / "config.json", *checkpoint_files(root)]
    return {"checkpoint": str(root), "files": [_file_stat(f) for f in files]}


def demo_identity(config_path: Path, seed: int) -> dict:
    """The embedded demo model: a fixed identity, its config's hash and its weights seed."""
    digest = hashlib.sha256(Path(config_path).read_bytes()).hexdigest()
    return {"checkpoint": "ninfer-demo", "config_sha256": digest, "weights_seed": seed}


def path_identity(model: str | None, quantization: str | None = None) -> dict:
    """The identity of `EngineConfig.model`: its checkpoint folder's, or the demo model's
    when that is None; with the quantisation applied at load, if any (other weights)."""
    if model is not None:
        identity = checkpoint_identity(model)
    else:
        from ninfer.demo import DEMO_DIR, demo_weights_seed

        identity = demo_identity(DEMO_DIR / "config.json", demo_weights_seed)
    return identity if quantization is None else {**identity, "quantization": quantization}


def model_identity(model) -> dict:
    """An in-memory model (`LLM.from_model`): parameter names, shapes, dtypes and a hash of each
    parameter's first and last 64 KiB (cheap, and tells random seeds apart)."""
    import xxhash

    h = xxhash.xxh3_64()
    for name, p in model.state_dict().items():
        flat = p.detach().reshape(-1)
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        n = max(1, 65536 // max(1, flat.element_size()))
        for part in (flat[:n], flat[-n:]):
            h.update(part.float().cpu().numpy().tobytes())
    return {"checkpoint": "in-memory model", "params_xxh3": h.hexdigest()}


def fingerprint(identity: dict, memory: MemoryGeometry, model_config, ops_name: str) -> dict:
    """What a file must share with the running engine to be used (design §5.5): `memory`
    gives the dtypes and the device."""
    config = json.dumps(model_config.to_dict(), sort_keys=True, default=str)
    return {
        "model": identity,
        "model_config_sha256": hashlib.sha256(config.encode()).hexdigest(),
        "dtype": memory.dtype,
        "kv_dtype": memory.kv_dtype,
        "rope": [model_config.rope_theta, model_config.partial_rotary_factor],
        "device_type": memory.device.split(":")[0],
        "ops": ops_name,
        "ninfer_version": __version__,
        "format_version": FORMAT_VERSION,
    }
