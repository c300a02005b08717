"""Languages of characters as automata: intersection, difference, a shortest member, and
back to a tree.

A regular expression cannot say "a key that matches this pattern but is none of these
names" or "digits whose number is a multiple of 7 between 10 and 500" in a size anyone
would write; their automata can. These operations work on a ``Chars``-level DFA
(``CharDFA``: its edges are ranges of code points, not bytes, so that a string of
characters means one thing however it is spelled), built from a tree by the same
Thompson construction and subset construction as the byte automata
(``automaton.nfa(tree, chars=True)``, ``automaton.determinize``), combined pairwise by
the product construction, and turned back into a tree (``to_tree``: a ``Graph`` whose
edges are sets of characters) that the schema compiler writes into a larger language.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .automaton import DEAD, EmptyLanguage, determinize, live, nfa, numbered
from .regex import MAX_CODE_POINT, Chars, Graph, normalize


@dataclass(frozen=True)
class CharDFA:
    """A DFA over code points: ``firsts (C,)`` the first code point of each class (a class
    runs to the next one's first), ``table (N, C)`` the next state (``DEAD``: none),
    ``accepting (N,)``; the start is 0 and every state can still reach an accepting one."""

    firsts: np.ndarray
    table: np.ndarray
    accepting: np.ndarray

    @classmethod
    def of(cls, tree) -> CharDFA | None:
        """The language of ``tree``; None when it is empty."""
        machine = nfa(tree, chars=True)
        cuts = {0, MAX_CODE_POINT + 1}
        for edges in machine.edges:
            for first, last, _ in edges:
                cuts.update((first, last + 1))
        firsts = sorted(cuts)[:-1]
        table, accepting = determinize(machine, firsts)
        return _kept(np.array(firsts), table, accepting)

    def accepts(self, text: str) -> bool:
        state = 0
        for c in text:
            state = int(self.table[state, np.searchsorted(self.firsts, ord(c), "right") - 1])
            if state == DEAD:
                return False
        return bool(self.accepting[state])


def _kept(firsts: np.ndarray, table: np.ndarray, accepting: np.ndarray) -> CharDFA | None:
    """The live states, merged where no string tells them apart (None: the empty language)."""
    try:
        table, accepting = live(table, accepting)
    except EmptyLanguage:
        return None
    return CharDFA(firsts, *minimal(table, accepting))


def minimal(table: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fewest states (Moore's refinement): states start in two blocks, accepting or
    not, and a block splits while two of its states step, on some class, into different
    blocks; each block left is one state (the start's block numbered 0)."""
    block, count = accepting.astype(np.int64), len(np.unique(accepting))
    while True:
        after = np.where(table >= 0, block[np.maximum(table, 0)], -1)  # (N, C)
        signature = np.concatenate([block[:, None], after], axis=1)
        _, first, refined = np.unique(signature, axis=0, return_index=True, return_inverse=True)
        refined = refined.reshape(-1)
        if len(first) == count:  # no block split: stable
            break
        block, count = refined, len(first)
    order = np.argsort(np.argsort(first))  # blocks in order of their first state: start is 0
    block = order[refined]
    count = int(block.max()) + 1
    where = np.zeros(count, dtype=np.int64)
    where[block[::-1]] = np.arange(len(block))[::-1]  # a state of each block
    new = np.where(table[where] >= 0, block[np.maximum(table[where], 0)], DEAD).astype(np.int32)
    return new, accepting[where]


def product(a: CharDFA, b: CharDFA | None, keep: Callable[[bool, bool], bool]) -> CharDFA | None:
    """The strings ``s`` of ``a`` for which ``keep(s in a, s in b)`` (``b`` None: the empty
    language), by walking both at once; None when there are none. ``keep`` must be false
    where ``s`` is not in ``a`` (intersection: ``and``; difference: ``a and not b``)."""
    if b is None:
        return a if keep(True, False) else None
    firsts = np.union1d(a.firsts, b.firsts)
    column_a = np.searchsorted(a.firsts, firsts, "right") - 1  # (C,): each class's in a
    column_b = np.searchsorted(b.firsts, firsts, "right") - 1
    ids, order, rows = {(0, 0): 0}, [(0, 0)], []
    while len(rows) < len(order):
        x, y = order[len(rows)]
        next_a = a.table[x, column_a]  # (C,)
        next_b = b.table[y, column_b] if y != DEAD else np.full(len(firsts), DEAD)
        row = np.full(len(firsts), DEAD, dtype=np.int32)
        for c in np.flatnonzero(next_a != DEAD):  # a string out of a is never kept
            row[c] = numbered((int(next_a[c]), int(next_b[c])), ids, order)
        rows.append(row)
    accepting = np.array(
        [keep(bool(a.accepting[x]), y != DEAD and bool(b.accepting[y])) for x, y in order]
    )
    return _kept(firsts, np.array(rows, dtype=np.int32), accepting)


def intersection(a: CharDFA | None, b: CharDFA | None) -> CharDFA | None:
    return None if a is None else product(a, b, lambda x, y: x and y)


def difference(a: CharDFA | None, b: CharDFA | None) -> CharDFA | None:
    return None if a is None else product(a, b, lambda x, y: x and not y)


def shortest(dfa: CharDFA) -> str:
    """A shortest string of the language (the lowest code point of each class on the way),
    breadth first: what an error shows as an example."""
    came: dict[int, tuple[int, int]] = {0: (-1, -1)}
    frontier = [0]
    while frontier:
        for state in frontier:
            if dfa.accepting[state]:
                text = []
                while came[state][0] >= 0:
                    state, c = came[state]
                    text.append(chr(int(dfa.firsts[c])))
                return "".join(reversed(text))
        later = []
        for state in frontier:
            for c in np.flatnonzero(dfa.table[state] != DEAD):
                t = int(dfa.table[state, c])
                if t not in came:
                    came[t] = (state, int(c))
                    later.append(t)
        frontier = later
    raise EmptyLanguage("no string matches")  # a CharDFA is never empty


def to_tree(dfa: CharDFA) -> Graph:
    """The language as a tree: a ``Graph`` with a state per DFA state and, between two
    states, one edge reading the set of characters that leads from one to the other."""
    ends = [*dfa.firsts[1:].tolist(), MAX_CODE_POINT + 1]
    between: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for state, c in zip(*np.nonzero(dfa.table != DEAD), strict=True):
        key = (int(state), int(dfa.table[state, c]))
        between.setdefault(key, []).append((int(dfa.firsts[c]), ends[c] - 1))
    edges = tuple((a, b, Chars(normalize(ranges))) for (a, b), ranges in between.items())
    return Graph(len(dfa.table), edges, frozenset(np.flatnonzero(dfa.accepting).tolist()))
