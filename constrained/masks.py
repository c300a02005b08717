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

import numpy as np

from .automaton import DEAD
from .language import Language
from .vocabulary import Trie, token_bytes

MASK_BYTES = 64 << 20  # the masks one index keeps, at most (then the oldest are dropped)


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
        self._lock = threading.Lock()

    def mask(self, state: int) -> np.ndarray:
        """``(V,)`` bool: the tokens allowed in ``state``. Kept up to ``MASK_BYTES`` (10k
        states of SmolLM2's, 2k of Gemma 3's; a request reaches a state per token at most),
        the oldest dropped first, so that no client's schema can hold the memory."""
        packed = self._masks.get(state)
        if packed is None:
            packed = np.packbits(self._walk(state))
            with self._lock:
                self._masks[state] = packed
                while len(self._masks) * packed.nbytes > MASK_BYTES:
                    del self._masks[next(iter(self._masks))]
        return np.unpackbits(packed, count=len(self.tokens)).view(bool)

    def _walk(self, state: int) -> np.ndarray:
        trie = self.tokens.trie
        reached = np.append(trie.reached(self._next, state), False)  # index -1: no node
        allowed = reached[trie.token_node]  # (V,)
        allowed[self.stop_ids] = bool(self.dfa.accepting[state])
        return allowed

    def build(self) -> float:
        """Every state's mask now (the whole index, as engines that build it up front do);
        -> the seconds it took."""
        import time

        start = time.perf_counter()
        for state in range(self.dfa.states):
            self.mask(state)
        return time.perf_counter() - start

    def constraint(self) -> Constraint:
        """A new request's place: the start of the language."""
        return Constraint(self)


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
    """One request's state in an ``Index``'s language."""

    def __init__(self, index: Index):
        self.index, self.state, self.ended = index, index.dfa.start, False

    def allowed(self) -> np.ndarray:
        return self.index.mask(self.state)

    @property
    def accepting(self) -> bool:
        return bool(self.index.dfa.accepting[self.state])

    def advance(self, token: int) -> None:
        """Take ``token``: an end-of-turn id ends the text (in an accepting state), any other
        moves on by its bytes. ``ValueError`` for a token the mask did not allow."""
        index = self.index
        if token in index.stop_ids and self.accepting:
            self.ended = True
            return
        data = index.tokens.bytes[token] if 0 <= token < len(index.tokens) else None
        state = DEAD if not data or self.ended else index.dfa.walk(self.state, data)
        if state == DEAD:
            raise ValueError(f"token {token} is not allowed here")
        self.state = state
