"""`token-guard extproc` stops when told, behind a real Envoy (1.40): on SIGTERM gRPC's health service says
NOT_SERVING and new streams are refused, so that Envoy's health checks send them to another processor; the streams in
flight get server.drain_timeout_s; then a request still waiting for its answer is answered 503 (Retry-After) and one
whose answer is under way is let go (Envoy carries it on); what they held comes back (Redis: the budget reserved,
the heartbeat, a key's charge), one line says what was cut, and the process exits 0.

At e63017a a processor that had parsed a large body in its child process never exited on a SIGTERM to its process
group: the idle child died holding its pool's queue lock, which the exit then waited for."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.envoy import cluster, processor
from proxy.counting.isolated import LARGE_BODY_BYTES
from tests.support.envoy import Envoy, envoy
from tests.support.extproc import extproc, health
from tests.support.fleet_state import fleet_state
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401
from tests.support.servers import MODEL, simulator

MARGIN_S = 20  # beyond the drain's own time: only a processor that hangs needs more
STOPPED = "token-guard extproc stopped"
LIMIT = 600_000  # bob's tokens a minute: never the reason a request is refused here


@dataclass
class Rig:
    envoy: Envoy
    upstream: str
    stats: Any
    tokenizer: Path
    first: int  # the port of the processor every listener but "pair" asks
    second: int  # the second processor's, beside the first behind "pair" (health-checked)

    def sdk(self, listener: str, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.envoy.urls[listener]}/v1", api_key=key, max_retries=0, timeout=60)

    def processor(self, log: Path, **env: str) -> Any:
        """The processor every listener asks (the first); `env`: its TOKEN_GUARD_* settings."""
        return extproc(self.upstream, self.tokenizer, log, self.first, **env)

    def ready_through(self, listener: str) -> bool:
        try:
            return httpx.get(f"{self.envoy.urls[listener]}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    first, second = free_port(), free_port()
    with simulator(deepseek_dir, itl_s=0.05) as (sim, stats, _):  # 20 tokens a second
        listeners = {
            "buffered": [processor("guard", "BUFFERED")],
            "duplex": [processor("guard", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
            "pair": [processor("pair", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
        }
        clusters = [
            cluster("guard", first, grpc=True),
            cluster("pair", [first, second], grpc=True, health_checked=True),
        ]
        with envoy(tmp_path_factory.mktemp("envoy"), int(sim.url.rsplit(":", 1)[1]), listeners, clusters) as running:
            yield Rig(running, sim.url, stats, deepseek_dir, first, second)


def chat(max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "stream": stream}


def answered(rig: Rig, listener: str) -> int:
    return httpx.post(
        f"{rig.envoy.urls[listener]}/v1/chat/completions", json=chat(3, stream=False), timeout=60
    ).status_code


def test_a_processor_envoy_holds_only_idle_connections_to_exits_at_once(rig: Rig, tmp_path: Path) -> None:
    with rig.processor(tmp_path / "extproc.log", TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S="5") as guard:
        assert eventually(lambda: rig.ready_through("buffered"), timeout_s=30)
        assert [answered(rig, listener) for listener in ("buffered", "duplex") for _ in range(3)] == [200] * 6
        words = "word " * (LARGE_BODY_BYTES // 5 + 1000)  # parsed in the processor's child process
        large = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 5}
        refused = httpx.post(f"{rig.envoy.urls['duplex']}/v1/chat/completions", json=large, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
        guard.terminate()
        assert guard.process.wait(timeout=5 + MARGIN_S) == 0
        (stopped,) = guard.lines(STOPPED)
        # nothing cut; at most the refused request in flight: gRPC sends an answer from its own thread, so the client
        # can have the 400 (and the test send the signal) before the processor's stream has ended
        at_stop = re.search(r"(\d+) request\(s\) in flight at the stop; none cut", stopped)
        assert at_stop is not None and int(at_stop[1]) <= 1, stopped


def test_a_stream_open_at_the_signal_finishes_while_new_ones_are_refused(rig: Rig, tmp_path: Path) -> None:
    with rig.processor(tmp_path / "extproc.log", TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S="60") as guard:
        assert eventually(lambda: rig.ready_through("duplex"), timeout_s=30)
        text = []
        for n, event in enumerate(rig.sdk("duplex").chat.completions.create(**chat(60))):  # about 3 s
            text.append(event.choices[0].delta.content or "")
            if n == 0:
                guard.terminate()
                assert eventually(lambda: health(guard.port) == "NOT_SERVING")
                assert health(guard.port, "liveness") == "SERVING"  # draining is not dead: no restart
                assert answered(rig, "buffered") == 503  # a new stream is refused: Envoy's status_on_error
            finish = event.choices[0].finish_reason
        assert finish == "length" and len("".join(text)) > 60  # every token, to the end
        assert guard.process.wait(timeout=60 + MARGIN_S) == 0
        (stopped,) = guard.lines(STOPPED)
        assert "1 request(s) in flight at the stop; none cut" in stopped


def test_at_the_end_of_the_grace_a_waiting_request_gets_503_and_an_answer_under_way_goes_on(
    rig: Rig, tmp_path: Path, redis: RedisServer
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[[keys]]\nname = "alice"\nkey = "sk-alice"\n\n'
                    f'[[keys]]\nname = "bob"\nkey = "sk-bob"\ntokens_per_minute = {LIMIT}\n')  # fmt: skip
    settings = {"TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S": "1", "TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_REQUESTS": "1",
                "TOKEN_GUARD_ADMISSION_QUEUE_TIMEOUT_S": "120", "TOKEN_GUARD_CONFIG": str(keys),
                "TOKEN_GUARD_REDIS_URL": redis.url, "TOKEN_GUARD_REDIS_LEASE_S": "120"}  # fmt: skip
    with rig.processor(tmp_path / "extproc.log", **settings) as guard:
        assert eventually(lambda: rig.ready_through("buffered"), timeout_s=30)
        assert eventually(lambda: fleet_state(redis.url, "bob")[1] == 1)  # its heartbeat
        running = iter(rig.sdk("buffered", "sk-alice").chat.completions.create(**chat(100)))  # about 5 s
        next(running)  # admitted: the only place is its
        assert fleet_state(redis.url, "bob", rig.upstream)[0][1] >= 1  # its reservation, in Redis
        waited: list[openai.APIStatusError] = []

        def wait_in_queue() -> None:
            try:
                rig.sdk("duplex", "sk-bob").chat.completions.create(**chat(2000, stream=False))
            except openai.APIStatusError as exc:
                waited.append(exc)

        waiting = threading.Thread(target=wait_in_queue)
        waiting.start()
        assert eventually(lambda: _queued(rig) == 1)
        bucket = fleet_state(redis.url, "bob")[2]
        assert LIMIT - float(bucket["tokens"]) > 2000  # bob's charge, reserved as his request waits
        guard.terminate()
        waiting.join(timeout=1 + MARGIN_S)
        (refused,) = waited
        assert refused.status_code == 503 and refused.code == "shutting_down"
        assert refused.type == "ServiceUnavailableError" and refused.response.headers["retry-after"] == "1"
        assert guard.process.wait(timeout=1 + MARGIN_S) == 0
        finish = [event.choices[0].finish_reason for event in running][-1]
        assert finish == "length"  # let go mid-answer: Envoy carried the stream on without the processor
    (stopped,) = guard.lines(STOPPED)
    assert "2 request(s) in flight at the stop; 2 cut" in stopped
    assert "1 answered 503" in stopped and "1 let go mid-answer" in stopped
    reserved, instances, bucket = fleet_state(redis.url, "bob", rig.upstream)
    assert reserved == (0, 0) and instances == 0  # given back at once, not when a lease of 120 s runs out
    assert LIMIT - float(bucket.get("tokens", LIMIT)) < 100  # bob's charge came back (a full bucket expires)


def test_envoy_sends_no_stream_to_a_processor_that_drains(rig: Rig, tmp_path: Path) -> None:
    with (
        rig.processor(tmp_path / "first.log", TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S="60") as first,
        extproc(rig.upstream, rig.tokenizer, tmp_path / "second.log", rig.second) as second,
    ):
        assert eventually(lambda: _hosts(rig) == {rig.first: True, rig.second: True}, timeout_s=30)
        held = rig.sdk("duplex").chat.completions.create(**chat(100))  # "duplex" asks the first only: about 5 s
        events = iter(held)
        next(events)
        first.terminate()
        assert eventually(lambda: _hosts(rig) == {rig.first: False, rig.second: True})  # its NOT_SERVING, seen
        assert [answered(rig, "pair") for _ in range(10)] == [200] * 10  # none sent to the first, which refuses
        assert [event.choices[0].finish_reason for event in events][-1] == "length"
        assert first.process.wait(timeout=60 + MARGIN_S) == 0
        assert health(second.port) == "SERVING"


def _hosts(rig: Rig) -> dict[int, bool]:
    """Envoy's view of the "pair" cluster: each processor's port -> whether its health checks pass."""
    hosts = httpx.get(f"{rig.envoy.admin}/clusters?format=json", timeout=5).json()["cluster_statuses"]
    (pair,) = [c for c in hosts if c["name"] == "pair"]
    return {
        host["address"]["socket_address"]["port_value"]: not host["health_status"].get("failed_active_health_check")
        for host in pair["host_statuses"]
    }


def _queued(rig: Rig) -> int:
    metrics = httpx.get(f"{rig.envoy.urls['buffered']}/metrics", timeout=5).text
    line = next(line for line in metrics.splitlines() if line.startswith("token_guard_admission_queue_depth"))
    return int(float(line.rsplit(" ", 1)[1]))
