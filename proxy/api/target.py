"""The request target a client may send: origin-form (`/path?query`) only, checked before anything else is done with
a request. Nothing it holds can reach the upstream's URL but a declared route's path and a plain query (routes.py,
upstream/http.py), yet a target that means something else to some parser is refused outright rather than guessed at:

    *                           asterisk-form (`OPTIONS *`)
    http://other-host/...       absolute-form naming a host other than the request's Host
    http://user:pw@host/...     userinfo
    NUL, control characters     raw or percent-encoded, in the path or the query
    backslashes                 raw or percent-encoded (some servers read them as `/`)
    /./  /../                   dot segments, raw or percent-encoded
"""

from __future__ import annotations

from proxy.errors import InvalidRequest

# What a query may hold as sent: printable ASCII, no space (RFC 3986 query characters and percent-escapes).
_QUERY_OK = bytes(range(0x21, 0x7F))


class BadTarget(InvalidRequest):
    def __init__(self, why: str) -> None:
        super().__init__(f"The request target is not accepted: {why}. Send an origin-form target (/path?query).",
                         code="invalid_request_target")  # fmt: skip


def check_target(
    raw_path: bytes, path: str, query: bytes, sent: bytes | None = None, host: bytes | None = None
) -> None:
    """BadTarget unless the request's target is a plain origin-form path and query. `raw_path` and `query` are the
    target as received, `path` its percent-decoded path; `sent`, the request line's target exactly as sent, is known
    only to the guard's own protocol (server/protocol.py), which sees the forms uvicorn parses away."""
    if sent is not None and sent[:1] != b"/":
        _other_form(sent, host)
    if raw_path[:1] != b"/":
        raise BadTarget("it is not a path starting with /")
    if not path.isprintable():
        raise BadTarget("it holds a NUL or another control character")
    if "\\" in path:
        raise BadTarget("it holds a backslash")
    if "/." in path and any(segment in (".", "..") for segment in path.split("/")):
        raise BadTarget("it holds a dot segment (/./ or /../)")
    if query and query.translate(None, _QUERY_OK):
        raise BadTarget("its query holds a character that must be percent-encoded")
    if b"%" in query and _decoded_control(query):
        raise BadTarget("its query holds a NUL or another control character")


def _other_form(sent: bytes, host: bytes | None) -> None:
    if sent[:1] == b"*":
        raise BadTarget("asterisk-form (*) names no resource")
    scheme, sep, rest = sent.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        raise BadTarget("it is neither a path nor an http URL")
    authority = rest.split(b"/", 1)[0].split(b"?", 1)[0]
    if b"@" in authority:
        raise BadTarget("it holds userinfo (user:password@)")
    if host is None or authority.lower() != host.strip().lower():
        raise BadTarget("absolute-form naming another host than the request's Host header")


def _decoded_control(query: bytes) -> bool:
    """True when a percent-escape in the query decodes to a control character (%00-%1F, %7F)."""
    parts = query.split(b"%")[1:]
    return any(len(p) >= 2 and (p[:1] in b"01" or p[:2].lower() == b"7f") and _hex(p[:2]) for p in parts)


def _hex(pair: bytes) -> bool:
    try:
        int(pair, 16)
    except ValueError:
        return False
    return True
