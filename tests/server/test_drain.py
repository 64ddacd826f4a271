"""Graceful shutdown of `token-guard serve`: on SIGTERM it stops accepting, lets the streams in flight finish (up to
server.drain_timeout_s), then exits 0; past the timeout each request left is ended as its protocol expects (a stream
with the error event of a failed stream, a request still waiting for its answer with a 503 and Retry-After), what it
held comes back (its Redis reservation, its key's charge), and one line says what was cut. A guard that parsed a large
body in its child process stops too, when the signal goes to its whole process group."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.counting.isolated import LARGE_BODY_BYTES
from proxy.drift.samples import BUILTIN_SAMPLES
from proxy.server.running import bind_socket
from tests.support.fleet_state import fleet_state
from tests.support.polling import eventually
from tests.support.prometheus import metric
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401
from tests.support.servers import MODEL, simulator

ROOT = Path(__file__).resolve().parents[2]
MARGIN_S = 20  # beyond the drain's own time: start-up of nothing, only a guard that hangs would need more
STOPPED = "token-guard serve stopped"


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[Any]:
    with simulator(deepseek_dir, itl_s=0.05) as (server, stats, _):  # 20 tokens a second
        yield server, stats


@dataclass
class Guard:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, drain_s: float) -> int:
        """SIGTERM to the guard's whole process group (as a terminal's Ctrl-C or a container runtime may send it);
        its exit status, once it exited within the drain and a margin that only a guard that hangs exceeds."""
        os.killpg(self.process.pid, signal.SIGTERM)
        return self.process.wait(timeout=drain_s + MARGIN_S)

    def stopped_lines(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if STOPPED in line]


@contextmanager
def serve(upstream: str, tokenizer: Path, logs: Path, drain_timeout_s: float, **env: str) -> Iterator[Guard]:
    with bind_socket() as probe:
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--model", MODEL,
               "--tokenizer", str(tokenizer), "--port", str(port)]  # fmt: skip
    environ = {**os.environ, "TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S": str(drain_timeout_s), **env}
    with logs.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        ready = eventually(lambda: process.poll() is not None or _healthy(url), timeout_s=60)
        assert ready and process.poll() is None, logs.read_text()
        yield Guard(process, url, logs)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def checked(stats: Any) -> None:
    """Once the guard's start-up check has charged its samples (a 1-token generation each), the upstream forgets
    them: the test counts only its own requests."""
    assert eventually(lambda: stats.completed >= len(BUILTIN_SAMPLES) and stats.active == 0, timeout_s=60)
    stats.reset()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False


def refuses_connections(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def chat(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "stream": True}


def read_stream(url: str, max_tokens: int, on_first_token: Any) -> str:
    """The stream's text as far as it got; `on_first_token` runs once the first token has arrived."""
    received: list[str] = []
    with httpx.Client(timeout=60) as client:
        try:
            with client.stream("POST", f"{url}/v1/chat/completions", json=chat(max_tokens)) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    received.append(line)
                    if line.startswith("data: ") and len([r for r in received if r.startswith("data: ")]) == 1:
                        on_first_token()
        except httpx.RemoteProtocolError:
            pass  # the server closed the connection mid-stream
    return "\n".join(received)


def sdk(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_sigterm_lets_a_stream_in_flight_finish(sim: Any, deepseek_dir: Path, tmp_path: Path) -> None:
    server, stats = sim
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=60) as guard:
        checked(stats)
        refused: list[bool] = []

        def terminate() -> None:
            guard.process.send_signal(signal.SIGTERM)
            refused.append(eventually(lambda: refuses_connections(guard.url)))  # a new client is turned away at once

        text = read_stream(guard.url, 60, terminate)  # 60 tokens: about 3 s, far beyond the moment of the signal
        assert refused == [True]
        assert text.rstrip().endswith("data: [DONE]")
        assert guard.process.wait(timeout=60) == 0, "the guard exits, and says it stopped as asked"
        assert len(stopped := guard.stopped_lines()) == 1 and "none cut" in stopped[0]
    assert stats.completed == 1 and stats.aborted == 0


def test_a_stream_still_running_when_the_drain_ends_fails_as_a_stream_does(
    sim: Any, deepseek_dir: Path, tmp_path: Path
) -> None:
    server, stats = sim
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=0.5) as guard:
        checked(stats)
        stream = sdk(guard.url).chat.completions.create(**chat(2000))  # 2000 tokens: about 100 s
        with pytest.raises(openai.APIError) as failed:
            for n, event in enumerate(stream):
                assert event.choices[0].delta.content is not None  # the answer's text, until the cut
                if n == 0:
                    os.killpg(guard.process.pid, signal.SIGTERM)
        assert "token-guard is stopping" in failed.value.message
        assert guard.process.wait(timeout=0.5 + MARGIN_S) == 0
        (stopped,) = guard.stopped_lines()
        assert "1 cut at the end of the drain" in stopped and "1 streams ended with an error event" in stopped
    assert eventually(lambda: stats.aborted == 1)  # and the upstream stopped generating for nobody


