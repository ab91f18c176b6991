"""A password never leaves the package: the one function every text that may hold a
ledger's URL, a libpq connection string or a libpq message passes before it is shown.

What is hidden, wherever it appears in a text:

- the password of a URL's user info (``postgresql://user:SECRET@host``: everything
  between the user's ``:`` and the last ``@`` before the path, which is where libpq looks
  for it);
- the value of every secret libpq parameter, in a URL's query (``?password=SECRET``, the
  name percent-encoded or not) and in the keyword/value form (``password=SECRET``,
  ``password = 'with spaces'``). The secret parameters are the ones libpq itself hides
  from display (its ``dispchar`` ``*``: ``password``, ``sslpassword``,
  ``oauth_client_secret``), read from the libpq psycopg loads, and the SCRAM keys
  libpq 18 takes as debug options;
- a known secret's own text (``redact(text, secrets=...)``), raw or percent-encoded:
  what libpq echoes from a connection string it could not parse is a fragment of it.

``CassetteError`` passes its message through ``redact`` (errors.py), so every refusal,
on the CLI's stderr, in the MCP server's answers and in the Python API, is redacted at
the one place every error is made; a target shown as a result (``init``'s and
``migrate``'s ``db``, ``copy``'s ``source`` and ``dest``, ``restore``'s ``restored``) goes
through ``shown``, which is ``redact``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

MASK = "***"
# libpq's secret parameters (an older libpq lacks some): the ones libpq 18 hides from
# display, and the SCRAM keys it takes for pass-through. Not read from libpq at run time:
# a SQLite user's first error would import psycopg.
SECRET_KEYWORDS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
# A URL's user info: scheme://user:PASSWORD@ (libpq ends the user info at the last '@'
# before the first '/'; a password holds no raw '/').
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^/]*@")
# A URL query's parameter: ?name=value or &name=value (the name may be percent-encoded).
_QUERY_PARAMETER = re.compile(r"([?&])([^=&#\s]+)=([^&#\s]*)")


@cache
def _keyword_value() -> re.Pattern[str]:
    # name = value in libpq's keyword/value form: a quoted value ends at its closing
    # quote (backslash escapes), a bare one at white space, and the words after it that
    # are no "name=" of their own go with it (a password with a space, unquoted: libpq
    # refuses the string, but the words were meant as the password).
    names = "|".join(sorted((re.escape(k) for k in SECRET_KEYWORDS), key=len, reverse=True))
    bare = r"[^\s&#]*(?:\s+[^\s=&#']+(?=\s|$))*"
    return re.compile(rf"(?<![\w%])((?:{names})\s*=\s*)('(?:[^'\\]|\\.)*'?|{bare})")


def _query_parameter(match: re.Match[str]) -> str:
    from urllib.parse import unquote  # (here: a SQLite command's refusal needs no urllib)

    if unquote(match.group(2)) in SECRET_KEYWORDS:
        return f"{match.group(1)}{match.group(2)}={MASK}"
    return match.group(0)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every password and other secret parameter hidden (``***``), and
    each of ``secrets`` (values known to be secret) wherever it appears."""
    for secret in secrets:
        if secret:
            from urllib.parse import quote

            for form in {secret, quote(secret, safe=""), quote(secret)}:
                text = text.replace(form, MASK)
    text = _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)
    text = _QUERY_PARAMETER.sub(_query_parameter, text)
    return _keyword_value().sub(rf"\g<1>{MASK}", text)


def shown(target: str) -> str:
    """A ledger's path or URL as results show it: without its secrets."""
    return redact(target)
