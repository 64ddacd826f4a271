"""`token-guard doctor` and the start-up drift check: the pure comparison, the samples file, and the command against the
simulator serving the guard's own template (all agree) or a different one (reported, exit 1)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from proxy.cli import main
from proxy.counting.registry import ModelRegistry
from proxy.drift.compare import (
    MISMATCH,
    OK,
    REFUSED,
    SMALLER,
    UNKNOWN,
    Refusal,
    Row,
    compare,
    drift_lines,
    verdict,
    window_verdict,
)
from proxy.drift.samples import BUILTIN_SAMPLES, Sample, SamplesError, load_samples
from proxy.drift.sides import charge_body, charged_result, tokenize_body, tokenize_result
from proxy.drift.startup import drift_warnings
from proxy.server.running import ServerThread
from proxy.settings import load_settings
from proxy.upstream.client import Upstream
from proxy.upstream.http import HttpClient
from proxy.upstream.remote_count import Reply
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.servers import MODEL, guard, simulator
from tests.support.trained import CHATML_TEMPLATE

ROOT = Path(__file__).resolve().parents[2]
CHAT_SAMPLES = {s.name for s in BUILTIN_SAMPLES if s.kind == "chat"}
COMPLETION_SAMPLES = {s.name for s in BUILTIN_SAMPLES if s.kind == "completion"}


# --- the pure comparison ---


@pytest.mark.parametrize(
    ("guard", "upstream", "expected"),
    [
        (12, 12, OK),
        (12, 13, MISMATCH),
        (Refusal("template error"), 13, MISMATCH),
        (12, Refusal("400 bad"), MISMATCH),
        (Refusal("System role not supported"), Refusal("400 System role not supported"), REFUSED),
    ],
)
def test_verdict(guard: int | Refusal, upstream: int | Refusal, expected: str) -> None:
    assert verdict(guard, upstream) == expected


@pytest.mark.parametrize(
    ("guard", "upstream", "expected"),
    [(2048, 2048, OK), (4096, 2048, MISMATCH), (1024, 2048, SMALLER), (2048, None, UNKNOWN), (None, 2048, UNKNOWN)],
)
def test_window_verdict(guard: int | None, upstream: int | None, expected: str) -> None:
    assert window_verdict(guard, upstream) == expected


def test_compare_pairs_counts_by_sample() -> None:
    rows = compare("m", ["a", "b"], [3, 4], [3, 5])
    assert [(r.sample, r.verdict) for r in rows] == [("a", OK), ("b", MISMATCH)]
    with pytest.raises(ValueError):
        compare("m", ["a"], [1, 2], [1, 2])


def test_drift_lines_name_each_disagreeing_model_once() -> None:
    rows = [Row("a", "plain", 5, 5), Row("b", "plain", 5, 7), Row("b", "tools", 9, Refusal("400 no tools"))]
    (line,) = drift_lines(rows)
    assert line.startswith("model b:")
    assert "2 of 2" in line and "plain: guard 5, upstream 7" in line and "tools: guard 9, upstream refused" in line
    assert drift_lines([Row("a", "plain", 5, 5), Row("a", "x", Refusal("r"), Refusal("r"))]) == []


def test_tokenize_result_reads_count_or_the_error_message() -> None:
    assert tokenize_result(Reply.of(200, b'{"count": 7, "max_model_len": 2048, "tokens": []}')) == 7
    error = b'{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404}}'
    assert tokenize_result(Reply.of(404, error)) == Refusal("404 The model `x` does not exist.")
    old = b'{"object": "error", "message": "old envelope"}'
    assert tokenize_result(Reply.of(400, old)) == Refusal("400 old envelope")
    assert tokenize_result(Reply.of(502, b"Bad Gateway")) == Refusal("502 Bad Gateway")


def test_tokenize_body_sends_only_what_tokenize_accepts() -> None:
    chat = Sample("c", "chat", {"messages": [], "max_tokens": 5, "tools": None, "reasoning_effort": "low",
                                "chat_template_kwargs": {"x": 1}, "continue_final_message": True})  # fmt: skip
    assert tokenize_body("m", chat) == {
        "model": "m",
        "messages": [],
        "continue_final_message": True,
        "chat_template_kwargs": {"x": 1, "reasoning_effort": "low", "enable_thinking": True},
    }
    completion = Sample("p", "completion", {"prompt": "hi", "max_tokens": 3, "add_special_tokens": False})
    assert tokenize_body("m", completion) == {"model": "m", "prompt": "hi", "add_special_tokens": False}


def test_charge_body_asks_for_one_greedy_token_and_keeps_what_renders() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat = Sample("c", "chat", {"messages": [], "tools": tools, "max_completion_tokens": 900, "stream": True, "n": 3})
    assert charge_body("m", chat) == {"messages": [], "tools": tools, "model": "m", "max_tokens": 1, "temperature": 0,
                                      "tool_choice": "none"}  # fmt: skip
    assert charged_result(Reply.of(200, b'{"usage": {"prompt_tokens": 12, "completion_tokens": 1}}')) == 12
    assert charged_result(Reply.of(400, b'{"error": {"message": "no"}}')) == Refusal("400 no")


# --- the samples file ---


def test_samples_file_lines_become_samples(tmp_path: Path) -> None:
    path = tmp_path / "traffic.jsonl"
    lines = [
        {"model": "ignored", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9},
        {"prompt": ["one", "two"]},
        {"prompt": [[1, 2, 3]]},  # token ids: nothing to compare
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines[:1]) + "\n\n" + "\n".join(map(json.dumps, lines[1:])))
    samples = load_samples(path)
    assert [(s.name, s.kind) for s in samples] == [
        ("traffic.jsonl:1", "chat"),
        ("traffic.jsonl:3[0]", "completion"),
        ("traffic.jsonl:3[1]", "completion"),
    ]
    assert samples[2].body["prompt"] == "two"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object with 'messages' (chat) or 'prompt' (completions)"),
        ('{"messages": [], "prompt": "x"}', "not both"),
        ('{"messages": "hi"}', "'messages' must be a non-empty array"),
        ('{"prompt": 5}', "'prompt' must be a string"),
    ],
)
def test_a_malformed_line_is_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(SamplesError, match=f"samples file {path}, line 2: .*") as caught:
        load_samples(path)
    assert message in str(caught.value)


def test_a_samples_file_with_nothing_to_check_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(SamplesError, match="no request to check"):
        load_samples(path)
    with pytest.raises(SamplesError, match="cannot be read"):
        load_samples(tmp_path / "missing.jsonl")


# --- the command against the simulator ---


@pytest.fixture(scope="module")
def chatml_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "chatml.jinja"
    path.write_text(CHATML_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def same_upstream(deepseek_dir: Path) -> Iterator[str]:
    with simulator(deepseek_dir) as (server, _, _):
        yield server.url


@pytest.fixture(scope="module")
def drifted_upstream(deepseek_dir: Path, chatml_template: Path) -> Iterator[str]:
    """The same tokenizer behind a different chat template: what a re-uploaded model or a vLLM upgrade looks like."""
    with simulator(deepseek_dir, chat_template=chatml_template) as (server, _, _):
        yield server.url


def run_doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["doctor", "--log-level", "warning", *args])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(out: str) -> dict[str, str]:
    """sample -> verdict from the printed samples table (the block under its header)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "sample"])
    block = lines[start + 1 : lines.index("", start)]
    return {row[1]: row[-1] for row in (line.split() for line in block if line.startswith(f"{MODEL} "))}


