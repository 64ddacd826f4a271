"""Response bodies and stream events, key for key as vLLM 0.31/0.32 serialise them (docs/vllm-wire-contract.md,
sections 6 and 7).

Non-stream bodies are pydantic `model_dump()` (every key, nulls included, but for the fields 0.34 excludes while
null). Events are `model_dump_json(
exclude_unset=True)`, so each one carries exactly the keys vLLM's code sets; usage events also drop nulls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from simulator.generation import Generation, Sequence, Token

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage(prompt: int, completion: int, omit_null_details: bool = False) -> dict[str, Any]:
    """UsageInfo's dump; 0.34 leaves prompt_tokens_details out while it is null (exclude_if)."""
    spent: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
    spent["completion_tokens"] = completion
    if not omit_null_details:
        spent["prompt_tokens_details"] = None
    spent["completion_tokens_details"] = None
    return spent


def short_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


@dataclass(frozen=True)
class Output:
    sequence: Sequence
    token_ids: list[int]
    text: str


@dataclass(frozen=True)
class Wire:
    """Builds one response's bodies and events; `fingerprint` is the server's system_fingerprint; with
    `omits_null_details` (0.34) a null usage.prompt_tokens_details and message.annotations are left out; with
    `transfer_params` (0.33) chat and completions token events carry weight_versions and kv_transfer_params."""

    generation: Generation
    fingerprint: str
    omits_null_details: bool = False
    transfer_params: bool = False  # 0.33+: stream token events end with kv_transfer_params (profiles.py)

    def _head(self, obj: str) -> dict[str, Any]:
        g = self.generation
        return {"id": g.response_id, "object": obj, "created": g.created, "model": g.model}

    # --- non-stream bodies ---

    def chat_body(self, outputs: list[Output]) -> dict[str, Any]:
        g = self.generation
        choices = [
            {
                "index": o.sequence.index,
                "message": self._message(o),
                "logprobs": None,
                "finish_reason": o.sequence.finish_reason,
                "stop_reason": o.sequence.stop_reason,
                "token_ids": o.token_ids if g.return_token_ids else None,
                "routed_experts": None,
            }
            for o in outputs
        ]
        prompt_ids = g.prompts[0].token_ids if len(g.prompts) == 1 and g.return_token_ids else None
        body = self._head("chat.completion")
        body.update(choices=choices, service_tier=None, system_fingerprint=self.fingerprint)
        prompt_tokens = sum(len(p.token_ids) for p in g.prompts)  # a batch's usage sums its conversations
        body["usage"] = usage(prompt_tokens, sum(len(o.token_ids) for o in outputs), self.omits_null_details)
        body.update(prompt_logprobs=None, prompt_token_ids=prompt_ids)
        body.update(prompt_text=None, kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return body

    def _message(self, output: Output) -> dict[str, Any]:
        g = self.generation
        content = (g.chat_echo or "") + ("" if g.tool_call else output.text)
        role = g.roles[output.sequence.prompt] if g.roles else g.role
        message: dict[str, Any] = {"role": role, "content": content, "refusal": None}
        if not self.omits_null_details:
            message["annotations"] = None
        message.update(audio=None, function_call=None)
        if g.tool_call:  # an empty tool_calls list is left out (0.24+)
            function = {"name": g.tool_call.name, "arguments": output.text}
            call_id = g.tool_call.ids[output.sequence.index]
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
        message["reasoning"] = None
        return message

    def completion_body(self, outputs: list[Output]) -> dict[str, Any]:
        g = self.generation
        choices = []
        for o in outputs:
            prompt = g.prompts[o.sequence.prompt]
            choices.append(
                {
                    "index": o.sequence.index,
                    "text": self._completion_text(o.sequence, o.text, first=True),
                    "logprobs": None,
                    "finish_reason": o.sequence.finish_reason,
                    "stop_reason": o.sequence.stop_reason,
                    "token_ids": o.token_ids if g.return_token_ids else None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt.token_ids if g.return_token_ids else None,
                    "routed_experts": None,
                }
            )
        prompt_tokens = sum(len(p.token_ids) for p in g.prompts)
        body = self._head("text_completion")
        body.update(choices=choices, service_tier=None, system_fingerprint=self.fingerprint)
        body["usage"] = usage(prompt_tokens, sum(len(o.token_ids) for o in outputs), self.omits_null_details)
        body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return body

    def _completion_text(self, sequence: Sequence, text: str, first: bool) -> str:
        prompt = self.generation.prompts[sequence.prompt]
        if prompt.echo_text is None or not first:
            return text
        echo = "" if self.generation.return_token_ids else prompt.echo_text
        return echo if prompt.echo_only else echo + text

    # --- chat stream events ---

    def chat_role_event(self, index: int) -> str:
        g = self.generation
        event = self._head("chat.completion.chunk")
        choice = {"index": index, "delta": {"role": g.role, "content": ""}, "logprobs": None, "finish_reason": None}
        event["choices"] = [choice]
        if g.continuous_usage:
            event["usage"] = {**short_usage(len(g.prompts[0].token_ids), 0), "completion_tokens_details": None}
        event["prompt_token_ids"] = g.prompts[0].token_ids if g.return_token_ids else None
        event["prompt_text"] = None
        return sse(event)

    def chat_echo_event(self, index: int) -> str:
        g = self.generation
        event = self._head("chat.completion.chunk")
        delta = {"content": g.chat_echo}
        event["choices"] = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]
        if g.continuous_usage:
            event["usage"] = {**short_usage(len(g.prompts[0].token_ids), 0), "completion_tokens_details": None}
        return sse(event)

    def chat_token_event(self, token: Token, generated: int) -> str:
        g = self.generation
        choice: dict[str, Any] = {"index": token.sequence.index, "delta": self._delta(token), "logprobs": None}
        choice["finish_reason"] = token.sequence.finish_reason if token.last else None
        if token.last:
            choice["stop_reason"] = token.sequence.stop_reason
        choice["token_ids"] = [token.token_id] if g.return_token_ids else None
        if token.last and self.transfer_params:
            choice["weight_versions"] = None
        event = self._head("chat.completion.chunk")
        event["choices"] = [choice]
        if g.continuous_usage:
            prompt = len(g.prompts[0].token_ids)
            event["usage"] = {**short_usage(prompt, generated), "completion_tokens_details": None}
        if token.last and not g.include_usage:
            event["system_fingerprint"] = self.fingerprint
        if self.transfer_params:
            event["kv_transfer_params"] = None
        return sse(event)

    def _delta(self, token: Token) -> dict[str, Any]:
        tool = self.generation.tool_call
        if tool is None:
            return {"content": token.text}
        index = token.sequence.index
        if token.position > 0:
            return {"tool_calls": [{"index": index, "function": {"arguments": token.text}}]}
        function = {"name": tool.name, "arguments": token.text}
        return {"tool_calls": [{"id": tool.ids[index], "type": "function", "index": index, "function": function}]}

    # --- completion stream events ---

    def completion_token_event(self, token: Token, generated: int) -> str:
        g = self.generation
        prompt = g.prompts[token.sequence.prompt]
        first = token.position == 0
        # vLLM returns the prompt ids on a choice's first event when asked to, and always under echo.
        with_prompt = first and (g.return_token_ids or prompt.echo_text is not None)
        choice = {
            "index": token.sequence.index,
            "text": self._completion_text(token.sequence, token.text, first),
            "logprobs": None,
            "finish_reason": token.sequence.finish_reason if token.last else None,
            "stop_reason": token.sequence.stop_reason if token.last else None,
            "prompt_token_ids": prompt.token_ids if with_prompt else None,
            "token_ids": [token.token_id] if g.return_token_ids else None,
        }
        if self.transfer_params:
            choice["weight_versions"] = None
        event = self._head("text_completion")
        event["choices"] = [choice]
        if g.continuous_usage:
            event["usage"] = short_usage(len(prompt.token_ids), generated)
        if token.last and not g.include_usage:
            event["system_fingerprint"] = self.fingerprint
        if self.transfer_params:
            event["kv_transfer_params"] = None
        return sse(event)

    # --- shared ---

    def usage_event(self, prompt_tokens: int, completion_tokens: int) -> str:
        obj = "chat.completion.chunk" if self.generation.endpoint == "chat" else "text_completion"
        event = self._head(obj)
        event.update(choices=[], usage=short_usage(prompt_tokens, completion_tokens))
        event["system_fingerprint"] = self.fingerprint
        return sse(event)
