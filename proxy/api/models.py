"""What `GET /v1/models` says about each model the upstream serves: its id, max_model_len, root and parent."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelCard:
    id: str
    max_model_len: int | None
    root: str | None
    parent: str | None


def parse_models(payload: object) -> list[ModelCard]:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("GET /v1/models did not answer an object with a 'data' list")
    cards = []
    for item in data:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            length = item.get("max_model_len")
            cards.append(
                ModelCard(
                    id=item["id"],
                    max_model_len=length if isinstance(length, int) and not isinstance(length, bool) else None,
                    root=item.get("root") if isinstance(item.get("root"), str) else None,
                    parent=item.get("parent") if isinstance(item.get("parent"), str) else None,
                )
            )
    return cards


def only_models(raw: bytes, allowed: Collection[str]) -> bytes | None:
    """A `GET /v1/models` answer with only the models in `allowed` (an API key's own, as OpenAI lists them); None
    when it is not a model list."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return None
    kept = [m for m in payload["data"] if isinstance(m, dict) and m.get("id") in allowed]
    return json.dumps({**payload, "data": kept}, ensure_ascii=False, separators=(",", ":")).encode()
