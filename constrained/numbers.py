"""Numbers as text: integer ranges as exact digit ranges, decimals, and multiples.

A range of integers is a regular language of digit strings: ``0..150`` is
``[0-9]|[1-9][0-9]|1(?:[0-4][0-9]|50)``, one option per number of digits, split where
the leading digits change (``_same_length``). A number without an upper bound is
written with at most ``INTEGER_DIGITS`` digits (or its lower bound's, if more): float64
holds every integer of 15 digits exactly, and an unbounded run of digits is a loop a
model can stay in until its tokens run out. The multiples of ``m`` are an automaton of
``m`` states, the remainder so far (``10 r + d mod m`` after a digit ``d``), met with
the range by ``algebra.intersection``.
"""

from __future__ import annotations

from .algebra import CharDFA, intersection, to_tree
from .regex import NOTHING, Chars, Graph

INTEGER_DIGITS = 15  # the digits of a number whose size no bound limits, at most
FRACTION = r"\.[0-9]{1,16}"  # past float64's 17 significant digits a digit changes nothing
EXPONENT = r"[eE][+-]?[0-9]{1,3}"  # and past its exponents of 308
NUMBER = rf"-?(?:0|[1-9][0-9]{{0,{INTEGER_DIGITS - 1}}})(?:{FRACTION})?(?:{EXPONENT})?"


def integers(lo: int | None, hi: int | None) -> str:
    """The integers from ``lo`` to ``hi`` (None: unbounded) as decimal text, a pattern."""
    options = []
    if hi is None or hi >= 0:
        options.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # magnitudes from max(-hi, 1) to -lo
        options.append(
            "-" + _naturals(1 if hi is None or hi >= 0 else -hi, None if lo is None else -lo)
        )
    return _alt(options)


def decimals(lo: int | None, hi: int | None) -> str:
    """The decimals from ``lo`` to ``hi`` (whole numbers; None: unbounded), without an
    exponent, a pattern."""
    options = []
    if hi is None or hi >= 0:  # the values >= 0: magnitudes from max(lo, 0) to hi
        options.append(_magnitudes(max(lo or 0, 0), hi))
    if lo is None or lo < 0:  # the negative values: magnitudes from max(-hi, 0) to -lo
        options.append(
            "-" + _magnitudes(0 if hi is None else max(-hi, 0), None if lo is None else -lo)
        )
    return _alt(options)


def multiples(numerals, m: int):
    """The strings of ``numerals`` (integers as text, a tree) that are multiples of ``m``."""
    digits = {d: Chars(((0x30 + d, 0x30 + d),)) for d in range(10)}

    def step(state: int, d: int) -> int:  # state 2 + r: the remainder r of the digits so far
        r = state - 2 if state >= 2 else 0
        return 2 + (10 * r + d) % m

    edges = [(0, 1, Chars(((0x2D, 0x2D),)))]  # 0 the start, 1 after a minus sign
    edges += [(state, step(state, d), digits[d]) for state in range(m + 2) for d in range(10)]
    divisible = Graph(m + 2, tuple(edges), frozenset({2}))
    both = intersection(CharDFA.of(numerals), CharDFA.of(divisible))
    return NOTHING if both is None else to_tree(both)


def _alt(options) -> str:
    options = list(dict.fromkeys(options))
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


def _magnitudes(lo: int, hi: int | None) -> str:
    """The decimals from ``lo`` to ``hi`` (naturals; None: unbounded), without an exponent:
    an integer part in ``[lo, hi)`` with any fraction, or ``hi`` itself with a zero one."""
    fraction = f"(?:{FRACTION})?"
    if hi is None:
        return f"{_naturals(lo, None)}{fraction}"
    top = rf"{hi}(?:\.0{{1,16}})?"
    return top if lo == hi else _alt([_naturals(lo, hi - 1) + fraction, top])


def _naturals(lo: int, hi: int | None) -> str:
    """The whole numbers from ``lo`` to ``hi`` (None: up to ``INTEGER_DIGITS`` digits, or
    ``lo``'s), no leading zeros."""
    if hi is None:
        hi = 10 ** max(INTEGER_DIGITS, len(str(lo))) - 1
    options = []
    for n in range(len(str(lo)), len(str(hi)) + 1):  # one number of digits at a time
        first = 0 if n == 1 else 10 ** (n - 1)
        a, b = max(lo, first), min(hi, 10**n - 1)
        if a <= b:
            options.append(_same_length(str(a), str(b)))
    return _alt(options)


def _same_length(a: str, b: str) -> str:
    """The numbers from ``a`` to ``b``, both of the same number of digits."""
    if not a:
        return ""
    if a == b:
        return a
    if a[0] == b[0]:
        return a[0] + _same_length(a[1:], b[1:])
    rest = len(a) - 1
    options = []
    low_rest, high_rest = a[1:], b[1:]
    if set(low_rest) <= {"0"} and set(high_rest) <= {"9"}:  # the whole span at once
        return f"[{a[0]}-{b[0]}]" + _digits(rest)
    options.append(a[0] + _same_length(low_rest, "9" * rest))
    if int(b[0]) - int(a[0]) > 1:
        options.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + _digits(rest))
    options.append(b[0] + _same_length("0" * rest, high_rest))
    return _alt(options)


def _digits(n: int) -> str:
    return "[0-9]" * n if n < 3 else f"[0-9]{{{n}}}"
