"""Fixtures for `make e2e`: tests take `stack`, parametrized over the real vLLM versions, each behind token-guard."""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator

import pytest

from tests.e2e import runtime
from tests.e2e.stack import Stack, Stacks

STACKS = pytest.StashKey[Stacks]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A plain `pytest` must not install 7 GB of vLLM: e2e tests only run when `-m` names them."""
    if "e2e" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="end-to-end against a real vLLM: run `make e2e` (pytest -m e2e)")
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    """On a failure, show what vLLM and the guard logged: the client side alone rarely says why."""
    stacks = item.config.stash.get(STACKS, None)
    if call.when == "call" and call.excinfo is not None and stacks is not None:
        for process in stacks.processes():
            item.add_report_section("call", f"{process.name} log tail", runtime.tail(process.log, 40))
    return (yield)


def wanted_versions(items: list[pytest.Item]) -> list[str]:
    """The versions the selected tests use, so `-k 0.32.0` starts one vLLM, not both."""
    ids = [item.callspec.id for item in items if isinstance(item, pytest.Function) and hasattr(item, "callspec")]
    found = [v for v in runtime.VERSIONS if any(re.search(rf"(^|-){re.escape(v)}($|-)", i) for i in ids)]
    return found or list(runtime.VERSIONS)


@pytest.fixture(scope="session")
def stacks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stacks]:
    started = Stacks(wanted_versions(request.session.items), tmp_path_factory.mktemp("e2e"))
    request.config.stash[STACKS] = started
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="session", params=runtime.VERSIONS)
def stack(request: pytest.FixtureRequest, stacks: Stacks) -> Stack:
    version: str = request.param
    return stacks.get(version)
