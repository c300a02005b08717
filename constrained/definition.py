"""The definition of the mask, written plainly: slow, and obviously right.

A token is allowed after ``text`` iff ``text + its bytes`` is a prefix of some string
of the language; an end-of-turn id iff ``text`` is a string of the language. The
language is its Thompson NFA (``automaton.nfa``, the construction of the textbook),
simulated as it is defined: the set of states after ``text`` is the epsilon closure of
the states one byte leads to, byte after byte; a prefix of a string of the language is
a text whose set holds a state from which the accepting state can still be reached.

Nothing of the fast path is used: no DFA, no byte classes, no dead-state cut, no trie,
no cache of masks. Each token is walked alone, byte by byte. (The step from one set of
NFA states and one byte is a pure function; it is remembered, so that the whole
vocabulary can be checked in seconds rather than hours.)
"""

from __future__ import annotations

import numpy as np

from .automaton import NFA
from .masks import Masking


class Definition:
    """A language's NFA, simulated: ``prefix(text)``, ``accepts(text)``, and the
    ``allowed`` tokens after a text."""

    def __init__(self, machine: NFA):
        self.nfa = machine
        self.live = self._live()
        self._steps: dict[tuple[frozenset, int], frozenset] = {}
        self.start = machine.closure([machine.start])

    def _live(self) -> set[int]:
        """The NFA states from which the accepting state is reachable."""
        into: dict[int, set[int]] = {}
        for s in range(len(self.nfa)):
            for *_, t in self.nfa.edges[s]:
                into.setdefault(t, set()).add(s)
            for t in self.nfa.empty[s]:
                into.setdefault(t, set()).add(s)
        live, todo = {self.nfa.accept}, [self.nfa.accept]
        while todo:
            for s in into.get(todo.pop(), ()):
                if s not in live:
                    live.add(s)
                    todo.append(s)
        return live

    def step(self, states: frozenset, byte: int) -> frozenset:
        key = (states, byte)
        if key not in self._steps:
            moved = [t for s in states for lo, hi, t in self.nfa.edges[s] if lo <= byte <= hi]
            self._steps[key] = self.nfa.closure(moved)
        return self._steps[key]

    def after(self, data: bytes, states: frozenset | None = None) -> frozenset:
        states = self.start if states is None else states
        for byte in data:
            states = self.step(states, byte)
            if not states:
                break
        return states

    def is_prefix(self, states: frozenset) -> bool:
        return not self.live.isdisjoint(states)

    def accepts(self, data: bytes) -> bool:
        return self.nfa.accept in self.after(data)

    def allowed(self, text: bytes, tokens, stop_ids=()) -> np.ndarray:
        """``(V,)`` bool over ``tokens`` (each one's bytes, ``None`` for a special token):
        what may follow ``text``."""
        here = self.after(text)
        out = np.zeros(len(tokens), dtype=bool)
        for i, data in enumerate(tokens):
            if data:  # a special or empty token adds no text: never allowed
                out[i] = self.is_prefix(self.after(data, here))
        for i in stop_ids:
            out[i] = self.nfa.accept in here
        return out


class DefinitionConstraint(Masking):
    """A request's constraint by the definition: the text so far, in bytes."""

    def __init__(self, definition: Definition, tokens, stop_ids=()):
        self.definition, self.tokens, self.stop_ids = definition, tokens, tuple(stop_ids)
        self.text = b""

    def allowed(self) -> np.ndarray:
        return self.definition.allowed(self.text, self.tokens, self.stop_ids)

    def advance(self, token: int) -> None:
        if token not in self.stop_ids:
            self.text += self.tokens[token]
