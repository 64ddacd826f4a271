"""Which replica a request is admitted on behind GIE's endpoint picker: the one it names, else the pool."""

from __future__ import annotations

from proxy.extproc.endpoints import DESTINATION, POOL, Endpoints

URLS = ("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::3]:8000", "https://vllm.example")


def test_the_named_endpoint_is_the_only_one_left() -> None:
    endpoints = Endpoints(URLS)
    assert endpoints.excluded([(DESTINATION, b"10.0.0.2:8000")]) == {0, 2, 3}
    assert endpoints.excluded([(DESTINATION, b"[FD00::3]:8000")]) == {0, 1, 3}
    assert endpoints.excluded([(DESTINATION, b"vllm.example:443")]) == {0, 1, 2}
    assert endpoints.excluded([(DESTINATION, b"10.0.0.1:8000,10.0.0.2:8000")]) == {1, 2, 3}  # the first: the pick


def test_no_header_or_an_endpoint_not_configured_is_the_whole_pool() -> None:
    endpoints = Endpoints(URLS)
    assert endpoints.excluded([(b"host", b"x")]) is POOL
    assert endpoints.excluded([(DESTINATION, b"10.9.9.9:8000")]) is POOL
    assert endpoints.excluded([(DESTINATION, b"10.0.0.1:8001")]) is POOL
