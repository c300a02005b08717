"""A language to constrain output to: a regular expression, compiled once to a DFA.

``Language.regex(pattern)`` matches the whole output (``fullmatch``);
``Language.schema(schema)`` the JSON texts of a schema (``constrained.schema``);
``Language.json_object()`` any JSON object (OpenAI's ``{"type": "json_object"}``). Each
keeps its tree and its DFA; its pattern (to read) and the NFA, which only the
definition simulates, are built when asked for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

from .automaton import DFA, NFA, nfa
from .regex import parse, to_pattern
from .schema import DEPTH, any_json_tree, schema_to_tree


@dataclass(eq=False)
class Language:
    """A regular language over UTF-8 text: its ``tree``, its ``dfa``, and the seconds the
    compile took (``compile_s``); ``pattern`` reads it as a regular expression."""

    tree: object = field(repr=False)
    dfa: DFA = field(repr=False)
    compile_s: float = 0.0
    source: str | None = None  # the pattern it was compiled from, if any

    @classmethod
    def regex(cls, pattern: str) -> Language:
        """The strings ``pattern`` matches whole. ``RegexError``, ``LanguageTooLarge`` or
        ``EmptyLanguage`` (all ``ValueError``) for a pattern it cannot be."""
        start = time.perf_counter()
        language = cls.of_tree(parse(pattern), start)
        return cls(language.tree, language.dfa, language.compile_s, pattern)

    @classmethod
    def of_tree(cls, tree, start: float | None = None) -> Language:
        start = time.perf_counter() if start is None else start
        return cls(tree, DFA.from_nfa(nfa(tree)), time.perf_counter() - start)

    @classmethod
    def schema(cls, schema, *, whitespace: bool = False, depth: int = DEPTH) -> Language:
        """The JSON texts of the values valid under ``schema``; ``SchemaError`` (naming the
        keyword) and the errors of ``regex``."""
        start = time.perf_counter()
        return cls.of_tree(schema_to_tree(schema, whitespace=whitespace, depth=depth), start)

    @classmethod
    def json_object(cls, *, whitespace: bool = False, depth: int = DEPTH) -> Language:
        """Any JSON object, nested at most ``depth`` deep."""
        return cls.of_tree(any_json_tree(whitespace=whitespace, depth=depth, top="object"))

    @cached_property
    def pattern(self) -> str:
        """The language as a regular expression (the source, or the tree printed: a
        schema's automata, ``regex.Graph``, by state elimination, which can be long)."""
        return self.source if self.source is not None else to_pattern(self.tree)

    @cached_property
    def nfa(self) -> NFA:
        """Thompson's automaton of the same tree (what the definition simulates)."""
        return nfa(self.tree)

    def accepts(self, text: str | bytes) -> bool:
        """Whether ``text`` is a whole string of the language."""
        return self.dfa.accepts(text.encode() if isinstance(text, str) else text)
