"""The Cohere embed request (`POST /v2/embed`) as the guard reads it: its texts, or its images and mixed inputs as the
conversations vLLM renders them, and how vLLM cuts them. Every other field stays in `body` untouched.

vLLM 0.31 / 0.32 (`pooling/embed/protocol.py` `CohereEmbedRequest`, `pooling/embed/io_processor.py`): exactly one of
`texts`, `images` and `inputs`, non-empty. Texts are embedded as completion-style inputs (special tokens added, as
/v1/embeddings does); each image, and each input (a `content` list of text and image_url parts), is one user message
rendered through the chat template with the pooling defaults (no generation prompt). `input_type` puts the model's
own instruction for it in front (from the model's configuration, which the guard does not read). `truncate`: END
(the default) keeps each prompt's first `max_tokens` tokens (the window when absent), START its last ones, NONE cuts
nothing, and with `max_tokens` vLLM refuses, once it has embedded them, the inputs longer than it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy.api.body import count_field, kind_of, model_name, optional
from proxy.errors import InvalidRequest

Truncate = Literal["NONE", "START", "END"]
TRUNCATIONS: tuple[Truncate, ...] = ("NONE", "START", "END")
SOURCES = ("texts", "images", "inputs")
ONE_SOURCE = "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"  # vLLM's words


@dataclass(frozen=True)
class CohereEmbedRequest:
    body: dict[str, Any]
    model: str | None
    param: str  # the field holding the inputs: texts, images or inputs
    texts: list[str]
    conversations: list[list[dict[str, Any]]]  # images and inputs, one user message each
    truncate: Truncate
    max_tokens: int | None
    input_type: str | None

    @property
    def keep(self) -> int | None:
        """The truncate_prompt_tokens vLLM gives each prompt: None (NONE), else max_tokens, else -1 (the window)."""
        if self.truncate == "NONE":
            return None
        return self.max_tokens if self.max_tokens is not None else -1


def cohere_embed_request(body: dict[str, Any]) -> CohereEmbedRequest:
    given = [name for name in SOURCES if body.get(name) is not None]
    if len(given) != 1 or not isinstance(body[given[0]], list) or not body[given[0]]:
        raise InvalidRequest(f"{ONE_SOURCE}.", param=given[0] if len(given) == 1 else "texts")
    param = given[0]
    truncate = body.get("truncate", "END")
    if truncate not in TRUNCATIONS:
        raise InvalidRequest(f"'truncate' must be one of NONE, START or END, got {truncate!r}.", param="truncate")
    return CohereEmbedRequest(
        body=body, model=model_name(body), param=param,
        texts=_strings(body, "texts") if param == "texts" else [],
        conversations=_images(body) if param == "images" else _inputs(body) if param == "inputs" else [],
        truncate=truncate, max_tokens=count_field(body, "max_tokens"),
        input_type=optional(body, "input_type", str, "a string"),
    )  # fmt: skip


def _strings(body: dict[str, Any], key: str) -> list[str]:
    values = body[key]
    bad = next((v for v in values if not isinstance(v, str)), None)
    if bad is not None:
        raise InvalidRequest(f"'{key}' must be an array of strings, got {kind_of(bad)} in it.", param=key)
    return list(values)


def _images(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [_user([{"type": "image_url", "image_url": {"url": url}}]) for url in _strings(body, "images")]


def _inputs(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    conversations = []
    for i, item in enumerate(body["inputs"]):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            raise InvalidRequest(f"inputs[{i}] must be an object with a 'content' array.", param="inputs")
        conversations.append(_user([_part(part, i) for part in content]))
    return conversations


def _part(part: Any, index: int) -> dict[str, Any]:
    """A content part as vLLM rebuilds it: text, or an image_url with its url."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    image = part.get("image_url") if kind == "image_url" else None
    if isinstance(image, dict) and isinstance(image.get("url"), str) and image["url"]:
        return {"type": "image_url", "image_url": {"url": image["url"]}}
    raise InvalidRequest(f"inputs[{index}] holds a content part that is neither {{type: text, text}} nor "
                         "{type: image_url, image_url: {url}}.", param="inputs")  # fmt: skip


def _user(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]
