"""`token-guard demo --once` run as a newcomer runs it (a real process, real sockets): it prints nothing that reads
like an error, and every number in the tour agrees with the others and with the arithmetic it explains."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from proxy.demo import WINDOW

TORCH_ADVISORY = "PyTorch was not found"


@dataclass(frozen=True)
class Run:
    stdout: str
    stderr: str


def run(*command: str) -> Run:
    # The switch must come from the command itself, not from this test process (importing proxy here sets it).
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return Run(done.stdout, done.stderr)


@pytest.fixture(scope="module")
def demo() -> Run:
    return run(sys.executable, "-m", "proxy", "demo", "--once", "--port", "0")


def numbers(pattern: str, text: str) -> tuple[int, ...]:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in the demo's output:\n{text}"
    return tuple(int(group) for group in found.groups())


def step(demo: Run, n: int) -> str:
    return demo.stdout.split(f"\n{n}. ", 1)[1].split("\n\n", 1)[0]


def test_the_demo_prints_no_error_looking_line(demo: Run) -> None:
    assert TORCH_ADVISORY not in demo.stdout + demo.stderr
    assert demo.stderr == ""
    assert "Traceback" not in demo.stdout


def test_bench_prints_no_torch_advisory() -> None:
    result = run(sys.executable, "-m", "bench", "--help")  # imports every bench module, transformers included
    assert TORCH_ADVISORY not in result.stdout + result.stderr


def test_step_1_passes_the_prompt_vllm_counts(demo: Run) -> None:
    text = step(demo, 1)
    (prompt,) = numbers(r"A prompt of (\d+) tokens with max_tokens 32", text)
    assert numbers(r"action pass, prompt tokens (\d+), max_tokens (\d+) \(unchanged\)", text) == (prompt, 32)
    assert numbers(r"usage: prompt (\d+) \+ completion (\d+) = (\d+) of (\d+)", text) == (
        prompt,
        32,
        prompt + 32,
        WINDOW,
    )


def test_step_2_explains_the_rejection_and_the_clamp_with_the_same_numbers(demo: Run) -> None:
    text = step(demo, 2)
    prompt, asked, total = numbers(r"A prompt of (\d+) tokens with max_tokens (\d+): \d+ \+ \d+ = (\d+)", text)
    assert total == prompt + asked > WINDOW
    assert "straight to vLLM: HTTP 400" in text
    # vLLM 0.31's own words: it stops counting at window - max_tokens + 1, and the tour says so with those numbers.
    seen, said_total = numbers(r"your prompt contains at least (\d+) input tokens, for a total of at least (\d+)", text)
    assert seen == WINDOW - asked + 1 and said_total == WINDOW + 1
    assert numbers(rf"{WINDOW} - {asked} \+ 1 = (\d+) tokens", text) == (seen,)
    assert f'hence "at least {seen}"' in text
    clamped = WINDOW - prompt
    assert numbers(r"action clamp, prompt tokens (\d+), max_tokens (\d+) -> (\d+) \(= (\d+) - (\d+)\)", text) == (
        prompt,
        asked,
        clamped,
        WINDOW,
        prompt,
    )
    assert numbers(r"usage: prompt (\d+) \+ completion (\d+) = (\d+) of", text) == (prompt, clamped, WINDOW)


def test_step_3_rejects_at_the_door_with_the_counted_prompt(demo: Run) -> None:
    text = step(demo, 3)
    (prompt,) = numbers(r"A prompt of (\d+) tokens with max_tokens 16", text)
    assert prompt > WINDOW
    rejected = r"HTTP 400, action reject, prompt tokens (\d+), max_tokens 16 asked, (\d+) tokens of room"
    assert numbers(rejected, text) == (prompt, 0)
    assert numbers(r"your request has (\d+) input tokens, which leaves (\d+) for the output", text) == (prompt, 0)
    assert "None" not in text
    assert "vLLM received 0 requests for it" in text


def test_step_4_clamps_a_responses_request_vllm_refuses(demo: Run) -> None:
    text = step(demo, 4)
    (asked,) = numbers(r"max_output_tokens (\d+)\.", text)
    assert "straight to vLLM: HTTP 400" in text
    clamped = (r"HTTP 200, action clamp, prompt tokens (\d+), max_output_tokens (\d+) -> (\d+) "
               r"\(= (\d+) - (\d+) - (\d+) kept for the next turn\)")  # fmt: skip
    prompt, said, limit, window, again, kept = numbers(clamped, text)
    assert (said, window, again) == (asked, WINDOW, prompt)
    assert kept == (WINDOW - prompt) // 2 and limit == WINDOW - prompt - kept  # half the room, the default
    assert numbers(r"usage: input (\d+) \+ output (\d+) = (\d+) of", text) == (prompt, limit, prompt + limit)
    assert numbers(r"(\d+) left for its next answer", text) == (kept,)
    assert prompt == numbers(r"A prompt of (\d+) tokens with max_tokens", step(demo, 2))[0]  # the same notes


def test_step_5_clamps_a_claude_code_request(demo: Run) -> None:
    text = step(demo, 5)
    assert "max_completion_tokens=32000 cannot be greater than max_model_len=2048" in text
    clamped = (r"HTTP 200, action clamp, prompt tokens (\d+), max_tokens 32000 -> (\d+) "
               r"\(= (\d+) - (\d+) - (\d+) kept for the next turn\)")  # fmt: skip
    prompt, limit, window, again, kept = numbers(clamped, text)
    assert (window, again) == (WINDOW, prompt)
    assert kept == (WINDOW - prompt) // 2 and limit == WINDOW - prompt - kept  # half the room, the default
    assert numbers(r"usage: input (\d+) \+ output (\d+) = (\d+) of", text) == (prompt, limit, prompt + limit)
    assert numbers(r"(\d+) left for its next answer", text) == (kept,)


def test_step_6_never_cuts_an_embedding_but_counts_the_clients_own_cut(demo: Run) -> None:
    text = step(demo, 6)
    assert "straight to vLLM: HTTP 400" in text and "maximum context length is 2048 tokens" in text
    assert "through token-guard: HTTP 400, action reject" in text
    (prompt,) = numbers(r"with truncate_prompt_tokens -1: HTTP 200, action pass, prompt tokens (\d+)", text)
    (used,) = numbers(r"usage: prompt (\d+) for 2 vectors", text)
    long = numbers(r"A prompt of (\d+) tokens with max_tokens 16", step(demo, 3))[0]
    assert used == prompt and WINDOW < prompt < long + WINDOW  # the long input cut to the window, the short one whole
