"""The string ``format``s a regular language holds, each as the characters of its values.

Every one is a subset of what its format allows, so that whatever the mask lets through
a validator that checks formats accepts; where a format's standard allows more, what is
left out is said here.

* ``date``: RFC 3339's ``full-date``, ``YYYY-MM-DD``, the day within its month and
  29 February in leap years only (a leap year's last two digits are a multiple of 4 other
  than 00, or it is a multiple of 400: all regular on four digits); the year from 0001,
  as Python's ``date`` (what ``jsonschema`` checks with) starts there.
* ``time``: RFC 3339's ``full-time``, ``HH:MM:SS``, a fraction of at most 9 digits, then
  ``Z`` or an offset ``+HH:MM``; no leap second (``:60``), upper-case ``Z`` only.
* ``date-time``: a ``date``, ``T``, a ``time``.
* ``email``: a dot-atom (RFC 5322's ``atext`` in runs joined by single dots) ``@`` a
  domain of at least two labels of letters, digits and inner hyphens (at most 63
  each), ASCII only; no quoted local part, no address literal.
* ``uuid``: RFC 9562's ``8-4-4-4-12`` hexadecimal digits, either case.
* ``ipv4``: four decimal numbers 0 to 255 without leading zeros, joined by dots.
* ``uri``: ``scheme "://" host [":" port] path ["?" query] ["#" fragment]`` with RFC
  3986's characters for each (percent-escapes included) and a host that is a non-empty
  registered name; no user info, no IP literal, no URI without an authority
  (``mailto:a@b``).
"""

from __future__ import annotations

from .regex import parse

_TWO = r"(?:0[48]|[2468][048]|[13579][26])"  # the two-digit multiples of 4 but 00
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = rf"(?:[0-9]{{2}}{_TWO}|{_TWO}00)"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP}-02-29)"
_HOUR = r"(?:[01][0-9]|2[0-3])"
TIME = rf"{_HOUR}:[0-5][0-9]:[0-5][0-9](?:\.[0-9]{{1,9}})?(?:Z|[+-]{_HOUR}:[0-5][0-9])"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
EMAIL = rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{_LABEL}(?:\.{_LABEL})+"
_HEX = "[0-9A-Fa-f]"
UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_UNRESERVED_SUB = r"A-Za-z0-9\-._~!$&'()*+,;="
_PCHAR = rf"(?:[{_UNRESERVED_SUB}:@]|%{_HEX}{{2}})"
URI = (
    rf"[A-Za-z][A-Za-z0-9+\-.]*://(?:[{_UNRESERVED_SUB}]|%{_HEX}{{2}})+(?::[0-9]+)?"
    rf"(?:/{_PCHAR}*)*(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)

FORMATS = {
    "date": DATE,
    "time": TIME,
    "date-time": rf"{DATE}T{TIME}",
    "email": EMAIL,
    "uuid": UUID,
    "ipv4": IPV4,
    "uri": URI,
}


def format_tree(name: str):
    """The characters of the strings of format ``name`` (a key of ``FORMATS``)."""
    return parse(FORMATS[name])
