"""vLLM's store of Responses (VLLM_ENABLE_RESPONSES_API_STORE=1): each replica keeps the responses it answered, and
the messages it rendered for them, in its own memory, shared with no other replica and checked against no owner
(vLLM 0.31/0.32 responses/serving.py: response_store, msg_store, retrieve_responses, cancel_responses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.simulator.errors import ApiError

CANNOT_CANCEL = "Cannot cancel a synchronous response."


def not_found(response_id: str) -> ApiError:
    return ApiError(f"Response with id '{response_id}' not found.", status=404, type="invalid_request_error",
                    param="response_id")  # fmt: skip


@dataclass
class ResponseStore:
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def history(self, response_id: str) -> list[dict[str, Any]]:
        """What a continuation renders between its instructions and its input (construct_input_messages): the
        stored messages less their system messages, then each text part of the response's output messages."""
        response = self.responses.get(response_id)
        if response is None:
            raise not_found(response_id)
        stored = [m for m in self.messages.get(response_id, []) if m.get("role") != "system"]
        for item in response.get("output") or []:
            if item.get("type") == "message":
                stored += [{"role": "assistant", "content": part["text"]} for part in item.get("content") or []]
        return stored

    def keep(self, messages: list[dict[str, Any]], response: dict[str, Any]) -> None:
        self.messages[response["id"]] = messages
        self.responses[response["id"]] = response

    def retrieve(self, response_id: str) -> dict[str, Any]:
        response = self.responses.get(response_id)
        if response is None:
            raise not_found(response_id)
        return response

    def cancel(self, response_id: str) -> dict[str, Any]:
        response = self.retrieve(response_id)
        if response.get("status") not in ("queued", "in_progress"):
            raise ApiError(CANNOT_CANCEL, param="response_id", type="invalid_request_error")
        return {**response, "status": "cancelled"}
