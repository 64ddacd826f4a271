"""Exact for the families people serve, against real vLLM: for Llama 3.1, Qwen3 (served with thinking off by default),
Mistral Nemo in mistral mode, gpt-oss (harmony) and Gemma 4, every request of the family's corpus (system, developer,
multi-turn, tools and tool results, list parts, CJK, emoji, code, reasoning fields and switches, completions) is
counted by the guard exactly as vLLM charges it (`usage.prompt_tokens`), or refused by both; where /tokenize renders
as generation does, it agrees too; and a clamp lands exactly on the window.

`make e2e` prints no parity lines for passing tests; `pytest tests/e2e/test_families.py -m e2e -s` shows them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from proxy.upstream.remote_count import chat_tokenize_body
from tests.e2e import runtime
from tests.e2e.families import FAMILIES, UNSAID_MISTRAL, WINDOW, Family, Served, corpus, one_token, served
from tests.e2e.render_parity import answers, comparable
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    chosen: Family = request.param
    with served(chosen, runtime.VERSIONS, tmp_path_factory.mktemp(chosen.name)) as running:
        yield running


@pytest.fixture(params=runtime.VERSIONS)
def family(request: pytest.FixtureRequest, servers: dict[str, Served]) -> Served:
    return servers[request.param]


def requests(family: Family) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, path, body) for every corpus request; a batch of prompts as one request each, because the guard's
    header gives the longest prompt while vLLM's usage sums them."""
    out = []
    for case in corpus(family):
        path, body = one_token(case)
        label = f"{case['id']} ({case['kind']})"
        prompts = body.get("prompt")
        if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int):
            out += [(f"{label}[{i}]", path, {**body, "prompt": p}) for i, p in enumerate(prompts)]
        else:
            out.append((label, path, body))
    return out


def test_the_first_request_once_ready_is_counted_as_vllm_charges_it(family: Served) -> None:
    """The family's first corpus request, sent the moment the guard's /health turned 200: counted with everything
    the guard learns from the upstream (its window, its version, Qwen3's default of thinking off, the check's
    verdicts), never before. Measured on vLLM 0.31 before the guard waited for it: Qwen3 counted 18, charged 22."""
    counted, charged = family.first
    assert counted is not None and counted == charged, f"{family.family.name} on {family.version}"


def test_every_corpus_request_is_counted_as_vllm_charges_it(family: Served) -> None:
    """The guard's count against what vLLM charges, request by request; and, where /tokenize renders as generation
    does (template-rendered models), against /tokenize too. For harmony and mistral mode /tokenize is no reference
    (which is why the check compares with what vLLM charges): there it disagrees with the guard somewhere."""
    differ, agreed, refused, tokenize_differ = [], 0, 0, []
    for label, path, body in requests(family.family):
        guarded = family.http.post(family.guard_url + path, json=body)
        if GUARD_PROMPT not in guarded.headers:  # the guard refused it itself: vLLM must refuse it too
            direct = family.http.post(family.vllm_url + path, json=body)
            if guarded.status_code == 400 and direct.status_code == 400:
                refused += 1
            else:
                differ.append(f"{label}: guard {guarded.status_code} {guarded.text[:100]}, vLLM {direct.status_code}")
            continue
        if guarded.status_code != 200:
            differ.append(f"{label}: guard counted {guarded.headers[GUARD_PROMPT]}, vLLM {guarded.text[:120]}")
            continue
        charged = guarded.json()["usage"]["prompt_tokens"]
        if int(guarded.headers[GUARD_PROMPT]) != charged:
            differ.append(f"{label}: guard {guarded.headers[GUARD_PROMPT]}, vLLM charged {charged}")
        agreed += 1
        if path.endswith("/chat/completions"):
            tokenized = family.http.post(family.vllm_url + "/tokenize", json=chat_tokenize_body(body["model"], body))
            if tokenized.status_code != 200 or tokenized.json()["count"] != charged:
                tokenize_differ.append(f"{label}: charged {charged}, /tokenize {tokenized.text[:80]}")
    print(f"\nparity {family.family.name} vLLM {family.version}: {agreed} counted equal, {refused} refused by both, "
          f"{len(differ)} differ; /tokenize differs from the charge on {len(tokenize_differ)}")  # fmt: skip
    assert not differ, "\n".join(differ)
    assert agreed >= 35 and refused >= 1
    scraped = family.http.get(family.guard_url + "/metrics").text  # the guard's own comparison of every answer
    assert total(scraped, "token_guard_count_checks_total") >= agreed
    assert total(scraped, "token_guard_count_mismatches_total") == 0
    if family.family.tokenize_is_reference:
        assert not tokenize_differ, "\n".join(tokenize_differ)
    else:
        assert tokenize_differ, f"{family.family.name}: /tokenize agreed everywhere; it could serve as a reference"


