"""A GGUF file's weights kept unpacked on disk, so that a later start maps them in.

Every ``ladder chat`` of a GGUF model starts by turning its quantized blocks into
floats: for SmolLM2-135M, 540 MB of float32 decoded and written into fresh memory, a
quarter to half a second of a start that is otherwise mostly torch's import. llama.cpp
never pays it (its kernels read the blocks); the ladder's float models need the floats.
So the first load keeps them: ``load`` writes ``levels.gguf.load``'s parameters, the
very arrays, to one file in the user's cache, and every later load maps that file
(``np.memmap``, copy-on-write: writable arrays, whose writes never reach the file)
instead of decoding. The operating system reads a page when a weight on it is first
used, from its page cache after the first time: a start pays almost nothing.

The file is a ``.safetensors`` file (written by ``safetensors``, read here with one
``np.memmap``: safetensors' own numpy reader copies each tensor out of its map), named
for the GGUF file and the dtype: ``unpacked/<name>-<digest>-<dtype>.safetensors`` in
``levels.registry.cache_dir()``, one per GGUF file and dtype, replaced when stale. Its
metadata says what it was made from: the GGUF file's path, size and modification time,
and the loader's code (``gguf.py`` and every module of ``hf/``: a change there may change
the weights). A file whose metadata or size disagree is made again; one that cannot be
written (a full disk, a read-only cache) costs only the keeping, never the load. It is
written to a temporary name and renamed, so a reader sees a whole file or none.

Disk: the weights in the dtype, 538 MB for SmolLM2 in float32 (the GGUF file is 98 MB).
The folder may be deleted at any time: the next start makes its file again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np

from . import gguf
from .common.config import TransformerConfig

FOLDER = "unpacked"
# Kept in float32 only, the dtype of every torch level's and level 1's chat: float64 (level
# 0's, or --dtype float64) would keep twice the bytes for runs that are slow anyway.
KEPT = (np.dtype(np.float32),)
_NUMPY = {"F64": np.float64, "F32": np.float32, "F16": np.float16}  # safetensors' dtype names


def load(path, *, dtype=np.float32) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``levels.gguf.load(path, dtype=dtype)``, mapped from the kept file when it is current,
    else loaded and then kept (the same arrays either way, bit for bit); a dtype not in
    ``KEPT`` is loaded each time."""
    path = Path(path)
    dtype = np.dtype(dtype)
    if dtype not in KEPT:
        return gguf.load(path, dtype=dtype)
    kept, facts = kept_path(path, dtype), _facts(path, dtype)
    params = _mapped(kept, facts)
    if params is not None:
        return gguf.config_of(path), params
    config, params = gguf.load(path, dtype=dtype)
    _keep(kept, params, facts)
    return config, params


def kept_path(path: Path, dtype: np.dtype) -> Path:
    """Where the weights of the GGUF file ``path`` in ``dtype`` are kept."""
    from .registry import cache_dir

    where = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    name = f"{Path(path).stem}-{where}-{np.dtype(dtype).name}.safetensors"
    return cache_dir() / FOLDER / name


def _facts(path: Path, dtype: np.dtype) -> dict[str, str]:
    """What the kept weights are made from; a kept file with other facts is stale."""
    stat = path.stat()
    code = hashlib.sha256()
    hf_modules = sorted(Path(gguf.hf.__file__).parent.glob("*.py"))  # the package, whole
    for file in (Path(gguf.__file__), *hf_modules):
        code.update(file.read_bytes())
    return {
        "gguf": str(path.resolve()),
        "size": str(stat.st_size),
        "mtime_ns": str(stat.st_mtime_ns),
        "dtype": dtype.name,
        "code": code.hexdigest(),
    }


def _mapped(kept: Path, facts: dict[str, str]) -> dict[str, np.ndarray] | None:
    """The kept file's tensors as copy-on-write views of one map, or None if the file is
    missing, stale or not whole."""
    try:
        size = kept.stat().st_size
        with open(kept, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                return None  # a header longer than the file: not read
            header = json.loads(f.read(n))
        if header.pop("__metadata__", None) != facts:
            return None
        spans = [entry["data_offsets"] for entry in header.values()]
        sizes = [
            int(np.prod(e["shape"])) * np.dtype(_NUMPY[e["dtype"]]).itemsize
            for e in header.values()
        ]
        if [b - a for a, b in spans] != sizes or size != 8 + n + max(b for _, b in spans):
            return None  # a tensor's bytes that are not its shape's, or a file not whole
        data = np.memmap(kept, mode="c")
        return {
            name: np.ndarray(
                entry["shape"], _NUMPY[entry["dtype"]], data, 8 + n + entry["data_offsets"][0]
            )
            for name, entry in header.items()
        }
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None  # missing, or not a file this module wrote: made again


def _keep(kept: Path, params: dict[str, np.ndarray], facts: dict[str, str]) -> None:
    """Write ``params`` to ``kept`` (through a temporary name); a failure keeps nothing."""
    from safetensors.numpy import save_file

    partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        save_file(params, str(partial), metadata=facts)
        os.replace(partial, kept)
    except OSError:
        with contextlib.suppress(OSError):  # nothing to remove where nothing could be made
            partial.unlink(missing_ok=True)
