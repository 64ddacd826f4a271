"""Which renderer vLLM uses for a model's chat, decided from the model's files as vLLM decides it (0.31/0.32):

- `harmony` when config.json says `model_type: gpt_oss` (`OnlineRenderer`: gpt-oss chat goes through
  openai_harmony whatever the tokenizer mode);
- `mistral` when `tokenizer_mode` is mistral, or when it is auto and the directory holds a
  `consolidated*.safetensors` file and a `tekken.json` or `tokenizer.model.v*` (`tekken.json` alone is not enough);
- `hf` otherwise: the Hugging Face tokenizer and its chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

RenderMode = Literal["hf", "mistral", "harmony"]
TOKENIZER_MODES = ("auto", "hf", "mistral")


@dataclass(frozen=True)
class Rendering:
    mode: RenderMode
    reason: str


def resolve_mode(directory: Path | None, tokenizer_mode: str = "auto") -> Rendering:
    if directory is not None and _model_type(directory) == "gpt_oss":
        return Rendering("harmony", "config.json has model_type gpt_oss: vLLM renders its chat with openai_harmony")
    if tokenizer_mode == "mistral":
        return Rendering("mistral", "tokenizer_mode mistral (configured): mistral_common renders chat to token ids")
    if tokenizer_mode == "auto" and directory is not None and _mistral_repo(directory):
        return Rendering("mistral", "tokenizer_mode auto found consolidated*.safetensors with a Mistral tokenizer "
                                    "file, as vLLM does: mistral_common renders chat")  # fmt: skip
    why = "configured" if tokenizer_mode == "hf" else "auto: no Mistral-format weights, not gpt-oss"
    return Rendering("hf", f"tokenizer_mode hf ({why}): the Hugging Face tokenizer and chat template")


def _model_type(directory: Path) -> str | None:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = config.get("model_type") if isinstance(config, dict) else None
    return kind if isinstance(kind, str) else None


def _mistral_repo(directory: Path) -> bool:
    has_weights = any(directory.glob("consolidated*.safetensors"))
    has_tokenizer = (directory / "tekken.json").is_file() or any(directory.glob("tokenizer.model.v*"))
    return has_weights and has_tokenizer
