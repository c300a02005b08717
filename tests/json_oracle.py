"""``jsonschema`` as the oracle of constrained output, with every format the subset writes
checked.

``jsonschema`` checks ``time``, ``date-time`` and ``uri`` only with packages of its own
extras (rfc3339-validator, rfc3986-validator); where they are missing, the checks here
stand in, written from RFC 3339 and RFC 3986 with the standard library (never from
constrained/formats.py). ``validate`` and ``is_valid`` read a schema as Draft 2020-12.
``jsonschema`` is imported when first needed: a test module skips without it first.
"""

from __future__ import annotations

import datetime
import functools
import re
import string

_TIME_SHAPE = re.compile(r"\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)")  # RFC 3339 full-time
_URI_CHARS = set(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")


def full_time(text: str) -> bool:
    """RFC 3339's ``full-time``: the shape, then the clock and the offset in range."""
    if not _TIME_SHAPE.fullmatch(text):
        return False
    offset = text[8:].lstrip(".0123456789")
    datetime.time.fromisoformat(text[:8])  # ValueError for 24:00:00 or 12:60:00
    if offset in ("Z", "z"):
        return True
    hours, minutes = offset[1:].split(":")
    return int(hours) < 24 and int(minutes) < 60


def full_date(text: str) -> bool:
    """RFC 3339's ``full-date``, a day of the calendar (ValueError for one that is not)."""
    return bool(re.fullmatch(r"\d{4}-\d\d-\d\d", text)) and bool(datetime.date.fromisoformat(text))


def date_time(text: str) -> bool:
    return len(text) > 11 and text[10] in "Tt" and full_date(text[:10]) and full_time(text[11:])


def uri(text: str) -> bool:
    """RFC 3986's ``URI``, loosely: a scheme (letters of either case), its characters, whole
    percent-escapes."""
    scheme, colon, _ = text.partition(":")
    escapes = all(re.fullmatch(r"[0-9A-Fa-f]{2}", p[:2]) for p in text.split("%")[1:])
    named = colon and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme)
    return bool(named) and set(text) <= _URI_CHARS and escapes


@functools.cache
def checker():
    """Draft 2020-12's format checker, with the checks above where it has none."""
    import jsonschema

    checks = jsonschema.FormatChecker(formats=())
    checks.checkers.update(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    for name, check in (("time", full_time), ("date-time", date_time), ("uri", uri)):
        if name not in checks.checkers:  # a format constrains strings only, as jsonschema's own
            checks.checks(name, raises=ValueError)(
                lambda value, check=check: not isinstance(value, str) or check(value)
            )
    return checks


def is_valid(value, schema) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(schema, format_checker=checker()).is_valid(value)


def validate(value, schema) -> None:
    import jsonschema

    jsonschema.Draft202012Validator(schema, format_checker=checker()).validate(value)
