"""What `GET /v1/models` says about each model the upstream serves: its id, max_model_len, root and parent."""

from __future__ import annotations

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
