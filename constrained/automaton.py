"""From a regex tree to automata over bytes: a Thompson NFA, then a DFA.

A token is a string of bytes, and a byte-level BPE token may hold half of a character
(the first two bytes of "€"), so the automata read UTF-8 bytes, not characters. A set
of characters becomes the byte sequences that spell its members (``utf8_sequences``:
the ranges split where the encoded length or a leading byte changes, as Russ Cox's
``utf8`` ranges in RE2 do), so only well-formed UTF-8 is ever accepted.

``nfa(tree)`` is Thompson's construction: a state per position, byte-range edges and
empty (epsilon) edges (a ``Graph``'s states become states, its edges pieces). It is what
the definition simulates (``definition.py``). ``nfa(tree, chars=True)`` builds the same
over code points, for ``algebra.py``'s operations on languages of characters.
``DFA.from_nfa`` is the subset construction (``determinize``) over byte *classes*
(bytes that no edge tells apart share a column: JSON's DFAs have a few dozen, not 256),
then every state from which no accepting state can be reached is cut (``live``; its
transitions become -1): in what is left, a walk that has not died is a prefix of some
string of the language, which is the whole of the test a mask needs.

Sizes are bounded, and refused by a ``LanguageTooLarge`` naming the limit, before the
memory goes: ``MAX_NFA_STATES`` (a ``{0,1000}`` of a large group is a thousand copies)
and ``MAX_DFA_STATES`` (a subset construction can grow exponentially).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .regex import Alt, Chars, Concat, Graph, Repeat

MAX_NFA_STATES = 200_000
MAX_DFA_STATES = 50_000
DEAD = -1


class LanguageTooLarge(ValueError):
    """An automaton over its size limit; the message names the limit."""


class EmptyLanguage(ValueError):
    """A pattern or schema that no string matches."""


# ----------------------------------------------------------------------------- UTF-8

_LENGTH_ENDS = (0x7F, 0x7FF, 0xFFFF, 0x10FFFF)  # the last code point of 1-, 2-, 3-, 4-byte forms


def utf8_sequences(lo: int, hi: int) -> list[tuple[tuple[int, int], ...]]:
    """The code points ``lo..hi`` as sequences of byte ranges: each sequence a tuple of
    ``(first, last)`` byte ranges, one per byte; their union spells exactly the range."""
    out = []
    start = lo
    for end in _LENGTH_ENDS:  # pieces of one encoded length
        if start > hi:
            break
        if start <= end:
            _same_length(start, min(hi, end), out)
            start = end + 1
    return out


def _same_length(lo: int, hi: int, out: list) -> None:
    """``lo..hi``, encoded in the same number of bytes, split until each byte ranges
    independently: where the low bits of ``lo`` are not all 0 or those of ``hi`` not all 1
    below a byte that differs, the range is cut there."""
    n = len(chr(lo).encode())
    for i in range(1, n):
        mask = (1 << (6 * i)) - 1  # the bits of the last i continuation bytes
        if lo & ~mask != hi & ~mask:
            if lo & mask:
                _same_length(lo, lo | mask, out)
                _same_length((lo | mask) + 1, hi, out)
                return
            if hi & mask != mask:
                _same_length(lo, (hi & ~mask) - 1, out)
                _same_length(hi & ~mask, hi, out)
                return
    a, b = chr(lo).encode(), chr(hi).encode()
    out.append(tuple(zip(a, b, strict=True)))


# ----------------------------------------------------------------------------- the NFA


class NFA:
    """Thompson's automaton: ``edges[s]`` is a list of ``(first, last, target)`` byte ranges,
    ``empty[s]`` the targets of its epsilon edges; one start and one accepting state."""

    def __init__(self):
        self.edges: list[list[tuple[int, int, int]]] = []
        self.empty: list[list[int]] = []
        self.start = self.accept = 0

    def state(self) -> int:
        if len(self.edges) >= MAX_NFA_STATES:
            raise LanguageTooLarge(
                f"the pattern's automaton is over {MAX_NFA_STATES} states (a large group "
                "repeated many times?)"
            )
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1

    def __len__(self) -> int:
        return len(self.edges)

    def closure(self, states) -> frozenset[int]:
        """``states`` and every state their epsilon edges reach."""
        seen, todo = set(states), list(states)
        while todo:
            for t in self.empty[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


def nfa(tree, *, chars: bool = False) -> NFA:
    """Thompson's construction of ``tree``'s language over UTF-8 bytes (``chars``: over code
    points, an edge a range of characters, as ``algebra.py`` reads languages)."""
    machine = NFA()
    machine.start, machine.accept = _fragment(machine, tree, chars)
    return machine


def _fragment(m: NFA, node, chars: bool) -> tuple[int, int]:
    """States ``(entry, exit)`` of a piece recognising ``node``."""
    if isinstance(node, Chars):
        entry, exit_ = m.state(), m.state()
        _read(m, node, entry, exit_, chars)
        return entry, exit_
    if isinstance(node, Concat):
        entry = exit_ = m.state()
        for part in node.parts:
            a, b = _fragment(m, part, chars)
            m.empty[exit_].append(a)
            exit_ = b
        return entry, exit_
    if isinstance(node, Alt):
        entry, exit_ = m.state(), m.state()
        for option in node.options:
            a, b = _fragment(m, option, chars)
            m.empty[entry].append(a)
            m.empty[b].append(exit_)
        return entry, exit_
    if isinstance(node, Repeat):
        entry = exit_ = m.state()
        for _ in range(node.low):  # the required copies, one after the other
            a, b = _fragment(m, node.node, chars)
            m.empty[exit_].append(a)
            exit_ = b
        if node.high is None:  # then any number more: a loop
            a, b = _fragment(m, node.node, chars)
            m.empty[exit_].append(a)
            m.empty[b].append(exit_)
            return entry, exit_
        end = m.state()
        m.empty[exit_].append(end)
        for _ in range(node.high - node.low):  # then up to high - low more, each optional
            a, b = _fragment(m, node.node, chars)
            m.empty[exit_].append(a)
            m.empty[b].append(end)
            exit_ = b
        return entry, end
    if isinstance(node, Graph):  # a state each, and a piece for each edge's tree
        states = [m.state() for _ in range(node.states)]
        exit_ = m.state()
        for a, b, tree in node.edges:
            if isinstance(tree, Chars):  # straight from state to state (a DFA stays one)
                _read(m, tree, states[a], states[b], chars)
                continue
            x, y = _fragment(m, tree, chars)
            m.empty[states[a]].append(x)
            m.empty[y].append(states[b])
        for a in node.accepting:
            m.empty[states[a]].append(exit_)
        return states[0], exit_
    raise TypeError(f"not a regex tree: {node!r}")


def _read(m: NFA, node: Chars, entry: int, exit_: int, chars: bool) -> None:
    """Edges from ``entry`` to ``exit_`` reading one character of ``node``: a range of code
    points (``chars``), or the byte sequences that spell them, through states between."""
    if chars:
        m.edges[entry].extend((lo, hi, exit_) for lo, hi in node.ranges)
        return
    for lo, hi in node.ranges:
        for sequence in utf8_sequences(lo, hi):
            at = entry
            for i, (first, last) in enumerate(sequence):
                to = exit_ if i == len(sequence) - 1 else m.state()
                m.edges[at].append((first, last, to))
                at = to


# ----------------------------------------------------------------------------- the DFA


@dataclass(frozen=True)
class DFA:
    """A deterministic automaton over bytes, every state live (an accepting state is
    reachable from it); the start state is 0.

    ``classes (256,)``: each byte's column; ``table (N, C)``: the next state, ``DEAD`` (-1)
    where the text can no longer become a string of the language; ``accepting (N,)``."""

    classes: np.ndarray
    table: np.ndarray
    accepting: np.ndarray
    start: int = 0

    @property
    def states(self) -> int:
        return len(self.table)

    def step(self, state: int, byte: int) -> int:
        return int(self.table[state, self.classes[byte]])

    def walk(self, state: int, data: bytes) -> int:
        """The state after ``data`` from ``state``, or ``DEAD``."""
        for byte in data:
            state = int(self.table[state, self.classes[byte]])
            if state == DEAD:
                return DEAD
        return state

    def accepts(self, data: bytes) -> bool:
        state = self.walk(self.start, data)
        return state != DEAD and bool(self.accepting[state])

    def byte_table(self) -> np.ndarray:
        """``(N, 256)`` int32: the next state for every byte (the trie walk's lookup)."""
        return np.ascontiguousarray(self.table[:, self.classes])

    @classmethod
    def from_nfa(cls, machine: NFA) -> DFA:
        """The subset construction, over byte classes, then the dead states cut."""
        firsts = _class_starts(machine, 256)
        table, accepting = determinize(machine, firsts)
        table, accepting = live(table, accepting)
        classes = np.zeros(256, dtype=np.int32)
        for c, first in enumerate(firsts):
            classes[first:] = c
        return cls(classes, table, accepting)


def _class_starts(machine: NFA, size: int) -> list[int]:
    """The first symbol of each class: the symbols ``0 .. size - 1`` cut into runs that every
    edge either covers whole or not at all."""
    cuts = {0, size}
    for edges in machine.edges:
        for first, last, _ in edges:
            cuts.update((first, last + 1))
    return sorted(cuts)[:-1]


def determinize(machine: NFA, firsts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The subset construction of ``machine`` over the classes that start at ``firsts``
    (every edge covers whole classes) -> ``(table (N, C), accepting (N,))``, state 0 the
    start, ``DEAD`` where no NFA state follows. ``LanguageTooLarge`` past ``MAX_DFA_STATES``."""
    column = {first: c for c, first in enumerate(firsts)}
    end = len(firsts)
    start = machine.closure([machine.start])
    ids = {start: 0}
    order, rows = [start], []
    closures: dict[frozenset, frozenset] = {}
    while len(rows) < len(order):
        subset = order[len(rows)]
        moves: dict[int, set[int]] = {}
        for s in subset:
            for first, last, target in machine.edges[s]:
                for c in range(column[first], column.get(last + 1, end)):
                    moves.setdefault(c, set()).add(target)
        row = [DEAD] * len(firsts)
        for c, targets in moves.items():
            key = frozenset(targets)
            if key not in closures:
                closures[key] = machine.closure(key)
            row[c] = numbered(closures[key], ids, order)
        rows.append(row)
    table = np.array(rows, dtype=np.int32).reshape(len(rows), len(firsts))
    accepting = np.array([machine.accept in subset for subset in order])
    return table, accepting


def numbered(key, ids: dict, order: list) -> int:
    """The state ``key`` stands for (its set of NFA states, its pair of states), numbered
    in the order first reached; ``LanguageTooLarge`` for one past ``MAX_DFA_STATES``."""
    if key not in ids:
        if len(order) >= MAX_DFA_STATES:
            raise LanguageTooLarge(f"the language's automaton is over {MAX_DFA_STATES} states")
        ids[key] = len(order)
        order.append(key)
    return ids[key]


def live(table: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Only the states from which an accepting state is reachable, renumbered in order
    (so the start stays 0); transitions into the others become ``DEAD``. ``EmptyLanguage``
    if the start is not one of them."""
    n = len(table)
    source, _ = np.nonzero(table >= 0)
    target = table[table >= 0]
    order = np.argsort(target, kind="stable")
    into = np.searchsorted(
        target[order], np.arange(n + 1)
    )  # edges into t: order[into[t]:into[t+1]]
    keep = accepting.copy()
    todo = list(np.flatnonzero(accepting))
    while todo:  # backwards from the accepting states: a state is live if it steps to one
        t = todo.pop()
        for s in source[order[into[t] : into[t + 1]]]:
            if not keep[s]:
                keep[s] = True
                todo.append(s)
    if not keep[0]:
        raise EmptyLanguage("no string matches: the language is empty")
    new = np.full(n + 1, DEAD, dtype=np.int32)  # index n: DEAD maps to DEAD
    new[np.flatnonzero(keep)] = np.arange(int(keep.sum()), dtype=np.int32)
    kept = table[keep]
    return new[np.where(kept >= 0, kept, n)], accepting[keep]
