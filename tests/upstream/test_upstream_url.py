"""No request target can change where the guard's upstream request goes: whatever a client sends, the URL the guard
builds has the configured upstream's scheme, host, port and credentials, or the target is refused first. The target
is parsed as uvicorn parses it (httptools, then percent-decoding), checked (api/target.py), looked up in the route
table (api/routes.py), and the URL built by the HTTP client (upstream/http.py)."""

from __future__ import annotations

import urllib.parse

import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.api.routes import RouteTable
from proxy.api.target import BadTarget, check_target
from proxy.settings import UpstreamSettings
from proxy.upstream.http import HttpClient

BASES = ["http://127.0.0.1:8000", "http://user:secret@vllm.internal:8000/prefix", "https://[::1]:9443"]
TABLE = RouteTable(passthrough=["/v1/my-route"])
PIECES = ["/", "*", "@", ":", "?", "#", "%", "%2F", "%2e", "..", ".", "\\", "%5c", "%00", "//", "http:", "https://",
          "evil.com", "127.0.0.1:9", "user:pw@", "v1", "chat", "completions", "responses", "resp_1", "models", "x=1",
          "&", "=", " ", "\t", "é", "%40", "%3A"]  # fmt: skip


def forwarded(base: str, target: bytes) -> str | None:
    """The upstream URL the guard would build for `target`, or None when the guard refuses it before that."""
    try:
        parsed = httptools.parse_url(target)
    except httptools.HttpParserInvalidURLError:
        return None  # uvicorn's parser answers 400 itself
    raw_path = parsed.path or b""
    path = urllib.parse.unquote(raw_path.decode("latin-1"))
    query = parsed.query or b""
    try:
        check_target(raw_path, path, query, target, b"guard:8080")
    except BadTarget:
        return None
    found = TABLE.find(path)
    if found is None:
        return None
    return str(HttpClient(UpstreamSettings())._url(base, found.path, query.decode("latin-1")))


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(BASES), st.lists(st.sampled_from(PIECES), max_size=12), st.binary(max_size=8))
def test_no_target_changes_the_upstream_host_port_or_credentials(base: str, pieces: list[str], junk: bytes) -> None:
    target = "".join(pieces).encode() + junk
    url = forwarded(base, target)
    if url is None:
        return
    want, got = urllib.parse.urlsplit(base), urllib.parse.urlsplit(url)
    assert (got.scheme, got.hostname, got.port, got.username, got.password) == (
        want.scheme, want.hostname, want.port, want.username, want.password
    ), (target, url)  # fmt: skip
    assert got.path.startswith(want.path.rstrip("/") + "/") and not got.fragment


def test_the_attacks_that_used_to_work_are_refused() -> None:
    for target in (b"*@127.0.0.1:9/x", b"http://127.0.0.1:9/v1/models", b"http://u:p@guard:8080/v1/models",
                   b"/v1/../v1/models", b"/v1/models%2f..%2f..%2fadmin"):  # fmt: skip
        assert forwarded(BASES[0], target) is None, target


def test_a_plain_target_keeps_its_query_as_sent() -> None:
    assert forwarded(BASES[0], b"/v1/models?y=%20z&g") == "http://127.0.0.1:8000/v1/models?y=%20z&g"
    assert forwarded(BASES[1], b"/v1/models/") == "http://user:secret@vllm.internal:8000/prefix/v1/models"