def test_a_request_still_waiting_when_the_drain_ends_is_answered_503(
    sim: Any, deepseek_dir: Path, tmp_path: Path
) -> None:
    server, stats = sim
    one_at_a_time = {"TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_REQUESTS": "1", "TOKEN_GUARD_ADMISSION_QUEUE_TIMEOUT_S": "120"}
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=1, **one_at_a_time) as guard:
        checked(stats)
        client = sdk(guard.url)
        running = client.chat.completions.create(**chat(2000))
        next(iter(running))  # admitted: the only place is its
        waited: list[BaseException] = []

        def wait_in_queue() -> None:
            try:
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
            except openai.APIStatusError as exc:
                waited.append(exc)

        waiting = threading.Thread(target=wait_in_queue)
        waiting.start()
        assert eventually(lambda: _queued(guard.url) == 1)
        os.killpg(guard.process.pid, signal.SIGTERM)
        waiting.join(timeout=1 + MARGIN_S)
        (refused,) = waited
        assert isinstance(refused, openai.APIStatusError) and refused.status_code == 503
        assert refused.code == "shutting_down" and refused.type == "ServiceUnavailableError"
        assert refused.response.headers["retry-after"] == "1"
        assert guard.process.wait(timeout=1 + MARGIN_S) == 0
        (stopped,) = guard.stopped_lines()
        assert "2 cut at the end of the drain" in stopped and "1 answered 503" in stopped
    assert stats.received == 1  # the waiting request never reached the upstream


def _queued(url: str) -> int:
    metrics = httpx.get(f"{url}/metrics").text
    line = next(line for line in metrics.splitlines() if line.startswith("token_guard_admission_queue_depth"))
    return int(float(line.rsplit(" ", 1)[1]))


def test_a_guard_that_parsed_a_large_body_in_its_child_stops_on_a_group_signal(
    sim: Any, deepseek_dir: Path, tmp_path: Path
) -> None:
    """The parse ran in a child process (4 MiB and more), which the signal reaches too. At e63017a an idle child died
    of it holding its pool's queue lock, and an exit through atexit waited for that lock for ever (`token-guard
    extproc` never exited; serve died of the signal uvicorn raised again, before atexit)."""
    server, _ = sim
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=5) as guard:
        words = "word " * (LARGE_BODY_BYTES // 5 + 1000)
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 5})
        answer = httpx.post(f"{guard.url}/v1/chat/completions", content=body, timeout=60)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
        assert guard.stop(drain_s=5) == 0


LIMIT = 600_000  # the key's tokens a minute: never the reason a request is refused here


def test_a_guard_stopped_mid_stream_leaves_nothing_reserved_in_redis(
    sim: Any, deepseek_dir: Path, tmp_path: Path, redis: RedisServer
) -> None:
    server, stats = sim
    config = tmp_path / "keys.toml"
    config.write_text(f'[[keys]]\nname = "team"\nkey = "sk-team"\ntokens_per_minute = {LIMIT}\n')
    fleet = {"TOKEN_GUARD_CONFIG": str(config), "TOKEN_GUARD_REDIS_URL": redis.url,
             "TOKEN_GUARD_REDIS_LEASE_S": "120",  # nothing of the guard's lapses on its own while the test runs
             "TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_TOKENS": "50000"}  # fmt: skip
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=0.5, **fleet) as guard:
        checked(stats)
        assert eventually(lambda: fleet_state(redis.url, "team")[1] == 1)  # its heartbeat
        stream = sdk(guard.url, "sk-team").chat.completions.create(**chat(4000))  # clamped to the 2048 window
        events = iter(stream)
        next(events)
        tokens, requests = fleet_state(redis.url, "team", server.url)[0]
        assert tokens >= 2000 and requests >= 1  # its reservation (or its block of credit) is held in Redis
        os.killpg(guard.process.pid, signal.SIGTERM)
        with pytest.raises(openai.APIError):
            for _ in events:
                pass
        exited = guard.process.wait(timeout=0.5 + MARGIN_S)
    reserved, instances, bucket = fleet_state(redis.url, "team", server.url)
    assert reserved == (0, 0) and instances == 0  # released at once, not when a lease of 120 s runs out
    assert LIMIT - float(bucket["tokens"]) < 1_000  # settled: the key paid what it used, not the ~2,040 reserved
    assert exited == 0


def test_a_background_response_followed_at_the_stop_gives_back_what_it_holds(
    deepseek_dir: Path, tmp_path: Path, redis: RedisServer
) -> None:
    """vLLM runs it on after the guard stops; the guard's follower ends at the stop and gives back its reservation
    in the fleet's budget at once, rather than when a lease runs out, and the drain's line counts it."""
    config = tmp_path / "keys.toml"
    config.write_text(f'[[keys]]\nname = "team"\nkey = "sk-team"\ntokens_per_minute = {LIMIT}\n')
    fleet = {
        "TOKEN_GUARD_CONFIG": str(config),
        "TOKEN_GUARD_REDIS_URL": redis.url,
        "TOKEN_GUARD_REDIS_LEASE_S": "120",
        "TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_TOKENS": "50000",
        "TOKEN_GUARD_ADMISSION_BACKGROUND_POLL_S": "0.1",
    }
    with simulator(deepseek_dir, itl_s=0.05, responses_store=True) as (server, stats, _):
        with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=0.5, **fleet) as guard:
            checked(stats)
            queued = sdk(guard.url, "sk-team").responses.create(
                model=MODEL, input="Hi", max_output_tokens=1000, background=True
            )  # about 50 s of generation
            assert queued.status == "queued"
            tokens, requests = fleet_state(redis.url, "team", server.url)[0]
            assert tokens >= 1000 and requests >= 1  # its reservation, or a block of credit, is held in Redis
            scraped = httpx.get(f"{guard.url}/metrics").text
            assert metric(scraped, "token_guard_inflight_tokens") >= 1000  # held after its answer ended
            assert guard.stop(0.5) == 0
            (stopped,) = guard.stopped_lines()
        assert fleet_state(redis.url, "team", server.url)[0] == (0, 0)
        assert "1 background responses no longer followed" in stopped
        assert stats.active == 1  # vLLM runs it on: the guard only stopped following it
