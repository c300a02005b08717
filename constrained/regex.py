"""Regular expressions over characters: parsed into a small tree, printed back, checked.

The subset is what JSON Schema's ``pattern`` and hand-written formats use, with the
language (the set of strings matched) as the only meaning: literals, ``.``, classes
``[a-z]`` ``[^"]``, the escapes ``\\d \\w \\s`` (and ``\\D \\W \\S``, ASCII, as
``re.ASCII`` has them), ``\\t \\n \\r \\f \\v \\0 \\xHH \\uHHHH \\u{H...}``, groups
``(...)`` ``(?:...)`` ``(?<name>...)``, alternation, and the quantifiers ``* + ?
{m} {m,} {m,n}`` (a lazy ``?`` after one changes which match a search reports, never
which strings match, so it is read and dropped). ``.`` is any character but the line
terminators ``\\n \\r \\u2028 \\u2029`` (ECMAScript's, which JSON Schema names).

What would change the meaning or leave the regular languages is refused by name, with
its position: backreferences, lookaround, anchors other than a leading ``^`` and a
trailing ``$``, flags, word boundaries; and a bounded repetition over ``MAX_REPEAT``
(as RE2 refuses one over 1000), whose automaton would hold that many copies.

A tree is ``Chars`` (a set of code points, as sorted disjoint ranges), ``Concat``,
``Alt`` and ``Repeat``, and ``Graph``, an automaton whose edges are trees: what a
schema needs and an expression cannot write small (a remainder of a division, the set
of items already used, the members of an object counted), printed back by eliminating
its states. ``concat``, ``alt`` and ``repeat`` build trees and fold ``NOTHING`` (the
empty set of strings) away. Code points are 0 to 0x10FFFF without the surrogates
D800-DFFF, which UTF-8 cannot carry.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_REPEAT = 1000  # the largest m or n of {m,n}; larger ones are refused (RE2's limit too)
PRINTED_STATES = 64  # the largest Graph to_pattern writes out
MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)


class RegexError(ValueError):
    """A pattern outside the subset, or malformed; the message says what and where."""


# ----------------------------------------------------------------------------- the tree

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges


def normalize(ranges) -> Ranges:
    """Sorted, merged, without surrogates."""
    cut = []
    for lo, hi in ranges:
        if lo <= SURROGATES[1] and hi >= SURROGATES[0]:  # take the surrogates out
            if lo < SURROGATES[0]:
                cut.append((lo, SURROGATES[0] - 1))
            if hi > SURROGATES[1]:
                cut.append((SURROGATES[1] + 1, hi))
        elif lo <= hi:
            cut.append((lo, hi))
    merged: list[list[int]] = []
    for lo, hi in sorted(cut):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def complement(ranges: Ranges) -> Ranges:
    """Every code point not in ``ranges``."""
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return normalize(out)


@dataclass(frozen=True)
class Chars:
    """One character out of a set."""

    ranges: Ranges

    def __contains__(self, code_point: int) -> bool:
        return any(lo <= code_point <= hi for lo, hi in self.ranges)


@dataclass(frozen=True)
class Concat:
    parts: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Repeat:
    node: object
    low: int
    high: int | None  # None: no upper bound


@dataclass(frozen=True)
class Graph:
    """An automaton whose edges read trees: ``edges``, ``(from, to, tree)`` over the states
    ``0 .. states - 1``; a match starts at 0 and may end in any state of ``accepting``."""

    states: int
    edges: tuple
    accepting: frozenset


EMPTY = Concat(())  # the empty string
NOTHING = Chars(())  # no string at all
ANY = Chars(normalize([(0, MAX_CODE_POINT)]))
DIGIT = normalize([(0x30, 0x39)])
WORD = normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
SPACE = normalize([(0x09, 0x0D), (0x20, 0x20)])  # \t \n \v \f \r and space
LINE_TERMINATORS = normalize([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
DOT = complement(LINE_TERMINATORS)


def literal(text: str):
    """The tree matching exactly ``text``."""
    return concat(*(Chars(((ord(c), ord(c)),)) for c in text))


def concat(*parts):
    """``parts`` one after the other (nested sequences flattened; ``NOTHING`` if any is)."""
    flat = []
    for part in parts:
        if part == NOTHING:
            return NOTHING
        flat.extend(part.parts if isinstance(part, Concat) else [part])
    return flat[0] if len(flat) == 1 else Concat(tuple(flat))


def alt(options):
    """Any one of ``options`` (repeats and ``NOTHING`` dropped; ``NOTHING`` if none is left)."""
    kept = list(dict.fromkeys(o for o in options if o != NOTHING))
    if not kept:
        return NOTHING
    return kept[0] if len(kept) == 1 else Alt(tuple(kept))


def repeat(node, low: int, high: int | None):
    """``node`` from ``low`` to ``high`` times (None: unbounded)."""
    if node == NOTHING or node == EMPTY:
        return node if low else EMPTY
    if (low, high) == (1, 1):
        return node
    return EMPTY if high == 0 else Repeat(node, low, high)


# ----------------------------------------------------------------------------- parsing

_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_CHAR_ESCAPES = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}
_META = set("\\^$.|?*+()[]{}/-\"'")


class _Parser:
    def __init__(self, pattern: str):
        self.text, self.at = pattern, 0

    def fail(self, what: str) -> RegexError:
        return RegexError(f"{what} at position {self.at} of the pattern {self.text!r}")

    def peek(self, n: int = 1) -> str:
        return self.text[self.at : self.at + n]

    def take(self) -> str:
        if self.at >= len(self.text):
            raise self.fail("the pattern ends early")
        c = self.text[self.at]
        self.at += 1
        return c

    def alternation(self):
        options = [self.concat()]
        while self.peek() == "|":
            self.at += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def concat(self):
        parts = []
        while self.at < len(self.text) and self.peek() not in "|)":
            parts.append(self.repeat())
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def repeat(self):
        node, quantified = self.atom(), False
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.at += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and self._counted():
                low, high = self.counted()
            else:
                return node
            if self.peek() == "?":  # lazy: the same strings match
                self.at += 1
            if quantified:
                raise self.fail("a quantifier on a quantifier (write a group around it)")
            node, quantified = Repeat(node, low, high), True

    def _counted(self) -> bool:
        """Whether a ``{`` here opens ``{m}``, ``{m,}`` or ``{m,n}`` (else it is a literal)."""
        end = self.text.find("}", self.at)
        inner = self.text[self.at + 1 : end] if end > 0 else ""
        m, _, n = inner.partition(",")
        return bool(m.isdigit() and (not n or n.isdigit()))

    def counted(self) -> tuple[int, int | None]:
        end = self.text.index("}", self.at)
        inner = self.text[self.at + 1 : end]
        m, comma, n = inner.partition(",")
        low = int(m)
        high = low if not comma else (int(n) if n else None)
        if high is not None and high < low:
            raise self.fail(f"the repetition {{{inner}}} has its bounds out of order")
        for bound in (low, high):
            if bound is not None and bound > MAX_REPEAT:
                raise self.fail(f"the repetition {{{inner}}} is over the limit of {MAX_REPEAT}")
        self.at = end + 1
        return low, high

    def atom(self):
        c = self.take()
        if c == "(":
            return self.group()
        if c == "[":
            return Chars(self.char_class())
        if c == ".":
            return Chars(DOT)
        if c == "\\":
            return Chars(self.escape(in_class=False))
        if c in "^$":
            self.at -= 1
            raise self.fail(f"the anchor {c} (only a leading ^ and a trailing $ are supported)")
        if c in "*+?":
            self.at -= 1
            raise self.fail(f"nothing to repeat before {c}")
        if c == ")":
            self.at -= 1
            raise self.fail("an unmatched )")
        return Chars(((ord(c), ord(c)),))

    def group(self):
        if self.peek() == "?":
            head = self.peek(3)
            if head.startswith("?:"):
                self.at += 2
            elif head.startswith("?P<") or (head.startswith("?<") and head[2:3] not in "=!"):
                close = self.text.find(">", self.at)
                if close < 0:
                    raise self.fail("a group name that is never closed")
                self.at = close + 1
            else:
                kind = (
                    "lookaround"
                    if head[:2] in ("?=", "?!") or head[:3] in ("?<=", "?<!")
                    else "a flag group"
                )
                raise self.fail(f"{kind} (?{head[1:]}... is not supported")
        node = self.alternation()
        if self.peek() != ")":
            raise self.fail("a group that is never closed")
        self.at += 1
        return node

    def char_class(self) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.take()
            if c == "]" and not first:
                break
            first = False
            lo = self._class_item(c)
            if isinstance(lo, tuple):  # \d, \w, \s and their negations: a set, not a bound
                ranges.extend(lo)
                continue
            if self.peek() == "-" and self.peek(2)[1:] not in ("]", ""):
                self.at += 1
                hi = self._class_item(self.take())
                if isinstance(hi, tuple):
                    raise self.fail("a range that ends in a class escape")
                if hi < lo:
                    raise self.fail("a range out of order")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        found = normalize(ranges)
        return complement(found) if negated else found

    def _class_item(self, c: str):
        if c != "\\":
            return ord(c)
        ranges = self.escape(in_class=True)
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return ranges[0][0]
        return ranges

    def escape(self, *, in_class: bool) -> Ranges:
        c = self.take()
        if c.lower() in _CLASS_ESCAPES:
            ranges = _CLASS_ESCAPES[c.lower()]
            return complement(ranges) if c.isupper() else ranges
        if c in _CHAR_ESCAPES:
            return ((_CHAR_ESCAPES[c],) * 2,)
        if c == "b" and in_class:
            return ((0x08, 0x08),)
        if c == "x":
            return self._code_point(2)
        if c == "u":
            if self.peek() == "{":
                end = self.text.find("}", self.at)
                digits = self.text[self.at + 1 : end] if end > 0 else ""
                self.at = end + 1 if end > 0 else self.at
                return self._hex(digits)
            return self._code_point(4)
        if c in _META:
            return ((ord(c), ord(c)),)
        self.at -= 2
        what = {"b": "the word boundary \\b", "B": "\\B"}.get(c, "the escape \\" + c)
        if c.isdigit():
            what = "the backreference \\" + c
        raise self.fail(f"{what} is not supported")

    def _code_point(self, n: int) -> Ranges:
        digits = self.text[self.at : self.at + n]
        self.at += n
        return self._hex(digits)

    def _hex(self, digits: str) -> Ranges:
        try:
            value = int(digits, 16)
        except ValueError:
            value = -1
        if not digits or value < 0 or value > MAX_CODE_POINT:
            raise self.fail(f"a bad code point {digits!r}")
        if SURROGATES[0] <= value <= SURROGATES[1]:
            raise self.fail(f"the surrogate U+{value:04X} (not a character UTF-8 carries)")
        return ((value, value),)


def parse(pattern: str):
    """``pattern`` -> its tree, matched whole (a leading ``^`` and a trailing ``$`` are read
    and change nothing); ``parse_search`` reads a pattern as a search does."""
    tree, _, _ = _parse(pattern)
    return tree


def parse_search(pattern: str):
    """``pattern`` as a search reads it (JSON Schema's ``pattern``): ``(tree, anchored at the
    start, anchored at the end)``. An anchor beside a top-level ``|`` binds one alternative
    only (``^a|b`` is "starts with a, or holds b"): refused, with the grouping to write."""
    tree, start, end = _parse(pattern)
    if (start or end) and _top_level_bar(pattern[int(start) : len(pattern) - int(end)]):
        raise RegexError(
            f"an anchor beside a top-level | in {pattern!r} binds one alternative only: "
            "write ^(?:...|...)$"
        )
    return tree, start, end


def _top_level_bar(body: str) -> bool:
    """Whether ``body`` has a ``|`` outside every group and class."""
    depth, in_class, i = 0, False, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if body[i + 1 : i + 2] == "]":  # a leading ] is a member
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def _parse(pattern: str):
    if not isinstance(pattern, str):
        raise RegexError(f"a pattern must be a string, got {pattern!r}")
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$") and len(pattern) > int(start)
    body = pattern[int(start) : len(pattern) - int(end)]
    parser = _Parser(body)
    tree = parser.alternation()
    if parser.at != len(body):
        raise parser.fail("an unmatched )")
    return tree, start, end


# ----------------------------------------------------------------------------- printing


def _char(code_point: int) -> str:
    c = chr(code_point)
    if c in _META or not c.isprintable() or c.isspace():
        return f"\\u{{{code_point:X}}}"
    return c


def to_pattern(node) -> str:
    """The tree as a pattern that ``parse`` reads back into the same language."""
    if isinstance(node, Chars):
        if len(node.ranges) == 1 and node.ranges[0][0] == node.ranges[0][1]:
            return _char(node.ranges[0][0])
        if not node.ranges:
            return "[^\\u{0}-\\u{10FFFF}]"  # the empty set: nothing matches
        inner = "".join(
            _char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in node.ranges
        )
        return f"[{inner}]"
    if isinstance(node, Concat):
        return "".join(_grouped(p, (Alt, Graph)) for p in node.parts)
    if isinstance(node, Alt):
        return "|".join(to_pattern(o) for o in node.options)
    if isinstance(node, Repeat):
        inner = _grouped(node.node, (Alt, Concat, Repeat, Graph))
        if (node.low, node.high) == (0, None):
            return inner + "*"
        if (node.low, node.high) == (1, None):
            return inner + "+"
        if (node.low, node.high) == (0, 1):
            return inner + "?"
        high = "" if node.high is None else node.high
        bounds = str(node.low) if node.high == node.low else f"{node.low},{high}"
        return inner + "{" + bounds + "}"
    if isinstance(node, Graph):
        return to_pattern(eliminate(node))
    raise TypeError(f"not a regex tree: {node!r}")


def eliminate(graph: Graph):
    """The tree of ``graph``'s language, by state elimination (Brzozowski and McCluskey): a
    new start and end around it, then each state taken out in turn, every path through it
    written as ``in loop* out`` on an edge that bypasses it. Exact, and as large as the
    automaton's paths make it (exponential in its states at worst): for reading, not for
    compiling, and refused past ``PRINTED_STATES`` states."""
    if graph.states > PRINTED_STATES:
        raise RegexError(
            f"an automaton of {graph.states} states in this language has no pattern short "
            f"enough to print (over {PRINTED_STATES} states): the automaton is the language"
        )
    start, end = graph.states, graph.states + 1
    edge: dict[tuple[int, int], object] = {(start, 0): EMPTY}
    for a in graph.accepting:
        edge[(a, end)] = EMPTY
    for a, b, tree in graph.edges:
        edge[(a, b)] = alt([edge.get((a, b), NOTHING), tree])
    for k in range(graph.states):
        loop = repeat(edge.pop((k, k), NOTHING), 0, None)
        into = [(a, t) for (a, b), t in edge.items() if b == k]
        out = [(b, t) for (a, b), t in edge.items() if a == k]
        for a, _ in into:
            del edge[(a, k)]
        for b, _ in out:
            del edge[(k, b)]
        for a, t_in in into:
            for b, t_out in out:
                edge[(a, b)] = alt([edge.get((a, b), NOTHING), concat(t_in, loop, t_out)])
    return edge.get((start, end), NOTHING)


def _grouped(node, kinds) -> str:
    """``node`` printed, in a group where ``kinds`` of node would bind wrongly there."""
    if isinstance(node, Concat) and len(node.parts) == 1:
        return _grouped(node.parts[0], kinds)
    text = to_pattern(node)
    return f"(?:{text})" if isinstance(node, kinds) else text