def test_same_template_all_ok(capsys: pytest.CaptureFixture[str], same_upstream: str, deepseek_dir: Path) -> None:
    code, out, _ = run_doctor(capsys, "--upstream", same_upstream, "--model", MODEL, "--tokenizer", str(deepseek_dir))
    assert code == 0
    assert verdicts(out) == {s.name: OK for s in BUILTIN_SAMPLES}
    assert "vLLM version 0.32.0" in out
    assert "OK: all 9 samples agree" in out
    assert f"  {MODEL}: chat rendered by hf: tokenizer_mode hf (auto:" in out
    assert f"  {MODEL}: counted by auto: auto: the guard agreed with what vLLM charges on all 9 samples" in out


def test_zero_config_check_as_a_subprocess(same_upstream: str) -> None:
    """The real command line, models learned from the upstream's /v1/models `root` as a sidecar would."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "doctor", "--upstream", same_upstream, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("TOKEN_GUARD_")},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["upstream"]["version"] == "0.32.0"
    assert {(r["model"], r["sample"], r["verdict"]) for r in report["samples"]} == {
        (MODEL, s.name, OK) for s in BUILTIN_SAMPLES
    }
    assert all(r["guard"] == r["upstream"] == r["charged"] and r["guard"] > 0 for r in report["samples"])
    (info,) = report["models"]
    assert (info["model"], info["rendering"], info["count_source"]) == (MODEL, "hf", "auto")
    assert "Hugging Face tokenizer and chat template" in info["rendering_reason"]
    assert report["max_model_len"] == [
        {"model": MODEL, "guard": 2048, "source": "discovered", "upstream": 2048, "verdict": OK}
    ]


def test_a_different_template_is_reported(
    capsys: pytest.CaptureFixture[str], drifted_upstream: str, deepseek_dir: Path
) -> None:
    code, out, _ = run_doctor(
        capsys, "--upstream", drifted_upstream, "--model", MODEL, "--tokenizer", str(deepseek_dir)
    )
    assert code == 1
    found = verdicts(out)
    assert {name for name, v in found.items() if v == MISMATCH} == CHAT_SAMPLES
    assert {name for name, v in found.items() if v == OK} == COMPLETION_SAMPLES  # the tokenizer itself agrees
    assert f"FAIL: {len(CHAT_SAMPLES)} of {len(BUILTIN_SAMPLES)} sample counts differ" in out


def test_json_report_of_a_mismatch(
    capsys: pytest.CaptureFixture[str], drifted_upstream: str, deepseek_dir: Path
) -> None:
    args = ("--upstream", drifted_upstream, "--model", MODEL, "--tokenizer", str(deepseek_dir), "--json")
    code, out, _ = run_doctor(capsys, *args)
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False
    plain = next(r for r in report["samples"] if r["sample"] == "plain")
    assert plain["verdict"] == MISMATCH and plain["guard"] != plain["upstream"]


def test_samples_file_is_honoured(
    capsys: pytest.CaptureFixture[str], same_upstream: str, deepseek_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "東京はどこ？"}]},
        {"prompt": ["first prompt", "second 🎉 prompt"], "max_tokens": 4},
        # vLLM refuses a request's own template unless started with --trust-request-chat-template; the guard would
        # count it, so the two sides disagree and the check says so.
        {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages[0]['content'] }}"},
    ]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    code, out, _ = run_doctor(
        capsys, "--upstream", same_upstream, "--model", MODEL, "--tokenizer", str(deepseek_dir), "--samples", str(path)
    )
    found = verdicts(out)
    assert {k: v for k, v in found.items() if k.startswith("mine.jsonl")} == {
        "mine.jsonl:1": OK,
        "mine.jsonl:2[0]": OK,
        "mine.jsonl:2[1]": OK,
        "mine.jsonl:3": MISMATCH,
    }
    assert "mine.jsonl:3: upstream refused: 400 Chat template is passed with request" in out
    assert code == 1


def test_a_malformed_samples_file_stops_the_check(
    capsys: pytest.CaptureFixture[str], same_upstream: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"messages": [{"role": "user", "content": "cut off"\n')
    code, out, err = run_doctor(capsys, "--upstream", same_upstream, "--samples", str(path))
    assert code == 2
    assert out == ""
    assert f"token-guard doctor: error: samples file {path}, line 2: not valid JSON" in err


def test_an_unreachable_upstream_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        code, out, err = run_doctor(capsys, "--upstream", url, "--wait", "0")
    assert code == 2
    assert out == ""
    assert f"token-guard doctor: error: cannot reach the upstream at {url} within 0 s" in err
    assert "could not be reached (connection refused)" in err


@pytest.mark.parametrize(("configured", "expected", "code"), [("4096", MISMATCH, 1), ("1024", SMALLER, 0)])
def test_max_model_len_disagreement_is_shown(
    capsys: pytest.CaptureFixture[str],
    same_upstream: str,
    deepseek_dir: Path,
    configured: str,
    expected: str,
    code: int,
) -> None:
    args = ["--upstream", same_upstream, "--model", MODEL, "--tokenizer", str(deepseek_dir)]
    got, out, _ = run_doctor(capsys, *args, "--max-model-len", configured)
    assert got == code
    window = next(line for line in out.splitlines() if line.startswith(MODEL) and "(config)" in line)
    assert window.split() == [MODEL, configured, "(config)", "2048", expected]
    report = json.loads(run_doctor(capsys, *args, "--max-model-len", configured, "--json")[1])
    assert report["max_model_len"] == [
        {"model": MODEL, "guard": int(configured), "source": "config", "upstream": 2048, "verdict": expected}
    ]


# --- the start-up drift check ---


def drift(upstream_url: str, tokenizer: Path, source: str = "auto") -> tuple[list[str], ModelRegistry]:
    flags = {"upstream.url": upstream_url, "model.name": MODEL, "model.tokenizer": str(tokenizer),
             "counting.source": source}  # fmt: skip
    settings = load_settings(flags, environ={})
    registry = ModelRegistry.from_settings(settings.models, settings.counting)

    async def go() -> list[str]:
        upstream = Upstream(settings.upstream, HttpClient(settings.upstream))
        try:
            return await drift_warnings(registry, upstream)
        finally:
            await upstream.aclose()

    return asyncio.run(go()), registry


def test_drift_warnings_empty_when_both_sides_agree(same_upstream: str, deepseek_dir: Path) -> None:
    lines, registry = drift(same_upstream, deepseek_dir)
    assert lines == []
    model = registry.resolve(MODEL)
    assert model.count_source == "auto"  # local, with images and audio left to the upstream
    assert model.source_reason.startswith(
        f"auto: the guard agreed with what vLLM charges on all {len(BUILTIN_SAMPLES)}"
    )


def test_drift_warnings_for_a_different_template(drifted_upstream: str, deepseek_dir: Path) -> None:
    lines, registry = drift(drifted_upstream, deepseek_dir)
    (line,) = lines
    assert line.startswith(f"model {MODEL}: the guard's token counts differ from what the upstream counts")
    assert f"on {len(CHAT_SAMPLES)} of {len(BUILTIN_SAMPLES)} built-in samples" in line
    assert "plain: guard" in line and "token-guard doctor" in line
    # counting.source auto: from now on the upstream counts this model's prompts (the simulator has no render
    # endpoints, so through POST /tokenize, which is exact for a template-rendered model)
    model = registry.resolve(MODEL)
    assert model.count_source == "upstream"
    assert "vLLM counts this model's prompts (POST /tokenize)" in model.source_reason


def tokenize_adds_one(app: Any) -> Any:
    """The simulator, but its POST /tokenize counts one token more than generation charges: what vLLM 0.31/0.32 in
    mistral mode answer for a completions prompt (a BOS that generation's usage does not count)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/tokenize":
            await app(scope, receive, send)
            return
        sent: list[Any] = []

        async def keep(message: Any) -> None:
            sent.append(message)

        await app(scope, receive, keep)
        payload = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
        payload["count"] += 1
        body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in sent[0]["headers"] if k != b"content-length"]
        await send({**sent[0], "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return wrapped


def test_the_start_up_check_judges_by_what_generation_charges_not_by_tokenize(deepseek_dir: Path) -> None:
    app = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL))
    with ServerThread(tokenize_adds_one(app)) as server:
        lines, registry = drift(server.url, deepseek_dir)
    assert lines == []
    assert registry.resolve(MODEL).count_source == "auto" and registry.checked


