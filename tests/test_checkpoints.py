"""Checkpoints: a round trip, every way a file can be unusable, and saves that survive kill -9.

A checkpoint is verified before it is used (SHA-256 of the payload), loaded
with ``weights_only=True``, and written atomically; the temporary files an
interrupted save leaves behind go at the next save.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from _helpers import pythonpath

from lab.checkpoint import MAGIC, CheckpointError, load_checkpoint, save_checkpoint

PAYLOAD = {
    "params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
    "optimizer": {"step": 3, "exp_avg": {}},
    "betas": (0.9, 0.98),
    "note": "x",
}


def _saved(tmp_path, payload=PAYLOAD):
    path = tmp_path / "run.pt"
    save_checkpoint(path, payload)
    return path


def test_round_trip(tmp_path):
    back = load_checkpoint(_saved(tmp_path))
    assert back["params"]["w"].dtype == np.float32
    assert np.array_equal(back["params"]["w"], PAYLOAD["params"]["w"])
    assert back["betas"] == [0.9, 0.98] and back["optimizer"]["step"] == 3 and back["note"] == "x"


@pytest.mark.parametrize("where", [0.1, 0.5, 0.99])
def test_any_flipped_byte_is_refused(tmp_path, where):
    path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    at = int(where * (len(data) - 1))
    data[at] ^= 0x01  # one bit of one byte
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path)


def test_sixty_four_flipped_bytes_in_the_middle_are_refused(tmp_path):
    path = _saved(tmp_path, {"params": {"w": np.ones((64, 64), np.float32)}})
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 does not match"):
        load_checkpoint(path)


def test_truncated_and_extended_files_are_refused(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(CheckpointError, match="cut short"):
        load_checkpoint(path)
    path.write_bytes(data + b"junk")
    with pytest.raises(CheckpointError, match="cut short or appended to"):
        load_checkpoint(path)


def _written(path, body: bytes, digest: str | None = None) -> None:
    """A file with a valid header around ``body`` (as an attacker or another tool could write)."""
    import hashlib
    import json

    header = json.dumps({"sha256": digest or hashlib.sha256(body).hexdigest(), "bytes": len(body)})
    path.write_bytes(MAGIC + b" 2\n" + header.encode() + b"\n" + body)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_bytes(os.urandom(4096)), "not a checkpoint of this project"),
        (lambda p: torch.save({"format": 2}, p), "not a checkpoint of this project"),
        (lambda p: p.write_bytes(MAGIC + b" 1\n{}\n"), "unknown checkpoint format '1'"),
        (lambda p: p.write_bytes(MAGIC + b" 2\nnot json\n"), "header is damaged"),
    ],
    ids=["missing", "directory", "empty", "random-bytes", "plain-torch-file", "format-1", "header"],
)
def test_unusable_files_are_one_clear_error(tmp_path, make, message):
    path = tmp_path / "x.pt"
    make(path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_a_verified_payload_that_is_not_a_checkpoint_dict_is_refused(tmp_path):
    path = tmp_path / "x.pt"
    buffer = io.BytesIO()
    torch.save([1, 2, 3], buffer)
    _written(path, buffer.getvalue())
    with pytest.raises(CheckpointError, match="not a checkpoint dict"):
        load_checkpoint(path)
    buffer = io.BytesIO()
    torch.save({"format": 7}, buffer)  # a dict, but no format this project writes
    _written(path, buffer.getvalue())
    with pytest.raises(CheckpointError, match="not a checkpoint dict of format 2"):
        load_checkpoint(path)


class _Payload:
    """Unpickling this runs code: what weights_only must refuse."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_malicious_pickle_is_refused_without_running_it(tmp_path):
    path = tmp_path / "x.pt"
    buffer = io.BytesIO()
    torch.save({"format": 2, "evil": _Payload()}, buffer, pickle_module=pickle)
    _written(path, buffer.getvalue())  # a valid checksum: only weights_only stands in the way
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path)


def test_a_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(Exception):  # noqa: B017 (torch raises a pickling error)
        save_checkpoint(path, {"bad": lambda: None})
    assert np.array_equal(load_checkpoint(path)["params"]["w"], PAYLOAD["params"]["w"])
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]


def test_stale_temporary_files_go_at_the_next_save(tmp_path):
    path = _saved(tmp_path)
    stale = tmp_path / ".run.pt.abc123.tmp"  # what a save killed mid-write leaves
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / ".other.pt.abc123.tmp"  # another checkpoint's: not ours to remove
    other.write_bytes(b"x")
    save_checkpoint(path, PAYLOAD)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.pt.abc123.tmp", "run.pt"]


SAVER = textwrap.dedent(
    """
    import sys, numpy as np
    from lab.checkpoint import save_checkpoint
    path, n = sys.argv[1], 0
    while True:  # rewrite the checkpoint with a new step, until killed
        n += 1
        save_checkpoint(path, {"step": n, "w": np.full((1024, 1024), n, np.float32)})
        print(n, flush=True)
    """
)


@pytest.mark.slow
def test_kill_9_during_saves_never_loses_the_previous_checkpoint(tmp_path):
    """SIGKILL a process that does nothing but save, at several moments after its first
    save: the file always loads and holds one whole step, and the next save removes
    what the kills left behind. The saving loop spends nearly all its time inside
    ``save_checkpoint``, so the kills land mid-save (their temporary files show it)."""
    path = tmp_path / "run.pt"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    leftovers, kills = 0, 0
    # At least five kills; more (up to 20) until one has landed mid-save, which most do.
    delays = [0.0, 0.003, 0.011, 0.029, 0.05] + [0.002 * i for i in range(1, 16)]
    for delay in delays:
        if kills >= 5 and leftovers:
            break
        kills += 1
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(path)],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": pythonpath(root)},
        )
        try:
            assert proc.stdout.readline()  # one save done: the file exists from here on
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            proc.stdout.close()
        back = load_checkpoint(path)  # never half a file
        assert back["step"] >= 1 and (back["w"] == back["step"]).all()
        leftovers += len(list(tmp_path.glob(".run.pt.*.tmp")))
    assert leftovers > 0, "no kill landed inside a save; the test proved nothing"
    save_checkpoint(path, {"step": -1, "w": np.zeros((2, 2), np.float32)})
    assert [p.name for p in tmp_path.iterdir()] == ["run.pt"]  # no temporary survives
