"""What the processor changes in a forwarded request's headers, decided once from the settings: the client's
credentials as serve's rule has them, a client's x-gateway-destination-endpoint unless a picker before the guard sets
it, and `:path` without a gateway prefix, matched as sent and by whole segments."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.counting.registry import ModelRegistry
from proxy.exchange.core import Core
from proxy.extproc.gateway import Gateway
from proxy.settings import load_settings
from tests.support.servers import MODEL


def gateway(tokenizer: Path, **flags: object) -> Gateway:
    settings = load_settings({"model.name": MODEL, "model.tokenizer": str(tokenizer), **flags}, environ={})
    return Gateway(Core(settings, ModelRegistry.from_settings(settings.models, settings.counting)))


def test_without_keys_or_a_picker_only_a_clients_destination_is_taken_off(deepseek_dir: Path) -> None:
    fixed = gateway(deepseek_dir).fixed
    assert fixed.set == [] and fixed.removed == ("x-gateway-destination-endpoint",)


def test_keys_take_the_clients_credentials_off_and_the_upstream_key_goes_on(deepseek_dir: Path) -> None:
    keyed = gateway(deepseek_dir, **{"server.admin_api_keys": "a"}).fixed
    assert set(keyed.removed) == {"authorization", "x-api-key", "x-gateway-destination-endpoint"} and keyed.set == []
    upstream = gateway(deepseek_dir, **{"upstream.api_key": "up", "extproc.picker_sets_destination": True}).fixed
    assert upstream.removed == ("authorization", "x-api-key")
    assert upstream.set == [(b"authorization", b"Bearer up")]


@pytest.mark.parametrize(
    ("sent", "inner"),
    [(b"/llama/v1/chat/completions", b"/v1/chat/completions"), (b"/llama/", b"/"), (b"/m/x/v1/models", b"/v1/models"),
     (b"/llama", None), (b"/llamas/v1/models", None), (b"/llam%61/v1/models", None), (b"/v1/llama/x", None),
     (b"/LLAMA/v1/models", None)],
)  # fmt: skip
def test_a_prefix_is_taken_off_whole_segments_as_sent(deepseek_dir: Path, sent: bytes, inner: bytes | None) -> None:
    prefixed = gateway(deepseek_dir, **{"extproc.path_prefixes": "/llama,/m/x"})
    assert prefixed.unprefixed(sent) == inner
    if inner is not None:
        upward = prefixed.upward(inner + b"?a=1")
        assert upward.set == [(b":path", inner + b"?a=1")] and upward.removed == prefixed.fixed.removed


def test_a_prefix_that_hides_a_route_is_told_at_start(deepseek_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="token_guard.extproc"):
        gateway(deepseek_dir, **{"extproc.path_prefixes": "/inference"})
    assert "/inference/v1/generate" in caplog.text
