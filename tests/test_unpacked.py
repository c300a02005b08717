"""A GGUF file's weights kept unpacked on disk (levels/unpacked.py): the same arrays as
``levels.gguf.load``, bit for bit, whether decoded or mapped; a stale, partial or foreign
kept file is made again; a cache that cannot be written costs the keeping, not the load."""

from __future__ import annotations

import os

import gguf_files
import numpy as np
import pytest

from levels import gguf, unpacked


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in got.items():
        assert value.dtype == want[name].dtype and value.shape == want[name].shape, name
        assert value.tobytes() == want[name].tobytes(), name  # bit for bit, -0.0 and NaN too


def test_kept_once_then_mapped_the_same(tmp_path, cache, dtype=np.float32):
    path = gguf_files.write(tmp_path / "tiny.gguf", arch="gemma3")  # a Gemma file: offset norms
    want_config, want = gguf.load(path, dtype=dtype)
    kept = unpacked.kept_path(path, np.dtype(dtype))
    assert not kept.exists()
    config, first = unpacked.load(path, dtype=dtype)  # decoded, then kept
    assert kept.is_file() and config == want_config
    _same(first, want)
    config, mapped = unpacked.load(path, dtype=dtype)  # mapped from the kept file
    assert config == want_config
    assert all(isinstance(v.base, np.memmap) for v in mapped.values())
    _same(mapped, want)
    # Copy-on-write: the arrays are writable, and a write stays in this process.
    name = next(iter(mapped))
    mapped[name][...] = 7
    _same(unpacked.load(path, dtype=dtype)[1], want)


def test_one_kept_file_per_gguf_file_and_float64_is_not_kept(tmp_path, cache):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = gguf_files.write(tmp_path / "a" / "tiny.gguf", arch="llama")
    b = gguf_files.write(tmp_path / "b" / "tiny.gguf", arch="llama")  # the same name elsewhere
    for path in (a, b, a):
        for dtype in (np.float32, np.float64):
            _same(unpacked.load(path, dtype=dtype)[1], gguf.load(path, dtype=dtype)[1])
    kept = sorted(p.name for p in (cache / unpacked.FOLDER).iterdir())
    assert len(kept) == 2 and all(name.endswith("-float32.safetensors") for name in kept)


def test_a_stale_or_broken_kept_file_is_made_again(tmp_path, cache):
    path = gguf_files.write(tmp_path / "tiny.gguf", arch="llama")
    want = gguf.load(path, dtype=np.float32)[1]
    kept = unpacked.kept_path(path, np.dtype(np.float32))
    unpacked.load(path, dtype=np.float32)
    whole = kept.read_bytes()
    facts = unpacked._facts(path, np.dtype(np.float32))

    def made_again() -> bool:
        assert unpacked._mapped(kept, facts) is None  # the broken file is not read
        _same(unpacked.load(path, dtype=np.float32)[1], want)
        kept_now = unpacked._mapped(kept, facts)  # and a whole, current one replaced it
        return kept_now is not None and all((kept_now[k] == want[k]).all() for k in want)

    kept.write_bytes(whole[:-4])  # truncated: its size disagrees with its header
    assert made_again()
    kept.write_bytes(b"not a safetensors file")
    assert made_again()
    kept.write_bytes(b"\xff" * 8)  # a header length past the end
    assert made_again()
    # The GGUF file changed since (its modification time): the kept weights may differ.
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert unpacked._mapped(kept, unpacked._facts(path, np.dtype(np.float32))) is None
    _same(unpacked.load(path, dtype=np.float32)[1], want)
    assert unpacked._mapped(kept, unpacked._facts(path, np.dtype(np.float32))) is not None
    assert set(facts) == {"gguf", "size", "mtime_ns", "dtype", "code"}  # what makes it stale


def test_a_cache_that_cannot_be_written_costs_only_the_keeping(tmp_path, monkeypatch):
    path = gguf_files.write(tmp_path / "tiny.gguf", arch="llama")
    blocked = tmp_path / "a-file"
    blocked.write_text("the cache's folder cannot be made under a file")
    monkeypatch.setenv("LADDER_CACHE", str(blocked))
    _same(unpacked.load(path, dtype=np.float32)[1], gguf.load(path, dtype=np.float32)[1])
    assert blocked.read_text().startswith("the cache's folder")
    assert list(tmp_path.glob("**/*.partial")) == []
