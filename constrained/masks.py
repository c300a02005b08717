"""The fast path: which tokens may come next, per DFA state, from a walk of the byte trie.

An ``Index`` joins a language's DFA to a vocabulary (``Tokens``: each token's bytes
and their trie, built once per tokenizer) and the model's end-of-turn ids. The mask
of a state is computed once, the first time a request reaches it, and cached (packed,
a bit per token): a token is allowed iff walking its bytes from the state never
reaches ``DEAD`` (every state of the DFA is live, so that is "the text plus the token
is still a prefix of a string of the language"), and an end-of-turn id iff the state
accepts. The walk goes through the trie level by level, a numpy gather per level, and
drops a subtree as soon as its prefix dies: in a state between two JSON tokens almost
every first byte is dead, and the walk ends after one level.

A ``Constraint`` is one request's place in the language: ``apply(logits)`` sets the
logits of the tokens not allowed to ``-inf`` (the sampler then draws as ever among the
rest: temperature, top-k, top-p), and ``advance(token)`` moves on by its bytes. Several
requests share an ``Index`` (and its cache); each has its own ``Constraint``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .automaton import DEAD
from .language import Language
from .vocabulary import Trie, token_bytes

MASK_BYTES = 64 << 20  # the masks one index keeps, at most (then the oldest are dropped)
FAR = 1 << 30  # a distance: no way to an accepting state by one-byte tokens
REFUSED = np.iinfo(np.int32).max  # a token's reach where the mask refuses it


class NoTokenAllowed(ValueError):
    """No token of the vocabulary continues the text (a vocabulary without some byte)."""


@dataclass(frozen=True, eq=False)
class Tokens:
    """A vocabulary: each token's bytes (``None``: a special token, no text) and their trie."""

    bytes: tuple
    trie: Trie

    @classmethod
    def from_list(cls, tokens: list[bytes | None]) -> Tokens:
        return cls(tuple(tokens), Trie.build(list(tokens)))

    @classmethod
    def from_tokenizer(cls, tokenizer) -> Tokens:
        return cls.from_list(token_bytes(tokenizer))

    def __len__(self) -> int:
        return len(self.bytes)


class Index:
    """The masks of ``language`` over ``tokens``, cached per DFA state; ``stop_ids`` (the
    model's end-of-turn ids) are allowed in the accepting states only."""

    def __init__(self, language: Language, tokens: Tokens, stop_ids=()):
        self.language, self.tokens = language, tokens
        self.stop_ids = np.array(sorted(set(stop_ids)), dtype=np.int64)
        self.dfa = language.dfa
        self._next = self.dfa.byte_table()  # (N, 256)
        self._masks: dict[int, np.ndarray] = {}  # state -> packed bits, (ceil(V / 8),)
        self._reaches: dict[int, np.ndarray] = {}  # state -> (V,) int32, see ``reach``
        self._lock = threading.Lock()

    def mask(self, state: int) -> np.ndarray:
        """``(V,)`` bool: the tokens allowed in ``state``. Kept up to ``MASK_BYTES`` (10k
        states of SmolLM2's, 2k of Gemma 3's; a request reaches a state per token at most),
        the oldest dropped first, so that no client's schema can hold the memory."""
        packed = self._masks.get(state)
        if packed is None:
            packed = np.packbits(self._walk(state) >= 0)
            self._keep(self._masks, state, packed)
        return np.unpackbits(packed, count=len(self.tokens)).view(bool)

    def _keep(self, cache: dict, state: int, value: np.ndarray) -> None:
        with self._lock:
            cache[state] = value
            while len(cache) * value.nbytes > MASK_BYTES:
                del cache[next(iter(cache))]

    def _walk(self, state: int) -> np.ndarray:
        """``(V,)`` int32: the state each token leads to from ``state`` (-1: not allowed; an
        end-of-turn id leads to ``state`` itself where it accepts)."""
        trie = self.tokens.trie
        ends = np.append(trie.ends(self._next, state), -1)  # index -1: no node
        after = ends[trie.token_node]  # (V,)
        after[self.stop_ids] = state if self.dfa.accepting[state] else -1
        return after

    @cached_property
    def distance(self) -> np.ndarray:
        """``(N,)`` int64: the fewest tokens from each state to an accepting one, counted
        as tokens of one byte each (``FAR`` where bytes of one-byte tokens cannot get
        there). A byte-level vocabulary has a token for every byte (SmolLM2's, Llama's),
        a SentencePiece one a byte-fallback token (Gemma's ``<0xNN>``), so this is the
        length of the shortest way to the end, and an upper bound on its tokens."""
        single = np.zeros(256, dtype=bool)
        single[[data[0] for data in self.tokens.bytes if data and len(data) == 1]] = True
        table = self._next[:, single]  # (N, k): the steps one-byte tokens take
        return _distances(table, self.dfa.accepting)

    @cached_property
    def farthest(self) -> int:
        """The largest finite ``distance``: a budget with this much room never binds."""
        finite = self.distance[self.distance < FAR]
        return int(finite.max(initial=0))

    def reach(self, state: int) -> np.ndarray:
        """``(V,)`` int32: for each token allowed in ``state``, the ``distance`` of the state
        it leads to (``REFUSED`` for the tokens not allowed; 0 for an end-of-turn id where
        the state accepts). Computed when a budget is short, kept as the masks are."""
        kept = self._reaches.get(state)
        if kept is None:
            after = self._walk(state)
            kept = np.where(after >= 0, self.distance[after], REFUSED).astype(np.int32)
            self._keep(self._reaches, state, kept)
        return kept

    def build(self) -> float:
        """Every state's mask now (the whole index, as engines that build it up front do);
        -> the seconds it took."""
        import time

        start = time.perf_counter()
        for state in range(self.dfa.states):
            self.mask(state)
        return time.perf_counter() - start

    def constraint(self, budget: int | None = None) -> Constraint:
        """A new request's place: the start of the language. ``budget``: the most tokens
        it may take (its ``max_tokens``, the end-of-turn token among them); the masks then
        keep room to end the text within it (``Constraint``)."""
        return Constraint(self, budget)


