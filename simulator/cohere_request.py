"""The body of Cohere's `POST /v2/embed` as vLLM 0.31 / 0.32 read it: its request models (`pooling/embed/protocol.py`:
`CohereEmbedRequest`, `CohereEmbedInput`, `CohereEmbedContent`) with pydantic's lax types and errors, and the user
messages its io_processor builds of images and inputs. The simulator's own reading, apart from the guard's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from simulator.wire import Fields

Truncate = Literal["NONE", "START", "END"]
TRUNCATIONS: tuple[Truncate, ...] = ("NONE", "START", "END")
ONE_SOURCE = "Value error, Exactly one of texts, images, or inputs must be provided, and it must be non-empty"


@dataclass(frozen=True)
class EmbedRequest:
    model: str | None
    input_type: str | None
    texts: list[str]
    conversations: list[list[dict[str, Any]]]  # images and inputs: one user message each
    truncate: Truncate
    max_tokens: int | None

    @property
    def keep(self) -> int | None:
        """The truncate_prompt_tokens each prompt gets (`_resolve_cohere_truncation`): none under NONE, else
        max_tokens, else -1 (the window)."""
        if self.truncate == "NONE":
            return None
        return -1 if self.max_tokens is None else self.max_tokens


def read_embed_request(body: Any) -> EmbedRequest:
    """The request, or the 400 of every field pydantic would refuse, then of the model's own validator."""
    fields = Fields(body)
    model, input_type = fields.str_or_none("model"), fields.str_or_none("input_type")
    texts, images = _strings(fields, "texts"), _strings(fields, "images")
    inputs = _inputs(fields)
    truncate: Truncate = "END"
    if fields.has("truncate") and fields.raw("truncate") not in TRUNCATIONS:
        fields.invalid(
            "body.truncate", "literal_error", "Input should be 'NONE', 'START' or 'END'", fields.raw("truncate")
        )
    elif fields.has("truncate"):
        truncate = TRUNCATIONS[TRUNCATIONS.index(fields.raw("truncate"))]
    max_tokens = fields.int_or_none("max_tokens")
    fields.int_or_none("output_dimension")
    fields.integer("priority", 0)
    fields.check()
    sources = [source for source in (texts, images, inputs) if source is not None]
    if len(sources) != 1 or not sources[0]:
        fields.invalid("body", "value_error", ONE_SOURCE, body)
        fields.check()
    pictures = [[{"type": "image_url", "image_url": {"url": url}}] for url in images or []]
    conversations = [[{"role": "user", "content": parts}] for parts in (inputs or pictures)]
    return EmbedRequest(model, input_type, texts or [], conversations, truncate, max_tokens)


def _strings(fields: Fields, name: str) -> list[str] | None:
    values = fields.list_or_none(name)
    for i, value in enumerate(values or []):
        if not isinstance(value, str):
            fields.invalid(f"body.{name}.{i}", "string_type", "Input should be a valid string", value)
    return values


def _inputs(fields: Fields) -> list[list[dict[str, Any]]] | None:
    """Each CohereEmbedInput's content as the user message's parts (`_mixed_input_to_messages`)."""
    items = fields.list_or_none("inputs")
    if items is None:
        return None
    read = []
    for i, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            fields.invalid(f"body.inputs.{i}.content", "list_type", "Input should be a valid list", content)
            continue
        read.append([part for j, raw in enumerate(content) if (part := _part(fields, f"body.inputs.{i}.content.{j}",
                                                                              raw))])  # fmt: skip
    return read


def _part(fields: Fields, loc: str, part: Any) -> dict[str, Any] | None:
    """CohereEmbedContent (its validator: type text needs `text`, type image_url a non-empty `image_url.url`), as
    `_mixed_input_to_messages` writes it into the message."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in ("text", "image_url"):
        fields.invalid(f"{loc}.type", "literal_error", "Input should be 'text' or 'image_url'", kind)
        return None
    text, image = part.get("text"), part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else None
    if kind == "text" and isinstance(text, str):
        return {"type": kind, "text": text}
    if kind == "image_url" and isinstance(url, str) and url:
        return {"type": kind, "image_url": {"url": url}}
    needs = "text" if kind == "text" else "image_url.url"
    fields.invalid(loc, "value_error", f"Value error, CohereEmbedContent with type='{kind}' requires {needs}", part)
    return None
