"""Checkpoints: everything needed to resume a run bit-for-bit, in a file that loads safely.

A checkpoint is a ``torch.save`` of plain containers (dicts, lists, strings,
numbers) and tensors only, so it loads with ``torch.load(..., weights_only=True)``,
which refuses to unpickle arbitrary objects (a checkpoint from elsewhere
cannot run code on load). It holds:

* ``config``: the ``TransformerConfig`` fields; ``kind``, ``task`` and the
  training ``settings`` as dicts;
* ``params``: every parameter under its canonical name;
* ``optimizer``: the AdamW step count and moments, also by canonical name, so a
  checkpoint written at one level resumes at another;
* ``rng``: the torch generator state (dropout), ``step`` and the ``losses``
  so far, so a resumed run continues the same loss curve.

Writes are atomic: the file is written under a temporary name in the same
directory, flushed to disk (``fsync``), then renamed over the target with
``os.replace``, which is atomic on POSIX. A crash mid-write leaves the previous
checkpoint intact, never half a file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1


def _to_storable(value: Any) -> Any:
    """numpy arrays -> tensors, tuples -> lists, recursively; everything else as is."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, Mapping):
        return {str(k): _to_storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_storable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, Mapping):
        return {k: _to_numpy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_numpy(v) for v in value]
    return value


def save_checkpoint(path: str | os.PathLike, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` (numpy arrays allowed anywhere inside) atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    obj = {"format": FORMAT, **_to_storable(payload)}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # Make the rename itself durable (the directory entry), where the OS allows it.
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; tensors come back as numpy arrays."""
    obj = torch.load(Path(path), map_location="cpu", weights_only=True)
    if obj.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {obj.get('format')!r}")
    return _to_numpy(obj)
