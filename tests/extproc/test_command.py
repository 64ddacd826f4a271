"""`token-guard extproc` takes serve's settings; --port is the processor's own (extproc.port)."""

from __future__ import annotations

import pytest

from proxy.cli import build_parser, flags_from, settings_from
from proxy.settings import SettingsError, load_settings


def test_port_sets_the_processors_port_and_the_rest_is_serves() -> None:
    args = build_parser().parse_args(["extproc", "--upstream", "http://vllm:8000", "--port", "9100", "--host", "::"])
    flags = flags_from(args, port="extproc.port")
    assert flags == {"extproc.port": "9100", "server.host": "::", "upstream.url": "http://vllm:8000"}
    settings = settings_from(args, port="extproc.port")
    assert settings.extproc.port == 9100 and settings.server.port == 8080


def test_the_chunk_policy_falls_back_to_reject_or_truncate_only() -> None:
    assert load_settings({}, environ={}).extproc.chunk_instead == "reject"
    assert (
        load_settings({}, environ={"TOKEN_GUARD_EXTPROC_CHUNK_INSTEAD": "truncate"}).extproc.chunk_instead == "truncate"
    )
    with pytest.raises(SettingsError, match="extproc.chunk_instead"):
        load_settings({"extproc.chunk_instead": "chunk"}, environ={})
