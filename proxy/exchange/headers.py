"""Headers as every front end holds them: (name, value) byte pairs, names in lower case, as ASGI and Envoy give
them."""

from __future__ import annotations

from collections.abc import Sequence

Headers = list[tuple[bytes, bytes]]
RawHeaders = Sequence[tuple[bytes, bytes]]  # as received: read, never changed


def encode_headers(headers: dict[str, str]) -> Headers:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
