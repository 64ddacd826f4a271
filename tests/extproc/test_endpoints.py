"""Which replica a request is admitted on behind GIE's endpoint picker: the one it names, else the pool; and only
where the deployment says the picker sets the header (extproc.picker_sets_destination), else it is a client's."""

from __future__ import annotations

import asyncio

from proxy.extproc.endpoints import DESTINATION, POOL, Endpoints

URLS = ("http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::3]:8000", "https://127.0.0.5")


def excluded(endpoints: Endpoints, value: bytes | None) -> frozenset[int]:
    headers = [(b"host", b"x")] + ([(DESTINATION, value)] if value is not None else [])
    return asyncio.run(endpoints.excluded(headers))


def test_the_named_endpoint_is_the_only_one_left() -> None:
    endpoints = Endpoints(URLS, trusted=True)
    assert excluded(endpoints, b"10.0.0.2:8000") == {0, 2, 3}
    assert excluded(endpoints, b"[FD00::3]:8000") == {0, 1, 3}
    assert excluded(endpoints, b"127.0.0.5:443") == {0, 1, 2}
    assert excluded(endpoints, b"10.0.0.1:8000,10.0.0.2:8000") == {1, 2, 3}  # the first: the picker's pick


def test_a_host_name_is_matched_by_the_address_it_resolves_to() -> None:
    endpoints = Endpoints(("http://localhost:8000", "http://10.0.0.2:8000"), trusted=True)
    assert excluded(endpoints, b"127.0.0.1:8000") == {1}


def test_no_header_or_an_endpoint_not_configured_is_the_whole_pool() -> None:
    endpoints = Endpoints(URLS, trusted=True)
    assert excluded(endpoints, None) is POOL
    assert excluded(endpoints, b"10.9.9.9:8000") is POOL
    assert excluded(endpoints, b"10.0.0.1:8001") is POOL


def test_a_header_no_picker_set_is_ignored() -> None:
    endpoints = Endpoints(URLS, trusted=False)
    assert excluded(endpoints, b"10.0.0.2:8000") is POOL
    assert excluded(endpoints, b"127.0.0.5:443") is POOL


def test_a_stored_responses_replica_is_what_the_header_names_where_the_picker_routes_by_it() -> None:
    endpoints = Endpoints(URLS, trusted=True)
    assert endpoints.pinned("http://[fd00::3]:8000") == (frozenset({0, 1, 3}), b"[fd00::3]:8000")
    assert endpoints.pinned("https://127.0.0.5") == (frozenset({0, 1, 2}), b"127.0.0.5:443")
    assert endpoints.pinned("http://10.9.9.9:8000") is None  # not one of the replicas: left to the picker
    assert Endpoints(URLS, trusted=False).pinned(URLS[0]) is None  # the processor does not route: nothing to set
    chosen = [(b"host", b"x"), (DESTINATION, b"10.0.0.2:8000")]
    assert asyncio.run(endpoints.chosen(chosen)) == URLS[1]  # what the ledger records as the replica that holds it
    assert asyncio.run(Endpoints(URLS, trusted=False).chosen(chosen)) is None