def _distances(table: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """``table (N, k)`` (next states, -1 dead) -> ``(N,)`` the fewest steps from each state to
    an accepting one (``FAR``: none): a breadth-first search backwards from the accepting
    states, over the edges sorted by target."""
    n = len(table)
    source = np.repeat(np.arange(n), table.shape[1])
    target = table.reshape(-1)
    source, target = source[target >= 0], target[target >= 0]
    order = np.argsort(target, kind="stable")
    into = np.searchsorted(
        target[order], np.arange(n + 1)
    )  # edges into t: order[into[t]:into[t+1]]
    distance = np.where(accepting, 0, FAR).astype(np.int64)
    frontier, steps = np.flatnonzero(accepting), 0
    while frontier.size:
        steps += 1
        edges = np.concatenate([order[into[t] : into[t + 1]] for t in frontier])
        sources = np.unique(source[edges])
        frontier = sources[distance[sources] == FAR]
        distance[frontier] = steps
    return distance


class Masking:
    """What a constraint does to logits, given ``allowed()``; ``advance`` is its own."""

    def allowed(self) -> np.ndarray:
        raise NotImplementedError

    def apply(self, logits) -> np.ndarray:
        """``logits (B, V')`` (or ``(V',)``) -> float64, ``-inf`` where a token is not
        allowed. ``V'`` may exceed the vocabulary (a model's padded rows: never allowed)."""
        logits = np.asarray(logits, dtype=np.float64)
        allowed = self.allowed()
        width = logits.shape[-1]
        if width != len(allowed):
            allowed = np.pad(allowed, (0, max(width - len(allowed), 0)))[:width]
        if not allowed.any():
            raise NoTokenAllowed("no token of the vocabulary continues the text here")
        return np.where(allowed, logits, -np.inf)


class Constraint(Masking):
    """One request's place in an ``Index``'s language, and what it may still take.

    With a ``budget`` (its ``max_tokens``: the tokens it may take, the end-of-turn token
    among them) the mask also keeps room to end: after ``k`` tokens a token is allowed
    only if the state it leads to is at most ``budget - k - 2`` one-byte tokens from an
    accepting one (room for those and the end-of-turn token). One token of the shortest
    way always passes, so a text that starts within its budget ends within it, with the
    end-of-turn token: never cut at ``max_tokens``. While the room is larger than
    ``Index.farthest`` (every state's distance) the budget changes nothing and the
    cached mask is used as it is. A budget too small for the shortest text of the
    language cannot be kept: the mask then allows the tokens nearest the end."""

    def __init__(self, index: Index, budget: int | None = None):
        self.index, self.state, self.ended = index, index.dfa.start, False
        self.budget = budget  # tokens it may still take (None: no limit)

    def allowed(self) -> np.ndarray:
        index, room = self.index, None if self.budget is None else self.budget - 2
        if room is None or room >= index.farthest:
            return index.mask(self.state)
        reach = index.reach(self.state)  # (V,)
        allowed = reach <= room
        allowed[index.stop_ids] = self.accepting
        if not allowed.any():  # over its budget already: the tokens nearest the end
            allowed = reach == min(reach.min(), REFUSED - 1)
        return allowed

    @property
    def accepting(self) -> bool:
        return bool(self.index.dfa.accepting[self.state])

    def advance(self, token: int) -> None:
        """Take ``token``: an end-of-turn id ends the text (in an accepting state), any other
        moves on by its bytes. ``ValueError`` for a token the mask did not allow."""
        index = self.index
        if self.budget is not None:
            self.budget -= 1
        if token in index.stop_ids and self.accepting:
            self.ended = True
            return
        data = index.tokens.bytes[token] if 0 <= token < len(index.tokens) else None
        state = DEAD if not data or self.ended else index.dfa.walk(self.state, data)
        if state == DEAD:
            raise ValueError(f"token {token} is not allowed here")
        self.state = state
