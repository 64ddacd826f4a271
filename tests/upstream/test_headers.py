"""The headers sent upstream: the guard's own key replaces the client's."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.upstream.headers import outgoing, upstream_auth

OUTGOING = [
    ({"authorization": "Bearer client", "x-a": "1"}, "up", {"x-a": "1", "authorization": "Bearer up"}),
    ({"Authorization": "Bearer client"}, "up", {"authorization": "Bearer up"}),
    ({"x-a": "1"}, "up", {"x-a": "1", "authorization": "Bearer up"}),
    ({"Authorization": "Bearer client"}, None, {"Authorization": "Bearer client"}),
]


@pytest.mark.parametrize(("headers", "api_key", "expected"), OUTGOING)
def test_outgoing_headers(headers: dict[str, str], api_key: str | None, expected: dict[str, Any]) -> None:
    assert outgoing(headers, api_key) == expected
    assert upstream_auth(api_key) == ({} if api_key is None else {"authorization": f"Bearer {api_key}"})
