"""The chats `python -m bench tokens` renders: fresh long prompts, agent conversations and small chats, made of the
sentences of the project's manual (prose, tables, code, TOML, JSON) drawn at random per request and led by the
request's own tag, so no two requests share their text and no cache answers one from memory."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Message = dict[str, str]
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n{2,}")
MANUAL = Path(__file__).resolve().parents[1] / "docs"


def sentences(folder: Path = MANUAL) -> list[str]:
    texts = [path.read_text() for path in sorted(folder.glob("*.md"))]
    return [s.strip() for text in texts for s in SENTENCE.split(text) if s.strip()]


@dataclass(frozen=True)
class Shape:
    fresh_tokens: int = 100_000  # one user message
    turns: int = 20  # the conversation's request measured is the one carrying this turn
    turn_tokens: int = 2_500  # a user message (four fifths: a tool's output, a file) and the answer (a fifth)
    small_tokens: int = 200


class Texts:
    """Text of about a given number of tokens (cut at a token boundary of the model's own tokenizer)."""

    def __init__(self, tokenizer_dir: Path, shape: Shape, pool: list[str] | None = None) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        self.backend: Any = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.template: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.shape, self.pool = shape, pool or sentences()
        self._said: dict[tuple[int, int], Message] = {}
        sample = " ".join(self.pool[:3000])
        self.chars_per_token = len(sample) / len(self.backend.encode(sample, add_special_tokens=False).ids)

    def text(self, tag: str, seed: int, tokens: int) -> str:
        rng = random.Random(seed)
        wanted, parts, size = int(tokens * self.chars_per_token * 1.2) + 64, [tag], len(tag)
        while size < wanted:
            parts.append(rng.choice(self.pool))
            size += len(parts[-1]) + 1
        text = " ".join(parts)
        offsets = self.backend.encode(text, add_special_tokens=False).offsets
        return text[: offsets[min(tokens, len(offsets) - 1)][0]].rstrip()

    def fresh(self, i: int) -> list[Message]:
        return [{"role": "user", "content": self.text(f"Fresh prompt {i}.", 10_000 + i, self.shape.fresh_tokens)}]

    def conversation(self, c: int, turn: int) -> list[Message]:
        """Turn `turn` (1-based) of conversation `c`: every earlier user message and answer, then the turn's own."""
        return [self._message(c, j) for j in range(2 * turn - 1)]

    def _message(self, c: int, j: int) -> Message:
        if (c, j) not in self._said:
            tokens = self.shape.turn_tokens // 5 * (1 if j % 2 else 4)
            text = self.text(f"Conversation {c}, message {j}.", 20_000 + 100 * c + j, tokens)
            self._said[c, j] = {"role": ("user", "assistant")[j % 2], "content": text}
        return self._said[c, j]

    def small(self, i: int) -> list[Message]:
        return [{"role": "user", "content": self.text(f"Small chat {i}.", 30_000 + i, self.shape.small_tokens - 12)}]

    def rendered(self, messages: list[Message]) -> str:
        """The prompt text vLLM encodes: the chat template applied, the generation prompt added."""
        text: str = self.template.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text
