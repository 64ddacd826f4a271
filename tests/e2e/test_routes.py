"""vLLM's own route tables against the guard's: the snapshot `make test` checks (tests/api/vllm_routes.json) is what
the installed vLLM 0.31 and 0.32 declare, every path a running vLLM serves is in it, and through the guard every
undeclared or administrative path stays closed while vLLM serves it."""

from __future__ import annotations

import json

import httpx
import pytest

from proxy.api.routes import Kind, RouteTable
from tests.e2e.runtime import VERSIONS, vllm_venv
from tests.e2e.stack import Stack
from tests.e2e.vllm_routes import SNAPSHOT, routes_in, site_packages

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("version", VERSIONS)
def test_the_snapshot_is_what_the_installed_vllm_declares(version: str) -> None:
    snapshot = json.loads(SNAPSHOT.read_text())[version]
    found = [list(route) for route in routes_in(site_packages(vllm_venv(version)))]
    assert found == snapshot, "vLLM's routes changed: run `python -m tests.e2e.vllm_routes` and declare the new ones"


def test_every_path_a_running_vllm_serves_is_in_the_snapshot_and_declared(stack: Stack) -> None:
    served = httpx.get(stack.vllm_url + "/openapi.json", timeout=30).json()["paths"]
    snapshot = {path for _, path in json.loads(SNAPSHOT.read_text())[stack.version]}
    table = RouteTable()
    assert served and set(served) <= snapshot, set(served) - snapshot
    assert all(table.declares(path) is not None for path in served)


def test_vllm_serves_what_the_guard_keeps_closed(stack: Stack) -> None:
    """The routes exist upstream (vLLM answers them), and the guard answers them without forwarding."""
    direct = httpx.get(stack.vllm_url + "/openapi.json", timeout=30)
    assert direct.status_code == 200
    guarded = httpx.get(stack.proxy_url + "/openapi.json", timeout=30)
    assert guarded.status_code == 403 and guarded.json()["error"]["code"] == "permission_denied"
    assert RouteTable().declares("/openapi.json").kind is Kind.CONTROL  # type: ignore[union-attr]
    sleeping = httpx.post(stack.proxy_url + "/sleep?level=1", timeout=30)
    assert sleeping.status_code == 403
    assert httpx.get(stack.vllm_url + "/health", timeout=30).status_code == 200  # still awake
