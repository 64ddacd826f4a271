"""Chat prompts built to an exact token count with the model's own tokenizer and chat template, counted the way
vLLM counts them (render with the template, then encode without special tokens), so `--prompt-tokens P` is the
`prompt_tokens` the server reports.

Every request gets a different prompt of the same length: a tag of single-token words that differs per request
starts each message, so no proxy, cache or server can answer a repeat from memory.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

Message = dict[str, str]

TAG_WORDS = (
    "alpha delta echo golf hotel india kilo lima papa uniform november whiskey red blue green black white brown "
    "gold silver river stone cloud paper table window garden market winter summer orange purple yellow"
).split()
TAG_LENGTH = 5
PAD = " the"  # one token after a word, whatever precedes it

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more out up into do time only "
    "request model token server latency budget window context prompt stream queue cache batch kernel memory "
    "system network client answer question report measure engine scheduler worker thread socket buffer"
).split()
_CODE = (
    "def handle(request):\n    body = await request.json()\n    if body.get('stream'):\n        return stream(body)\n"
    "    return JSONResponse({'id': body['id'], 'tokens': len(body['prompt'])})\n"
)
_JSON = '{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 128, "n": 1}\n'
_CJK = "模型在处理长文本时需要精确计算令牌数量。トークンの数を正しく数えることが大切です。\n"


def filler(seed: int, chars: int) -> str:
    """Deterministic text of about `chars` characters: mostly English prose, some code, JSON, numbers and CJK."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        roll = rng.random()
        if roll < 0.06:
            part = _CODE
        elif roll < 0.10:
            part = _JSON
        elif roll < 0.13:
            part = _CJK
        else:
            words = rng.choices(_WORDS, k=rng.randint(8, 24))
            part = " ".join(words).capitalize() + f" ({rng.randint(1, 9999)})" * (rng.random() < 0.2) + ". "
        parts.append(part)
        size += len(part)
    return "".join(parts)


class PromptCounter:
    """Counts chat prompts exactly as vLLM does, with the tokenizer directory's chat template."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.renderer: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.backend: Any = self.renderer.backend_tokenizer
        self.tag_words = [w for w in TAG_WORDS if self.text_tokens(" " + w) == 1]
        if len(self.tag_words) < 8 or self.text_tokens(PAD) != 1:
            raise ValueError(f"{tokenizer_dir}: too few single-token words to tag prompts")

    def render(self, messages: list[Message]) -> str:
        text: str = self.renderer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text

    def count(self, messages: list[Message]) -> int:
        return self.text_tokens(self.render(messages))

    def text_tokens(self, text: str) -> int:
        return len(self.backend.encode(text, add_special_tokens=False).ids)

    def tag(self, index: int) -> str:
        """`ref w1 w2 w3 w4 w5.` with words unique to `index`: always the same number of tokens, as each word
        is one pre-token of its own (a word right after punctuation would merge with it)."""
        base, words = len(self.tag_words), []
        for _ in range(TAG_LENGTH):
            index, digit = divmod(index, base)
            words.append(self.tag_words[digit])
        return "ref " + " ".join(words) + ".\n"

    def fit(self, messages: list[Message], target: int, seed: int) -> list[Message]:
        """`messages` with filler appended to the last one so the whole prompt is exactly `target` tokens."""
        head, last = messages[:-1], messages[-1]
        base = self.count(messages)
        if base > target:
            raise ValueError(f"the prompt needs {base} tokens before any filler, more than {target}")
        text = filler(seed, 6 * (target - base) + 64)
        offsets = self.backend.encode(text, add_special_tokens=False).offsets
        cut = target - base
        for _ in range(20):
            body = text[: offsets[cut][0]].rstrip() if cut < len(offsets) else text.rstrip()
            candidate = [*head, {**last, "content": last["content"] + body}]
            missing = target - self.count(candidate)
            if missing < 0:
                cut = max(0, cut + missing - 1)
                continue
            padded = [*head, {**last, "content": candidate[-1]["content"] + PAD * missing}]
            if self.count(padded) == target:
                return padded
            cut = max(0, cut - 2)
        raise ValueError(f"could not build a prompt of exactly {target} tokens")


class OneShotPrompts:
    """One user message of exactly `tokens` prompt tokens; `messages(i)` differs for every i."""

    def __init__(self, counter: PromptCounter, tokens: int, seed: int = 1) -> None:
        self.counter, self.tokens = counter, tokens
        tag = counter.tag(0)
        self._body = counter.fit([{"role": "user", "content": tag}], tokens, seed)[-1]["content"][len(tag) :]
        for index in (1, len(counter.tag_words) ** TAG_LENGTH - 1):  # the tag must not change the count
            if counter.count(self.messages(index)) != tokens:
                raise ValueError(f"prompt {index} is not {tokens} tokens long: this tokenizer merges the tag")

    def messages(self, index: int) -> list[Message]:
        return [{"role": "user", "content": self.counter.tag(index) + self._body}]


class Conversation:
    """A conversation of `turns` user turns growing to about `final_tokens`; `turn(i, k)` is the prompt of turn k
    (1-based) of conversation i: every earlier user and assistant message, then the k-th user message."""

    def __init__(self, counter: PromptCounter, turns: int, final_tokens: int, seed: int = 2) -> None:
        self.counter, self.turns = counter, turns
        per_turn = final_tokens // turns
        sizes = (per_turn * 4 // 5, per_turn // 5)  # a user message, then the assistant's answer
        self._bodies = [self._text(seed * 1000 + k, sizes[k % 2]) for k in range(2 * turns - 1)]

    def _text(self, seed: int, tokens: int) -> str:
        text = filler(seed, 8 * tokens + 64)
        offsets = self.counter.backend.encode(text, add_special_tokens=False).offsets
        return text[: offsets[min(tokens, len(offsets) - 1)][0]].rstrip()

    def turn(self, index: int, k: int) -> list[Message]:
        tag = self.counter.tag(index)
        roles = ("user", "assistant")
        return [{"role": roles[j % 2], "content": tag + self._bodies[j]} for j in range(2 * k - 1)]