def test_the_guards_render_answers_are_vllms_token_for_token(family: Served) -> None:
    """Every corpus request on the render route of its endpoint, answered by the guard itself (render.local) and by
    vLLM: the same token ids element for element, and the same answer apart from the request id (random on both
    sides) and the fields docs/llm-d.md lists; or refused by both."""
    differ, equal, refused = [], 0, 0
    for label, path, body in requests(family.family):
        guarded = family.http.post(family.guard_url + path + "/render", json=body)
        direct = family.http.post(family.vllm_url + path + "/render", json=body)
        if guarded.status_code != 200 or direct.status_code != 200:
            if guarded.status_code == direct.status_code == 400:
                refused += 1
            else:
                differ.append(f"{label}: guard {guarded.status_code} {guarded.text[:100]}, vLLM {direct.status_code}")
            continue
        assert guarded.headers.get("x-token-guard-render") == "local", f"{label}: {guarded.headers}"
        ours, theirs = answers(guarded.json()), answers(direct.json())
        if [a["token_ids"] for a in ours] != [a["token_ids"] for a in theirs]:
            differ.append(f"{label}: token ids differ: guard {len(ours[0]['token_ids'])}, vLLM "
                          f"{len(theirs[0]['token_ids'])} tokens")  # fmt: skip
        elif [comparable(a) for a in ours] != [comparable(a) for a in theirs]:
            differ.append(f"{label}: bodies differ: guard {ours[0]}, vLLM {theirs[0]}")
        else:
            equal += 1
    print(f"\nrender parity {family.family.name} vLLM {family.version}: {equal} equal, {refused} refused by both, "
          f"{len(differ)} differ")  # fmt: skip
    assert not differ, "\n".join(differ)
    assert equal >= 35


def test_a_clamp_lands_exactly_on_the_window(family: Served) -> None:
    """vLLM 0.31 refuses prompt + max_tokens over the window: clamped by the guard, the request fits exactly. The
    prompt is sized to leave little room, since random weights write until the limit."""
    probe = " ".join(f"word{i % 50}" for i in range(100))
    sized = family.http.post(family.guard_url + "/v1/chat/completions", json=_chat(probe, 1))
    per_word = (int(sized.headers[GUARD_PROMPT]) - 20) / 100  # about 20 tokens of template around the text
    text = " ".join(f"word{i % 50}" for i in range(int((WINDOW - 60) / per_word)))
    answer = family.http.post(family.guard_url + "/v1/chat/completions", json=_chat(text, WINDOW))
    assert answer.status_code == 200, answer.text
    prompt = int(answer.headers[GUARD_PROMPT])
    assert answer.headers[GUARD_ACTION] == "clamp"
    assert int(answer.headers["x-token-guard-max-tokens"]) == WINDOW - prompt
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] == prompt
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= WINDOW


def total(exposition: str, name: str) -> float:
    """A counter's samples summed over their labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith(name + "{"))


def _chat(text: str, max_tokens: int) -> dict[str, Any]:
    return {"model": runtime.SERVED_NAME, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def unsaid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    with served(UNSAID_MISTRAL, runtime.VERSIONS, tmp_path_factory.mktemp("mistral-unsaid")) as running:
        yield running


@pytest.mark.parametrize("version", runtime.VERSIONS)
def test_a_guard_not_told_of_mistral_mode_refuses_nothing_vllm_serves(unsaid: dict[str, Served], version: str) -> None:
    """vLLM renders with mistral_common; the guard, not told, with its template. Whatever the start-up check decides
    (judged by what generation charges), a count /tokenize cannot make (0.31/0.32 refuse any assistant turn with tool
    calls in mistral mode) is made locally and marked so: the guard forwards every request vLLM itself serves."""
    family = unsaid[version]
    refused, local, served_both = [], 0, 0
    for label, path, body in requests(family.family):
        direct = family.http.post(family.vllm_url + path, json=body)
        guarded = family.http.post(family.guard_url + path, json=body)
        if direct.status_code == 200 and guarded.status_code != 200:
            refused.append(f"{label}: vLLM 200, guard {guarded.status_code} {guarded.text[:160]}")
        served_both += direct.status_code == guarded.status_code == 200
        local += guarded.headers.get("x-token-guard-count-source") == "local"
    print(f"\nmistral mode, guard not told, vLLM {version}: {served_both} served by both, {len(refused)} refused by "
          f"the guard only, {local} counted locally")  # fmt: skip
    assert not refused, "\n".join(refused)
    assert served_both >= 35
