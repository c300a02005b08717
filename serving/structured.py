"""``response_format``: a request's output held to a JSON schema, any JSON object, or a regex.

OpenAI's two forms, and one of this server's:

* ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``: the JSON
  texts valid under the schema (``constrained.schema`` lists the subset; any other
  keyword is a 400 naming it);
* ``{"type": "json_object"}``: any JSON object (nested at most ``constrained.schema.DEPTH``);
* ``{"type": "regex", "regex": "..."}``: the texts the pattern matches whole;
* ``{"type": "text"}``, or none: unconstrained.

A format is compiled once (its DFA, and the vocabulary's trie the first time any is)
and kept, the last ``KEPT`` of them, with the masks its requests have computed, so a
client that sends the same schema with every request pays the compile once. Each
request gets its own ``Constraint`` (its place in the language), which the engine
applies to its logits before its sampler; batched requests under different formats,
or none, decode in one step as before. A constrained request that names no
``max_tokens`` gets ``MAX_TOKENS`` at most, and its constraint that budget: the mask
keeps room to close the text and end it within it (``constrained.masks.Constraint``), so
an answer that would loop (a string, an array that never closes) ends valid, with
``finish_reason`` ``"stop"``.
"""

from __future__ import annotations

import collections
import json
import threading

from constrained import Index, Language, Tokens

MAX_TOKENS = 512  # a constrained answer's max_tokens when its request names none: room for
# any answer the examples' schemas and json_object give, and the most a loop can cost
KEPT = 16  # compiled formats kept, least recently used dropped first (each with its masks,
# up to constrained.masks.MASK_BYTES: 1 GiB at most in all)


class FormatError(ValueError):
    """A ``response_format`` that cannot be honoured (the server's 400)."""


class Formats:
    """The compiled formats of one server, over its model's ``tokenizer`` and end-of-turn
    ``stop_ids``."""

    def __init__(self, tokenizer, stop_ids, kept: int = KEPT):
        self.tokenizer, self.stop_ids, self.kept = tokenizer, tuple(stop_ids), kept
        self._tokens: Tokens | None = None
        self._indexes: collections.OrderedDict[str, Index] = collections.OrderedDict()
        self._lock = threading.Lock()

    def index(self, response_format, key=None, compile_=None) -> Index | None:
        """The ``Index`` of a request's ``response_format`` (None: unconstrained), or of the
        language ``compile_()`` makes, kept under ``key`` (a request's tools);
        ``FormatError`` saying why not. May take a while the first time: call it off the
        event loop."""
        if compile_ is None:
            key, compile_ = _parse(response_format)
        if compile_ is None:
            return None
        with self._lock:
            if key in self._indexes:
                self._indexes.move_to_end(key)
                return self._indexes[key]
        try:
            language = compile_()
        except ValueError as exc:
            raise FormatError(f"response_format: {exc}") from None
        index = Index(language, self.tokens(), self.stop_ids)
        with self._lock:
            self._indexes[key] = index
            while len(self._indexes) > self.kept:
                self._indexes.popitem(last=False)
        return index

    def tokens(self) -> Tokens:
        """The vocabulary's bytes and trie, built on first use."""
        with self._lock:
            if self._tokens is None:
                self._tokens = Tokens.from_tokenizer(self.tokenizer)
            return self._tokens


def _parse(response_format):
    """-> ``(cache key, a function compiling its Language)``, or ``(None, None)``."""
    if response_format is None:
        return None, None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise FormatError("'response_format' must be an object with a 'type'")
    kind = response_format["type"]
    if kind == "text":
        return None, None
    if kind == "json_object":
        return "json_object", Language.json_object
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise FormatError("'response_format' of type json_schema needs json_schema.schema")
        schema = spec["schema"]
        if not isinstance(schema, dict | bool):
            raise FormatError(
                "response_format: json_schema.schema must be a JSON schema (an object)"
            )
        return "schema " + json.dumps(schema, sort_keys=True), lambda: Language.schema(schema)
    if kind == "regex":
        pattern = response_format.get("regex")
        if not isinstance(pattern, str):
            raise FormatError("'response_format' of type regex needs 'regex', a string")
        return "regex " + pattern, lambda: Language.regex(pattern)
    raise FormatError(
        f"response_format type {kind!r} is not supported (text, json_object, json_schema, regex)"
    )
