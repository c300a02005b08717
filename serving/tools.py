"""Tools: OpenAI's ``tools`` (functions) and ``tool_choice``, as a prompt and a language.

A request names functions, each with a JSON schema of its ``parameters``, and how the
model may use them (``tool_choice``): ``"none"`` (it answers in text), ``"auto"`` (text
or one call, the default), ``"required"`` (one call), or one function by name.

* **The prompt.** A chat template that takes ``tools`` (Qwen2.5's) is given them, and the
  calls and results of earlier turns, in its own format: its calls are written
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``. A template that does
  not (SmolLM2's) gets the generic format: a system message (``GENERIC``, then the
  functions, one JSON a line) asking for a call as nothing but ``{"name": ...,
  "arguments": ...}``; an earlier call is the assistant's turn written so, and a
  ``tool`` message a turn of role ``tool``.
* **The language.** A call is a JSON object whose ``name`` is a function's and whose
  ``arguments`` are valid under that function's ``parameters``
  (``constrained.schema``), in the template's wrapping; ``"auto"`` adds every text that
  does not begin as a call does. The mask holds the answer to it, so a call's arguments
  always validate (up to what the schema subset refuses, a 400 naming the keyword).
* **The answer.** Text that is a call becomes ``tool_calls`` (one, with an id of its
  own) and ``finish_reason`` ``"tool_calls"``; other text is the message's content.
  Streamed (``reading``): once the name is written, a chunk with the call's id, type and
  name, then its arguments as they come, the call's closing held back.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from constrained import Language
from constrained.regex import alt, concat, literal, parse
from constrained.schema import schema_to_tree

GENERIC = (
    "You can call functions. To call one, answer with nothing but a JSON object "
    '{"name": <the function\'s name>, "arguments": <its arguments, an object>}. '
    "The functions, one a line:"
)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"  # the wrapping of a template that takes tools


class ToolError(ValueError):
    """``tools``, ``tool_choice`` or a message's tool fields that cannot be honoured (a 400,
    with the field in ``param``)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tools:
    """The request's functions (``{"name", "description", "parameters"}`` each) and its
    ``choice``: ``"none"``, ``"auto"``, ``"required"``, or a function's name."""

    functions: tuple[dict, ...]
    choice: str

    @classmethod
    def parse(cls, body: dict) -> Tools | None:
        """The request's tools, checked (``ToolError``); None where it has none."""
        tools, choice = body.get("tools"), body.get("tool_choice")
        if tools in (None, []):
            if choice not in (None, "none", "auto"):
                raise ToolError("'tool_choice' names a function but 'tools' is empty", "tool_choice")  # fmt: skip
            return None
        if not isinstance(tools, list):
            raise ToolError("'tools' must be a list of functions", "tools")
        functions = []
        for i, tool in enumerate(tools):
            f = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None  # fmt: skip
            if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not NAME.fullmatch(f["name"]):  # fmt: skip
                raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": letters, digits, _ or -, at most 64}}}}", "tools")  # fmt: skip
            parameters = f.get("parameters", {"type": "object", "properties": {}})
            if not isinstance(parameters, dict):
                raise ToolError(f"tools[{i}].function.parameters must be a JSON schema", "tools")
            functions.append({"name": f["name"], "description": f.get("description", ""), "parameters": parameters})  # fmt: skip
        names = [f["name"] for f in functions]
        if len(set(names)) < len(names):
            raise ToolError("two tools have the same name", "tools")
        if isinstance(choice, dict):
            named = choice.get("function", {}).get("name") if choice.get("type") == "function" else None  # fmt: skip
            if named not in names:
                raise ToolError(f"'tool_choice' names no function of 'tools' ({', '.join(names)})", "tool_choice")  # fmt: skip
            choice = named
        elif choice is None:
            choice = "auto"
        elif choice not in ("none", "auto", "required"):
            raise ToolError("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")  # fmt: skip
        return cls(tuple(functions), choice)

    def called(self) -> tuple[dict, ...]:
        """The functions a call may name under the choice."""
        if self.choice in ("auto", "required", "none"):
            return self.functions
        return tuple(f for f in self.functions if f["name"] == self.choice)

    def language(self, native: bool) -> Language | None:
        """The answers allowed: a call to one of ``called()``, or text too under ``"auto"``
        (text that does not begin as a call does); None for ``"none"``. ``native``: the
        template's own wrapping. ``ValueError`` (the schema's) for parameters it refuses."""
        if self.choice == "none":
            return None
        calls = []
        for f in self.called():
            call = {"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                    "required": ["name", "arguments"], "additionalProperties": False}  # fmt: skip
            tree = schema_to_tree(call)
            calls.append(concat(literal(OPEN), tree, literal(CLOSE)) if native else tree)
        if self.choice == "auto":  # or text whose first character is not the call's
            first = re.escape((OPEN if native else "{")[0])
            calls.append(parse(rf"([^{first}][\s\S]*)?"))
        return Language.of_tree(alt(calls))

    def prompt(self, messages: list[dict], native: bool) -> tuple[list[dict], dict]:
        """The messages and the template's variables: ``tools`` for a template that takes
        them, else the generic system message first (after the request's own)."""
        if native:
            return messages, {"tools": [{"type": "function", "function": f} for f in self.functions]}  # fmt: skip
        listing = "\n".join(json.dumps(f) for f in self.functions)
        if messages and messages[0]["role"] == "system":
            system = {"role": "system", "content": messages[0]["content"] + "\n\n" + GENERIC + "\n" + listing}  # fmt: skip
            return [system, *messages[1:]], {}
        return [{"role": "system", "content": GENERIC + "\n" + listing}, *messages], {}

    def reading(self, text: str, native: bool) -> tuple[str, str] | None:
        """How far ``text``, an answer on its way, reads as a call (the mask writes one
        compact: ``{"name":"...","arguments":...}``): ``(name, its arguments so far)`` once
        the name is complete, the call's closing held back; ``("", "")`` while it may yet
        be one; None where it is text."""
        if self.choice == "none":
            return None
        start = (OPEN if native else "") + '{"name":"'
        if not text.startswith(start):
            return ("", "") if start.startswith(text) else None
        name, quote, rest = text[len(start) :].partition('"')
        if not quote or not rest.startswith(',"arguments":'):
            return ("", "")  # the name, or what follows it, not complete yet
        closing = 1 + (len(CLOSE) if native else 0)  # the object's "}" (and the tags')
        arguments = rest[len(',"arguments":') :]
        return name, arguments[: max(len(arguments) - closing, 0)]

    def answer(self, text: str, native: bool) -> list[dict] | None:
        """A whole answer as ``tool_calls`` (OpenAI's form: the arguments as the model wrote
        them), or None where it is not a call."""
        read = self.reading(text, native)
        if not read or not read[0] or read[0] not in {f["name"] for f in self.called()}:
            return None
        try:
            json.loads(read[1])
        except json.JSONDecodeError:
            return None
        function = {"name": read[0], "arguments": read[1]}
        return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}]


def turn(message: dict, native: bool) -> dict:
    """An assistant message with ``tool_calls``, or a ``tool`` message, as the template reads
    it: native, as transformers passes them (arguments as an object); generic, the call as
    the text the model would have written, the result as a turn of role ``tool``."""
    calls = message.get("tool_calls")
    if message["role"] == "assistant" and calls:
        parsed = []
        for call in calls:
            f = call.get("function", {}) if isinstance(call, dict) else {}
            try:
                arguments = json.loads(f.get("arguments") or "{}")
            except (TypeError, json.JSONDecodeError):
                raise ToolError("a tool call's 'arguments' must be a JSON text", "messages") from None  # fmt: skip
            parsed.append({"name": f.get("name"), "arguments": arguments})
        if native:
            return {"role": "assistant", "content": message.get("content") or "",
                    "tool_calls": [{"type": "function", "function": p} for p in parsed]}  # fmt: skip
        return {"role": "assistant", "content": "\n".join(json.dumps(p) for p in parsed)}
    return message
