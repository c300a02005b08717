"""A tokenizer's vocabulary as bytes, and as a byte trie.

``token_bytes(tokenizer)`` is what each token id adds to the text, as bytes: a
byte-level BPE token (SmolLM2, Llama 3, Qwen2) is stored in GPT-2's printable spelling
of bytes and may be any bytes at all, half a character included; a SentencePiece token
(Gemma) is text with "▁" for a space, or ``<0xNN>``, one byte of a character the
vocabulary lacks. A special token (``<|im_end|>``, ``<eos>``) adds no text: it is
``None``, never allowed by a mask except as an end-of-turn id in an accepting state.

``Trie`` lays the vocabulary out as a byte trie in breadth-first order, as arrays: a
node's children are contiguous (``first_child``, ``child_count``), each node has the
byte that leads to it, and ``token_node[t]`` is the node where token ``t``'s bytes end
(-1 for a token with no bytes). Tokens that share a prefix share its nodes, so a walk
reads each shared prefix once for all of them (SmolLM2's 49,152 tokens hold 332k bytes
in 100k nodes; Gemma 3's 262,144, 1.97M bytes in 588k nodes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

SPACE = "\u2581"  # SentencePiece's "▁"


def token_bytes(tokenizer) -> list[bytes | None]:
    """Each id's bytes in the text, ``None`` for a special token (``tokenizers.Tokenizer``).
    ``ValueError`` for a decoder this module does not know how to read."""
    spec = json.loads(tokenizer.to_str())
    decoder = spec.get("decoder") or {}
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    kinds = [step.get("type") for step in steps]
    special = {a["id"] for a in spec.get("added_tokens", []) if a.get("special")}
    added = {a["id"]: a["content"] for a in spec.get("added_tokens", []) if not a.get("special")}
    if kinds == ["ByteLevel"]:
        spell = _byte_level
    elif kinds[:3] == ["Replace", "ByteFallback", "Fuse"] and steps[0].get("content") == " ":
        spell = _sentencepiece  # (a trailing Strip drops the text's very first space only)
    else:
        raise ValueError(
            f"constrained decoding does not know the bytes of a tokenizer decoded by {kinds}"
        )
    out: list[bytes | None] = []
    for i in range(tokenizer.get_vocab_size()):
        if i in special:
            out.append(None)
        elif i in added:  # added text tokens are matched and decoded as they are written
            out.append(added[i].encode())
        else:
            piece = tokenizer.id_to_token(i)
            out.append(None if piece is None else spell(piece))
    return out


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's printable spelling of the 256 bytes, reversed: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    moved = (b for b in range(256) if b not in printable)
    spelled = {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(moved)}}
    return {c: b for b, c in spelled.items()}


_GPT2 = _gpt2_bytes()


def _byte_level(piece: str) -> bytes:
    if all(c in _GPT2 for c in piece):
        return bytes(_GPT2[c] for c in piece)
    return piece.encode()  # not in the byte spelling: written as it is


def _sentencepiece(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace(SPACE, " ").encode()


@dataclass(frozen=True)
class Trie:
    """The vocabulary's bytes as a trie in breadth-first order (node 0 the root).

    ``byte (N,)`` the byte into each node; ``first_child (N,)``, ``child_count (N,)`` its
    children, contiguous; ``token_node (V,)`` where each token ends, -1 for none."""

    byte: np.ndarray
    first_child: np.ndarray
    child_count: np.ndarray
    token_node: np.ndarray

    @property
    def nodes(self) -> int:
        return len(self.byte)

    @classmethod
    def build(cls, tokens: list[bytes | None]) -> Trie:
        """From each token's bytes (``None`` or ``b""``: no node)."""
        # Sorted, a token's prefixes come before it and siblings are adjacent: one pass
        # numbers each distinct prefix by its depth-first position, then BFS renumbers.
        unique = sorted({t for t in tokens if t})
        prefix_id: dict[bytes, int] = {b"": 0}
        parent, byte, depth = [0], [0], [0]
        for t in unique:
            for k in range(1, len(t) + 1):
                p = t[:k]
                if p not in prefix_id:
                    prefix_id[p] = len(parent)
                    parent.append(prefix_id[t[: k - 1]])
                    byte.append(t[k - 1])
                    depth.append(k)
        parent_, byte_, depth_ = (np.array(a, dtype=np.int64) for a in (parent, byte, depth))
        # Breadth first: by depth, then by parent's new number, then by byte.
        order = np.zeros(len(parent_), dtype=np.int64)
        new = np.zeros(len(parent_), dtype=np.int64)
        done = 1
        for d in range(1, int(depth_.max(initial=0)) + 1):
            at = np.flatnonzero(depth_ == d)
            at = at[np.lexsort((byte_[at], new[parent_[at]]))]
            new[at] = np.arange(done, done + len(at))
            order[done : done + len(at)] = at
            done += len(at)
        byte_new = byte_[order].astype(np.uint8)
        parent_new = new[parent_[order]]
        count = np.bincount(parent_new[1:], minlength=len(order)).astype(np.int32)
        # In BFS order the parents of nodes 1, 2, ... never decrease: a node's first child
        # is the first node whose parent it is.
        first = (np.searchsorted(parent_new[1:], np.arange(len(order))) + 1).astype(np.int32)
        token_node = np.array([new[prefix_id[t]] if t else -1 for t in tokens], dtype=np.int64)
        return cls(byte_new, first, count, token_node)

    def ends(self, next_state: np.ndarray, state: int) -> np.ndarray:
        """``(N,)`` int32: the state each node's bytes lead to, read from ``state`` of a DFA
        whose ``next_state (S, 256)`` says where each byte goes; -1 where the walk died on
        the way (the node's text is no prefix of the language from there).

        Level by level over the live frontier only: a dead node's subtree is never read."""
        ends = np.full(self.nodes, -1, dtype=np.int32)
        nodes = np.arange(self.first_child[0], self.first_child[0] + self.child_count[0])
        states = next_state[state, self.byte[nodes]]
        while nodes.size:
            live = states >= 0
            nodes, states = nodes[live], states[live]
            ends[nodes] = states
            counts = self.child_count[nodes]
            parents = counts > 0
            nodes, states, counts = nodes[parents], states[parents], counts[parents]
            if not nodes.size:
                break
            # Every child of every frontier node: each parent's run of children, concatenated.
            starts = np.repeat(self.first_child[nodes] - np.cumsum(counts) + counts, counts)
            children = starts + np.arange(int(counts.sum()))
            states = next_state[np.repeat(states, counts), self.byte[children]]
            nodes = children
        return ends
