"""Long prompts of mixed scripts for the overflow policies: sentences in English, Japanese, digits, emoji and code."""

from __future__ import annotations

SENTENCES = ["The river bends east past the mill.", "東京の夜は静かです。", "Numbers: 12345, 678.", "🎉 done!",
             "def f(x):\n    return x * 2", "A quieter line follows here."]  # fmt: skip


def document(tokens_wanted: int) -> str:
    # about 9 tokens per sentence with the DeepSeek tokenizer; exactness is not needed here
    return " ".join(f"[{i}] " + SENTENCES[i % len(SENTENCES)] for i in range(tokens_wanted // 9))
