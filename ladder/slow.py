"""The prompt's progress on stderr at a rung that takes seconds a token (``ladder chat
--level 0``, level 4 on a CPU): the line before it, what it should take (``loading.slow``),
then a count after each piece of it."""

from __future__ import annotations

import sys
import time

from loading.slow import Cost


class PromptProgress:
    """The prompt's progress on ``out`` (stderr): the line before it, then a count after
    each piece. ``done(tokens)`` is the stream's ``on_prefill``."""

    def __init__(self, found: Cost, tokens: int, out=None):
        self.cost, self.tokens, self.out = found, tokens, out or sys.stderr
        self.terminal = self.out.isatty()
        self.started = time.perf_counter()

    def start(self) -> None:
        print(
            f"the prompt ({self.tokens} tokens) should take about "
            f"{self.cost.prompt(self.tokens):.0f} s; its progress follows",
            file=self.out,
            flush=True,
        )
        self.started = time.perf_counter()

    def done(self, tokens: int) -> None:
        """After ``tokens`` of the prompt: on a terminal the count is rewritten in place, and
        the last one stays, above the answer."""
        elapsed = time.perf_counter() - self.started
        left = elapsed / tokens * (self.tokens - tokens)
        line = f"the prompt: {tokens} of {self.tokens} tokens in {elapsed:.0f} s"
        line += f", about {left:.0f} s left" if tokens < self.tokens else ""
        end = "\n" if tokens == self.tokens or not self.terminal else ""
        self.out.write(("\r\x1b[2K" if self.terminal else "") + line + end)
        self.out.flush()
