"""One request as the front ends hold it (exchange/request.py), on a real Core: the headers every answer carries as
its key's charges change them, and what its answer's end gives back or hands over."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.api.routes import RouteTable
from proxy.counting.registry import ModelRegistry
from proxy.errors import TooBusy
from proxy.exchange.core import Core
from proxy.exchange.request import QUEUE_HEADER, Request
from proxy.policy.quota import CHARGE, TAKE
from proxy.policy.usage import Charge
from proxy.settings import load_settings
from tests.support.servers import MODEL

KEYS = """
[[keys]]
name = "few"
key = "sk-few"
requests_per_minute = 2
tokens_per_minute = 1000
"""
CHAT = "/v1/chat/completions"


def core(tmp_path: Path, tokenizer: Path) -> Core:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    flags = {"upstream.url": "http://127.0.0.1:9", "model.name": MODEL, "model.tokenizer": str(tokenizer),
             "admission.max_inflight_tokens": 1000}  # fmt: skip
    settings = load_settings(flags, environ={}, config_file=keys)
    return Core(settings, ModelRegistry.from_settings(settings.models, settings.counting))


def begun(made: Core, request_id: str = "r-1") -> Request:
    found = RouteTable().find(CHAT)
    assert found is not None
    return Request.begin(made, found.route, made.settings.keys[0], request_id, "POST", True, [])


def test_each_charge_leaves_one_set_of_rate_headers_and_a_refusal_still_carries_them(
    tmp_path: Path, deepseek_dir: Path
) -> None:
    async def main() -> None:
        async with core(tmp_path, deepseek_dir) as made:
            request = begun(made)
            assert request.tagged == [(b"x-request-id", b"r-1")]
            await request.charge(100, TAKE)
            await request.charge(200, TAKE)
            rate = dict(request.tagged)
            assert len(request.tagged) == len(rate) == 7  # the request id and one set of six, not two
            assert rate[b"x-ratelimit-remaining-requests"] == b"0" and rate[b"x-ratelimit-remaining-tokens"] == b"700"
            with pytest.raises(TooBusy, match="requests per min"):
                await request.charge(0, CHARGE)
            assert dict(request.tagged)[b"x-ratelimit-remaining-requests"] == b"0"  # what the 429 tells
            assert request.record.quota_limited
            await request.tell()  # told already: nothing added
            assert len(request.tagged) == 7

    asyncio.run(main())


def test_the_answers_headers_are_the_tagged_the_decision_and_the_queue_time(tmp_path: Path, deepseek_dir: Path) -> None:
    async def main() -> None:
        async with core(tmp_path, deepseek_dir) as made:
            request = begun(made)
            request.decided = [(b"x-token-guard-action", b"clamp")]
            ticket = made.upstream.admission.try_acquire(100)
            assert ticket is not None
            ticket.waited_s = 0.25
            request.admitted(ticket)
            assert request.headers == [*request.tagged, (b"x-token-guard-action", b"clamp"), (QUEUE_HEADER, b"250")]
            assert request.record.queue_s == 0.25
            request.answered(503)
            assert request.record.upstream_error == "http_503"
            request.let_go(ticket, None, None, {})
            assert ticket.released and not made.followers.following

    asyncio.run(main())


def test_a_background_response_vllm_took_is_handed_to_the_followers_with_its_charge(
    tmp_path: Path, deepseek_dir: Path
) -> None:
    async def main() -> None:
        async with core(tmp_path, deepseek_dir) as made:
            request = begun(made)
            assert made.settings.keys[0].limited
            charge = request.record.charge = Charge(made.settings.keys[0], 100, 40, False, False)
            ticket = made.upstream.admission.try_acquire(100)
            request.let_go(ticket, "resp_1", "http://127.0.0.1:9", {"authorization": "Bearer sk-few"})
            (followed,) = made.followers.following
            assert followed.response_id == "resp_1" and followed.ticket is ticket and followed.charge is charge
            assert ticket is not None and not ticket.released and request.record.charge is None
            await request.end(200, False, False)  # its record ends; the charge is the follower's to settle
            assert request.record.status == 200 and request.record.charged_tokens is None

    asyncio.run(main())
