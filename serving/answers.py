"""The choices of an answer as OpenAI's API writes them, from the worker's events.

A request makes one ``Completion`` a choice (``n`` of them a prompt, a prompt after
another): ``Choices`` gathers each one's ``Piece``s and ``Finished`` by its index and
writes a whole choice, or a chunk of one, in the route's form:

* chat: ``message`` (or a chunk's ``delta``) and ``logprobs`` as ``{"content": [{"token",
  "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}``;
* completions: ``text`` (after the prompt's, with ``echo``) and ``logprobs`` as ``{"tokens",
  "token_logprobs", "top_logprobs": [{token: logprob}, ...], "text_offset"}``, the echoed
  prompt's first entry ``null`` in both lists (it has no context); a token's dict holds
  its ``logprobs`` likeliest alternatives and the token itself, as OpenAI's does.

A token's text is its bytes (``constrained.vocabulary.token_bytes``: what it adds to the
text, a special token its own name) read as UTF-8, a byte that does not complete a
character shown as U+FFFD; ``bytes`` gives them exactly.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field

from .worker import Finished, Piece


class Spelling:
    """Each token id's bytes and text, for ``tokenizer`` (built on first use)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @functools.cached_property
    def _bytes(self) -> list[bytes]:
        from constrained.vocabulary import token_bytes

        named = self.tokenizer.id_to_token
        return [b if b is not None else (named(i) or "").encode() for i, b in enumerate(token_bytes(self.tokenizer))]  # fmt: skip

    def bytes(self, token: int) -> bytes:
        return self._bytes[token]

    def text(self, token: int) -> str:
        return self._bytes[token].decode("utf-8", errors="replace")


@dataclass
class Choice:
    """One choice on its way: its text, its ``Logprob``s, its prompt's, how it ended."""

    prompt_text: str = ""
    first_id: int = 0  # the prompt's first token (echoed with no log-probability)
    text: str = ""
    logprobs: list = field(default_factory=list)
    prompt: tuple | None = None
    finished: Finished | None = None
    sent: int = 0  # a held answer: its text, or its call's arguments, streamed so far
    call_id: str = ""  # a streamed call's id, once its head is sent


class Choices:
    """The choices of one request (``prompts``: each choice's prompt text and first id, for
    ``echo``), written for the ``chat`` route or the completions one; ``logprobs``: whether
    asked."""

    def __init__(self, spelling: Spelling, prompts: list[tuple[str, int]], *, chat: bool,
                 logprobs: bool, tools=None, native: bool = False):  # fmt: skip
        self.spelling, self.chat, self.asked = spelling, chat, logprobs
        self.choices = [Choice(prompt_text=t, first_id=i) for t, i in prompts]
        # A chat answer that may be a tool call (serving/tools.py): its text is held until it
        # ends, then given as a call or as text.
        self.tools, self.native = tools, native
        self.held = chat and tools is not None and tools.choice != "none"

    def calls(self, index: int) -> list | None:
        """Choice ``index``'s ``tool_calls``, or None where its text is not a call."""
        return self.tools.answer(self.choices[index].text, self.native) if self.held else None

    def held_chunks(self, index: int) -> list[dict]:
        """The stream's choices for what choice ``index`` has written so far, where it may
        be a call: text as it comes once it cannot be one; a call as OpenAI streams one,
        a chunk with its id, type and name (empty arguments) once the name is written, then
        its arguments as they come (``tools.Tools.reading``); at its end, the rest."""
        c = self.choices[index]
        done = c.finished is not None
        read = self.tools.reading(c.text, self.native)
        if read is None or (done and not c.call_id and not self.calls(index)):  # text
            out, c.sent = c.text[c.sent :], len(c.text)
            return [self._delta(index, {"content": out})] if out else []
        name, arguments = read
        calls = self.calls(index) if done else None
        if calls:
            arguments = calls[0]["function"]["arguments"]
        if not name:
            return []
        out = []
        if not c.call_id:
            c.call_id = f"call_{uuid.uuid4().hex[:24]}"
            head = {"index": 0, "id": c.call_id, "type": "function", "function": {"name": name, "arguments": ""}}  # fmt: skip
            out.append(self._delta(index, {"tool_calls": [head]}))
        if arguments[c.sent :]:
            more = {"index": 0, "function": {"arguments": arguments[c.sent :]}}
            out.append(self._delta(index, {"tool_calls": [more]}))
            c.sent = len(arguments)
        return out

    @staticmethod
    def _delta(index: int, delta: dict) -> dict:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}

    def add(self, index: int, event: Piece | Finished) -> None:
        choice = self.choices[index]
        if isinstance(event, Finished):
            choice.finished = event
            return
        choice.text += event.text
        choice.logprobs += event.logprobs
        if event.prompt is not None:
            choice.prompt = event.prompt

    done = property(lambda self: all(c.finished is not None for c in self.choices))

    def whole(self, index: int, content: dict | None = None) -> dict:
        """Choice ``index`` as a whole answer has it; ``content``: a chat message's fields
        in place of its text (a tool call's)."""
        c, calls = self.choices[index], self.calls(index)
        out: dict = {"index": index, "finish_reason": "tool_calls" if calls else c.finished.finish_reason}  # fmt: skip
        if calls:
            out["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
        elif self.chat:
            out["message"] = {"role": "assistant", "content": c.text} if content is None else content  # fmt: skip
        else:
            out["text"] = (c.prompt_text if c.prompt is not None else "") + c.text
        return out | {"logprobs": self.logprobs(c, c.prompt or (), c.logprobs) if self.asked else None}  # fmt: skip

    def chunk(self, index: int, piece: Piece) -> dict:
        """A stream's choice for ``piece`` of choice ``index`` (a completion's echoed prompt
        comes in its first)."""
        echo = piece.prompt is not None
        if self.chat:
            out = {"index": index, "delta": {"content": piece.text}}
        else:
            prefix = self.choices[index].prompt_text if echo else ""
            out = {"index": index, "text": prefix + piece.text}
        logprobs = (
            self.logprobs(self.choices[index], piece.prompt or (), piece.logprobs)
            if self.asked
            else None
        )
        return out | {"finish_reason": None, "logprobs": logprobs}

    def logprobs(self, choice: Choice, prompt, generated) -> dict:
        """``prompt`` (its first None) then ``generated`` ``Logprob``s of ``choice``, in the
        route's form."""
        if self.chat:
            return {"content": [self._content(e) for e in generated]}
        tokens, values, tops, offsets, at = [], [], [], [], 0
        for e in [*prompt, *generated]:
            if e is None:  # the prompt's first token: no context, no log-probability
                tokens.append(self.spelling.text(choice.first_id))
                values.append(None)
                tops.append(None)
            else:
                tokens.append(self.spelling.text(e.token))
                values.append(e.logprob)
                top = {self.spelling.text(t): lp for t, lp in e.top}
                tops.append(top | {tokens[-1]: e.logprob})
            offsets.append(at)
            at += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}  # fmt: skip

    def _content(self, e) -> dict:
        spell = self.spelling
        top = [{"token": spell.text(t), "logprob": lp, "bytes": list(spell.bytes(t))} for t, lp in e.top]  # fmt: skip
        return {"token": spell.text(e.token), "logprob": e.logprob,
                "bytes": list(spell.bytes(e.token)), "top_logprobs": top}  # fmt: skip
