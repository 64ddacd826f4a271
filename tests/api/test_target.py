"""The request targets the guard takes (origin-form) and the ones it refuses before anything else."""

from __future__ import annotations

import pytest

from proxy.api.target import BadTarget, check_target

ACCEPTED = [
    (b"/v1/chat/completions", "/v1/chat/completions", b"", None, None),
    (b"/v1/models", "/v1/models", b"a=1&b=%20x", b"/v1/models?a=1&b=%20x", None),
    (b"/v1/models", "/v1/models", b"", b"http://guard:8080/v1/models", b"guard:8080"),  # absolute-form, own host
    (b"/v1/models", "/v1/models", b"", b"HTTP://Guard:8080/v1/models", b"guard:8080"),
    (b"/v1/.well-known", "/v1/.well-known", b"", None, None),  # a dot that is no dot segment
]
REFUSED = {
    "asterisk": (b"*", "*", b"", b"*", None),
    "asterisk with an authority": (b"*@127.0.0.1:9/x", "*@127.0.0.1:9/x", b"", b"*@127.0.0.1:9/x", None),
    "absolute-form, another host": (b"/x", "/x", b"", b"http://evil:1/x", b"guard:8080"),
    "absolute-form, no Host": (b"/x", "/x", b"", b"http://guard:8080/x", None),
    "userinfo": (b"/x", "/x", b"", b"http://u:p@guard:8080/x", b"guard:8080"),
    "not http": (b"/x", "/x", b"", b"ftp://guard/x", b"guard"),
    "no leading slash": (b"v1/models", "v1/models", b"", None, None),
    "NUL": (b"/v1/a%00b", "/v1/a\x00b", b"", None, None),
    "CR LF": (b"/v1/a%0d%0ab", "/v1/a\r\nb", b"", None, None),
    "backslash": (b"/v1\\models", "/v1\\models", b"", None, None),
    "encoded backslash": (b"/v1%5cmodels", "/v1\\models", b"", None, None),
    "dot-dot": (b"/x/../v1/models", "/x/../v1/models", b"", None, None),
    "dot": (b"/v1/./models", "/v1/./models", b"", None, None),
    "encoded dot-dot": (b"/%2e%2e/v1/models", "/../v1/models", b"", None, None),
    "trailing dot-dot": (b"/v1/models/..", "/v1/models/..", b"", None, None),
    "space in query": (b"/v1/models", "/v1/models", b"a= b", None, None),
    "non-ASCII query": (b"/v1/models", "/v1/models", "a=é".encode(), None, None),
    "NUL in query": (b"/v1/models", "/v1/models", b"a=%00", None, None),
    "DEL in query": (b"/v1/models", "/v1/models", b"a=%7F", None, None),
}  # fmt: skip


@pytest.mark.parametrize(("raw", "path", "query", "sent", "host"), ACCEPTED)
def test_plain_targets_pass(raw: bytes, path: str, query: bytes, sent: bytes | None, host: bytes | None) -> None:
    check_target(raw, path, query, sent, host)


@pytest.mark.parametrize(("raw", "path", "query", "sent", "host"), REFUSED.values(), ids=REFUSED.keys())
def test_other_targets_are_refused(raw: bytes, path: str, query: bytes, sent: bytes | None, host: bytes | None) -> None:
    with pytest.raises(BadTarget) as info:
        check_target(raw, path, query, sent, host)
    assert info.value.status == 400 and info.value.code == "invalid_request_target"
    assert "origin-form" in info.value.message
