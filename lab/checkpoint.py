"""Checkpoints: everything needed to resume a run bit-for-bit, in a file that is verified and loads safely.

The file is a one-line header, then the payload:

    ATTENTION-LADDER-CHECKPOINT 2\\n
    {"sha256": "<hex digest of the payload>", "bytes": <payload length>}\\n
    <payload: torch.save of plain containers and tensors>

* **Integrity.** Loading recomputes the SHA-256 of the payload and refuses the
  file, naming it, if one byte differs or the file was cut short: training
  never resumes from corrupted weights.
* **Safety.** The payload holds only plain containers (dicts, lists,
  strings, numbers) and tensors, and is read with
  ``torch.load(..., weights_only=True)``, which refuses to unpickle anything
  else (a checkpoint from elsewhere cannot run code on load).
* **Atomic writes.** The file is written under a temporary name in the same
  directory, flushed to disk (``fsync``), then renamed over the target with
  ``os.replace``, atomic on POSIX: a crash mid-write (even ``kill -9``)
  leaves the previous checkpoint intact, never half a file. The temporary
  files a crash leaves behind are removed by the next save.

The payload of a training run holds:

* ``config``, ``kind``, ``task`` and the training ``settings`` (the ``spec``);
* ``params``: every parameter under its canonical name;
* ``optimizer``: the AdamW step count and moments, also by canonical name, so a
  checkpoint written at one level resumes at another;
* ``rng``: the torch generator state (dropout), ``step`` and the ``losses``
  so far, so a resumed run continues the same loss curve.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 2
MAGIC = b"ATTENTION-LADDER-CHECKPOINT"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, not one, corrupted, or unsafe."""


def _to_storable(value: Any) -> Any:
    """numpy arrays -> tensors, tuples -> lists, recursively; everything else as is."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, Mapping):
        return {str(k): _to_storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
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


def _temp_files(path: Path) -> list[Path]:
    """The temporary files that saves of ``path`` create (and a crash may leave behind)."""
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def save_checkpoint(path: str | os.PathLike, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` (numpy arrays allowed anywhere inside) atomically to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in _temp_files(path):  # left by an interrupted save
        stale.unlink(missing_ok=True)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **_to_storable(payload)}, buffer)
    body = buffer.getvalue()
    header = json.dumps({"sha256": hashlib.sha256(body).hexdigest(), "bytes": len(body)})
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + b" %d\n" % FORMAT + header.encode() + b"\n" + body)
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


def _read(path: Path) -> bytes:
    """The verified payload of the checkpoint at ``path``."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory, not a file")
    data = path.read_bytes()
    if not data:
        raise CheckpointError(f"checkpoint {path} is empty")
    first, _, rest = data.partition(b"\n")
    if not first.startswith(MAGIC + b" "):
        raise CheckpointError(f"{path} is not a checkpoint of this project (no header)")
    version = first[len(MAGIC) + 1 :]
    if version != str(FORMAT).encode():
        shown = version.decode(errors="replace")[:20]
        raise CheckpointError(
            f"{path}: unknown checkpoint format {shown!r} (this is format {FORMAT})"
        )
    line, _, body = rest.partition(b"\n")
    try:
        header = json.loads(line)
        digest, length = str(header["sha256"]), int(header["bytes"])
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} is corrupted: its header is damaged") from None
    if len(body) != length:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: {len(body)} payload bytes, the header says {length} "
            "(cut short or appended to)"
        )
    if hashlib.sha256(body).hexdigest() != digest:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: its SHA-256 does not match the one saved with it"
        )
    return body


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Verify and read a checkpoint; tensors come back as numpy arrays.

    Every way a file can be unusable is a ``CheckpointError`` (a ``ValueError``)
    naming the file: missing, a directory, empty, not a checkpoint, another
    format, corrupted (checksum), or holding objects ``weights_only`` refuses.
    """
    path = Path(path)
    body = _read(path)
    try:
        obj = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "unsafe content"
        raise CheckpointError(
            f"{path} holds objects other than tensors and plain containers, refused "
            f"by torch.load(weights_only=True): {reason[:160]}"
        ) from None
    except Exception as exc:  # a verified payload that is still not a torch file
        raise CheckpointError(
            f"{path}: the payload is not readable ({type(exc).__name__})"
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{path}: the payload is not a checkpoint dict of format {FORMAT}")
    return _to_numpy(obj)
