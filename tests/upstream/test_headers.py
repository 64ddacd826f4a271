"""The headers sent upstream: the client's credentials never where the guard checks keys or holds its own, the guard's
own key in their place; with neither, the client's go on (they are vLLM's)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.upstream.headers import Credentials, outgoing, upstream_auth

CLIENT = {"Authorization": "Bearer client", "x-api-key": "client", "x-a": "1"}
OUTGOING = [
    (CLIENT, "up", True, {"x-a": "1", "authorization": "Bearer up"}),
    (CLIENT, "up", False, {"x-a": "1", "authorization": "Bearer up"}),
    ({"x-a": "1"}, "up", False, {"x-a": "1", "authorization": "Bearer up"}),
    (CLIENT, None, True, {"x-a": "1"}),
    (CLIENT, None, False, CLIENT),
]


@pytest.mark.parametrize(("headers", "api_key", "checks_keys", "expected"), OUTGOING)
def test_outgoing_headers(
    headers: dict[str, str], api_key: str | None, checks_keys: bool, expected: dict[str, Any]
) -> None:
    assert outgoing(headers, Credentials.of(api_key, checks_keys)) == expected
    assert upstream_auth(api_key) == ({} if api_key is None else {"authorization": f"Bearer {api_key}"})