def test_a_configured_local_source_is_kept_whatever_the_check_finds(drifted_upstream: str, deepseek_dir: Path) -> None:
    lines, registry = drift(drifted_upstream, deepseek_dir, source="local")
    assert len(lines) == 1
    assert registry.resolve(MODEL).count_source == "local"


def test_drift_warnings_never_raise(deepseek_dir: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        (line,), _ = drift(f"http://127.0.0.1:{closed.getsockname()[1]}", deepseek_dir)
    assert "drift check against" in line and "could not run" in line and "connection refused" in line


async def _no_tokenize(scope: Scope, receive: Receive, send: Send) -> None:
    """An OpenAI-compatible server that is not vLLM: no /tokenize, no render endpoints, and usage counted its own way
    (always 7 prompt tokens), so the guard's counts disagree with it."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path, body = scope["path"], dict[str, Any]()
    if path == "/v1/models":
        status, body = 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}]}
    elif path == "/health":
        status, body = 200, {}
    elif scope["method"] == "POST" and path.endswith("/completions"):
        status, body = 200, {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}  # fmt: skip
    else:
        status, body = 404, {"error": {"message": "not here", "type": "NotFoundError", "code": 404}}
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def test_an_upstream_that_cannot_count_leaves_counting_to_the_guard(deepseek_dir: Path) -> None:
    with ServerThread(_no_tokenize) as upstream:
        lines, registry = drift(upstream.url, deepseek_dir)
        assert len(lines) == 1  # the counts differ, and the check says so
        model = registry.resolve(MODEL)
        assert model.count_source == "auto"
        assert "the upstream offers no way to count" in model.source_reason
        with guard(upstream.url, deepseek_dir, **{"model.max_model_len": 2048}) as server:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100_000}
            response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-token-guard-count-source"] == "local"
    assert response.headers["x-token-guard-action"] == "clamp"


def test_the_former_name_check_still_runs_and_says_the_new_one(
    capsys: pytest.CaptureFixture[str], same_upstream: str, deepseek_dir: Path
) -> None:
    code = main(["check", "--log-level", "warning", "--upstream", same_upstream, "--model", MODEL,
                 "--tokenizer", str(deepseek_dir)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and "OK: all 9 samples agree" in out
    assert "`token-guard check` is now `token-guard doctor`" in err
