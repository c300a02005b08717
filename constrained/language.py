"""A language to constrain output to: a regular expression, compiled once to a DFA.

``Language.regex(pattern)`` matches the whole output (``fullmatch``);
``Language.schema(schema)`` the JSON texts of a schema (``constrained.schema``);
``Language.json_object()`` any JSON object (OpenAI's ``{"type": "json_object"}``). Each
keeps its pattern (to read), its tree, and its DFA; the NFA, which only the definition
simulates, is built when asked for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

from .automaton import DFA, NFA, nfa
from .regex import parse
from .schema import DEPTH, any_json_regex, schema_to_regex


@dataclass(eq=False)
class Language:
    """A regular language over UTF-8 text: ``pattern``, its ``dfa``, and the seconds the
    compile took (``compile_s``)."""

    pattern: str
    tree: object = field(repr=False)
    dfa: DFA = field(repr=False)
    compile_s: float = 0.0

    @classmethod
    def regex(cls, pattern: str) -> Language:
        """The strings ``pattern`` matches whole. ``RegexError``, ``LanguageTooLarge`` or
        ``EmptyLanguage`` (all ``ValueError``) for a pattern it cannot be."""
        start = time.perf_counter()
        tree = parse(pattern)
        dfa = DFA.from_nfa(nfa(tree))
        return cls(pattern, tree, dfa, time.perf_counter() - start)

    @classmethod
    def schema(cls, schema, *, whitespace: bool = False, depth: int = DEPTH) -> Language:
        """The JSON texts of the values valid under ``schema``; ``SchemaError`` (naming the
        keyword) and the errors of ``regex``."""
        start = time.perf_counter()
        language = cls.regex(schema_to_regex(schema, whitespace=whitespace, depth=depth))
        language.compile_s = time.perf_counter() - start
        return language

    @classmethod
    def json_object(cls, *, whitespace: bool = False, depth: int = DEPTH) -> Language:
        """Any JSON object, nested at most ``depth`` deep."""
        return cls.regex(any_json_regex(whitespace=whitespace, depth=depth, top="object"))

    @cached_property
    def nfa(self) -> NFA:
        """Thompson's automaton of the same tree (what the definition simulates)."""
        return nfa(self.tree)

    def accepts(self, text: str | bytes) -> bool:
        """Whether ``text`` is a whole string of the language."""
        return self.dfa.accepts(text.encode() if isinstance(text, str) else text)
