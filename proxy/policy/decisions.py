"""The Decisions recipe (`POST /v1/decisions`, vLLM 0.33 and later): one engine request per question, each the
question's prompt rendered as a chat user turn (thinking off, the generation prompt) plus one output token.

    count    each question's prompt, in order, as vLLM renders it; the first that leaves no room for its one token
             refuses the call, as vLLM's renderer (over the window) or engine (at the window) refuses it
    admit    the call's fan-out: the sum over questions of (prompt + 1), against the KV budget and the key's tokens;
             one request of the key's requests quota, as a completions batch or n > 1 is one call
    settle   from the answer's usage (input_tokens, output_tokens: Responses' names), as every endpoint settles

The guard neither clamps nor cuts anything here: the output is one token per question, and the input is each
question's state. Only the next-token models' reads are counted (vLLM's NextTokenStrategy: Qwen3, Qwen3.5, Gemma 4);
`joint` is refused as vLLM refuses it for them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.chat import chat_request
from proxy.api.decisions import DecisionRequest, check_serving, decision_request
from proxy.counting.registry import GuardedModel
from proxy.errors import ContextLengthExceeded, RequestTooLarge
from proxy.policy.decide import Action, Limits
from proxy.policy.outcome import Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.size import refuse_by_size
from proxy.policy.steps import Steps
from proxy.settings import Overflow

PARAM = "input"
THINKING_OFF = {"enable_thinking": False}  # strategies.ReadPromptRequest: thinking off unless the request enables it
WHY_NOT = "The {} policy was not applied: a decision reads each question with the whole input, which is not cut here."


async def decisions(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    req = decision_request(body)
    model, policy, choice, limits = steps.target(req.model, headers, findings)
    asked = Overflow.CHUNK if findings.chunk_refused else choice  # what the policy or the client asked for
    findings.chunk_refused = False  # said below: nothing is cut or split here, on either front end
    check_serving(req)
    outcome = await refuse_by_size(model, [[req.text]], limits, Overflow.REJECT, policy, PARAM, findings)
    if outcome is None:
        outcome = await _counted(steps, model, req, raw, limits, findings)
    if isinstance(outcome, Refuse) and isinstance(outcome.error, ContextLengthExceeded) and asked != Overflow.REJECT:
        error = ContextLengthExceeded(f"{outcome.error.message} {WHY_NOT.format(asked)}", param=PARAM)
        outcome = replace(outcome, error=error)
    return outcome


async def _counted(
    steps: Steps, model: GuardedModel, req: DecisionRequest, raw: bytes, limits: Limits, findings: Findings
) -> Outcome:
    """Each question's prompt counted in order, as vLLM renders them; the first that leaves no room refuses the call."""
    counts: list[int] = []
    for i, prompt in enumerate(req.prompts()):
        chat = chat_request({"model": model.name, "messages": [{"role": "user", "content": prompt}],
                             "chat_template_kwargs": THINKING_OFF})  # fmt: skip
        count = await steps.count(model, chat, findings)
        counts.append(count)
        if count + 1 > limits.max_model_len:
            return _refused(_too_long(count, limits.max_model_len, i), counts, findings)
    return decide_decisions(req, raw, counts, limits, findings)


def decide_decisions(
    req: DecisionRequest, raw: bytes, counts: list[int], limits: Limits, findings: Findings
) -> Outcome:  # fmt: skip
    """The call forwarded as sent, holding its fan-out's cost: every question's prompt and its one token."""
    cost = sum(counts) + len(counts)
    if limits.max_cost is not None and cost > limits.max_cost:
        return _refused(_over_budget(cost, len(counts), limits.max_cost), counts, findings)
    return Forward(raw, Decision(Action.PASS, sum(counts), len(counts), count_source=findings.count_source), cost)


def _refused(error: ContextLengthExceeded | RequestTooLarge, counts: list[int], findings: Findings) -> Refuse:
    return Refuse(error, Decision(Action.REJECT, sum(counts), count_source=findings.count_source))


def _too_long(count: int, window: int, index: int) -> ContextLengthExceeded:
    """vLLM's words: the renderer's for a prompt over the window, the engine's for one that fills it."""
    which = f" (questions[{index}])"
    if count > window:
        return ContextLengthExceeded(
            f"This model's maximum context length is {window} tokens. However, your prompt contains {count} input "
            f"tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
            f"prompt.{which}",
            param=PARAM,
        )
    return ContextLengthExceeded(
        f"The decoder prompt (length {count}) plus the number of requested output tokens (at least 1) is longer than "
        f"the maximum model length of {window}. Make sure that `max_model_len` is no smaller than the number of text "
        f"tokens (prompt + requested output tokens).{which}",
        param=PARAM,
    )


def _over_budget(cost: int, questions: int, budget: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"This request needs {cost} tokens of KV cache (each of its {questions} questions' prompt and 1 output "
        f"token), more than the upstream's whole admission budget of {budget} tokens (admission.max_inflight_tokens):"
        " it could never be admitted. Send fewer questions or a shorter input.",
        param="questions",
    )
