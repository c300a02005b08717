"""The suite on a learner's rung: ``python -m pytest --rung DIR`` (``ladder rung test DIR``).

With ``--rung`` the shared suite runs on the learner's package as on a sixth level, and on
it alone: the tests marked ``@pytest.mark.stage(name)`` run on the rung (with
``stage(name, param=values)`` only the cases whose parameter takes one of those values),
grouped by stage in the course's order (``learner.STAGES``); every other test is
deselected, and a file holding no stage test is not even collected. ``--rung-stage
NAME`` keeps one stage's tests. Then:

* a test that reaches a stage's stub (its ``NotImplementedError``) is skipped, and so is
  the rest of that stage, with one line: "RoPE: not written yet: ...". A test stopped by
  the stub of *another* stage is skipped as waiting for it;
* a failing test is also kept as one line for the summary: the case (its file, test
  and parameters) and the first line of its message, which for a value names the shape,
  the largest error and where (``_helpers.assert_allclose_tol``), and for an exception
  of the learner's code its type, message, and the file and line of the rung;
* before pytest's own report (or alone, without pytest's terminal: ``ladder rung
  test``), the summary: a line a stage (passed, failed with the first failing case, not
  written yet, waiting), then what the real model said on the rung.

The run fails (exit status 1) while a stage is not written, as when one fails.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import learner
from learner.rung import failure, inside

RUNG = "rung"  # the name the rung runs under among the levels: test ids read "rung-float64"
STAGE_MARK = re.compile(r"mark\.stage\(")


@dataclass
class StageResult:
    """What the tests of one stage came to."""

    passed: int = 0
    failed: int = 0
    first_failure: str | None = None
    not_written: bool = False
    waits_for: Counter = field(default_factory=Counter)  # stage name -> tests it stopped
    skipped: str | None = None  # why a test skipped itself (the real model: not cached)


class RungGrading:
    """The plugin ``--rung`` registers (conftest.py): selection, order, skips, the summary."""

    def __init__(self, folder: Path, module, stages: list[str] | None = None):
        self.folder, self.module = folder, module
        self.stages = [s for s in learner.STAGES if not stages or s.name in stages]
        self.entries = learner.stage_entries(module)  # code object -> stage name
        self.results = {s.name: StageResult() for s in learner.STAGES}
        self.said: str | None = None  # what the real model wrote on the rung, once it ran
        self.broken: list[str] = []  # test files that did not collect

    # ------------------------------------------------------------------------- collection

    def pytest_ignore_collect(self, collection_path: Path, config):
        """Files without a stage test are not collected at all (a rung's run stays short)."""
        if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
            return None if STAGE_MARK.search(collection_path.read_text()) else True
        return None

    def pytest_collectreport(self, report):
        if report.failed:
            self.broken.append(f"{report.nodeid}: {str(report.longrepr).strip().splitlines()[-1]}")

    def pytest_collection_modifyitems(self, session, config, items):
        """Keep the chosen stages' tests (and of those the cases their marker names), on the
        rung, stage by stage."""
        order = {s.name: i for i, s in enumerate(self.stages)}
        kept, dropped = [], []
        for position, item in enumerate(items):
            stage = _stage_of(item)
            if stage in order and _selected(item) and _on_the_rung(item):
                kept.append((order[stage], position, item))
            else:
                dropped.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = [item for _, _, item in sorted(kept, key=lambda t: t[:2])]

    # ------------------------------------------------------------------------- running

    def pytest_runtest_setup(self, item):
        stage = _stage_of(item)
        if stage is not None and self.results[stage].not_written:
            pytest.skip(learner.stage(stage).not_written())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        stage = _stage_of(item)
        if stage is None or (report.when != "call" and report.passed):
            return report
        result = self.results[stage]
        if report.passed:
            result.passed += 1
        elif report.skipped:
            if result.skipped is None and isinstance(report.longrepr, tuple):
                result.skipped = report.longrepr[2].removeprefix("Skipped: ")
        elif call.excinfo is not None:
            source = self._stub_of(call.excinfo)
            if source is None:
                result.failed += 1
                if result.first_failure is None:
                    result.first_failure = f"{_case(item)}: {self._one_line(call.excinfo)}"
                return report
            if source == stage:
                result.not_written = True
                reason = learner.stage(stage).not_written()
            else:
                result.waits_for[source] += 1
                reason = f"{learner.stage(stage).title}: waits for {learner.stage(source).title}"
            report.outcome = "skipped"  # a stub: skipped, with the line that says whose
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
        return report

    def _stub_of(self, excinfo) -> str | None:
        """The stage whose stub raised ``excinfo``, or None when it is no stub's
        ``NotImplementedError`` (the innermost frame that is a stage's entry decides)."""
        if not excinfo.errisinstance(NotImplementedError):
            return None
        tb, found = excinfo.tb, None
        while tb is not None:
            found = self.entries.get(tb.tb_frame.f_code, found)
            tb = tb.tb_next
        return found

    def _one_line(self, excinfo) -> str:
        """A failure in one line: an assertion's message (the suite's, which names the case),
        or an exception with where in the rung it was raised."""
        exc = excinfo.value
        if isinstance(exc, AssertionError):
            lines = str(exc).strip().splitlines()
            return lines[0] if lines else "an assertion failed"
        mine = any(inside(tb.tb_frame.f_code.co_filename, self.folder) for tb in _frames(excinfo))
        return (
            f"your code raised {failure(exc, self.folder)}" if mine else failure(exc, self.folder)
        )

    # ------------------------------------------------------------------------- the summary

    def ran(self, name: str) -> bool:
        """Whether stage ``name`` is among the stages this run grades."""
        return any(s.name == name for s in self.stages)

    def passed(self, name: str) -> bool:
        """Whether stage ``name`` passed: every test of it that ran (one at least)."""
        r = self.results[name]
        return r.passed > 0 and not (r.failed or r.not_written or r.waits_for)

    def lines(self) -> list[str]:
        """The summary: a line a stage, then what the real model said."""
        width = max(len(s.title) for s in self.stages)
        out = [f"your rung ({self.folder.name}), stage by stage:"]
        out += [f"  {s.title:<{width}}  {self._status(s)}" for s in self.stages]
        out += [f"  {line}" for line in self.broken]
        if self.said is not None:
            out.append(f"your rung says: {self.said}")
        return out

    def _status(self, stage) -> str:
        r = self.results[stage.name]
        taken = learner.origin(self.module, stage.name) if stage.entries else None
        whose = f" (taken from {taken})" if taken else ""
        waits = ", ".join(learner.stage(s).title for s in r.waits_for)
        if r.not_written:
            return f"not written yet: {stage.what} ({stage.chapter})"
        if r.failed:
            return f"FAILED {r.failed} of {r.passed + r.failed} cases{whose}; the first: {r.first_failure}"  # fmt: skip
        if waits:
            more = f"passed {r.passed} cases{whose}, and " if r.passed else ""
            return f"{more}{sum(r.waits_for.values())} wait for {waits} (not written yet)"
        if r.passed:
            if not stage.entries:
                return "passed: the same tokens as level 1's"
            return f"passed {r.passed} cases{whose}"
        return r.skipped or "not run"

    def pytest_sessionfinish(self, session, exitstatus):
        ran = any(r.passed or r.failed or r.not_written or r.waits_for or r.skipped for r in self.results.values())  # fmt: skip
        if exitstatus == pytest.ExitCode.INTERRUPTED and not ran:
            return  # stopped before any verdict: nothing to summarise
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        write = print if reporter is None else reporter.write_line
        for line in ([] if reporter is None else [""]) + self.lines():
            write(line)
        unfinished = any(self.results[s.name].not_written or self.results[s.name].waits_for for s in self.stages)  # fmt: skip
        if unfinished and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ----------------------------------------------------------------------------- helpers


def _stage_of(item) -> str | None:
    marker = item.get_closest_marker("stage")
    return None if marker is None else marker.args[0]


def _params(item) -> dict:
    callspec = getattr(item, "callspec", None)
    return {} if callspec is None else callspec.params


def _selected(item) -> bool:
    """A stage marker's keywords name the cases a rung runs: ``param=(values...)``."""
    params = _params(item)
    return all(params.get(k) in v for k, v in item.get_closest_marker("stage").kwargs.items())


def _on_the_rung(item) -> bool:
    """Parametrised by the rung (``case``, ``level``), or a test of the rung alone."""
    return _params(item).get("_level_dtype", (None,))[0] == RUNG or bool(
        item.get_closest_marker("rung_only")
    )


def _case(item) -> str:
    """The case in a learner's words: the file, the test and its parameters."""
    return f"{Path(item.path).name}::{item.name}"


def _frames(excinfo):
    tb = excinfo.tb
    while tb is not None:
        yield tb
        tb = tb.tb_next
