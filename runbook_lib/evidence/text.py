"""The free text a person gives (an approver's name, a reason) as it may be recorded and printed:
checked on the way in (:func:`checked_text`), escaped on the way out (:func:`printable`)."""

from __future__ import annotations

import unicodedata

from runbook_lib.errors import UsageError

MAX_BY = 200
"""Most characters a ``--by`` name may have."""
MAX_REASON = 2000
"""Most characters a ``--reason`` may have."""


def checked_text(value: str, *, what: str, max_len: int) -> str:
    """``value`` as a name or reason may be recorded and printed: no control or format character
    (a newline forges a line in ``runbook list``, an ANSI escape rewrites the terminal, a bidi
    override reorders what is shown) and at most ``max_len`` characters.

    Raises:
        UsageError: the first offending character (escaped) and its position, or the length
            and the limit; nothing is written.
    """
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in ("Cc", "Cf"):
            raise UsageError(f"{what} holds a control character {ch!r} at position {i}: it would be printed raw to "
                             "terminals (runbook list, resolve); give plain text")
    if len(value) > max_len:
        raise UsageError(f"{what} is {len(value)} characters, more than {max_len}; shorten it")
    return value


def printable(text: str) -> str:
    """``text`` with every control or format character escaped (``\\x1b``), for a terminal:
    what an older run recorded is shown, never obeyed."""
    return "".join(ch.encode("unicode_escape").decode() if unicodedata.category(ch) in ("Cc", "Cf") else ch
                   for ch in text)
