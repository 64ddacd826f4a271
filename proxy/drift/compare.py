"""The comparison at the heart of `token-guard doctor`: pure functions over the two sides' counts and windows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OK, MISMATCH, REFUSED = "OK", "MISMATCH", "REFUSED"
SMALLER, UNKNOWN = "SMALLER", "UNKNOWN"


@dataclass(frozen=True)
class Refusal:
    """One side would not count the sample (a template error, an unknown model); the reason is what it said."""

    reason: str


Count = int | Refusal


def verdict(guard: Count, upstream: Count) -> str:
    """OK when both count the same; REFUSED when both refuse (the guard answers 400 where vLLM would); else
    MISMATCH, including one side refusing what the other renders."""
    if isinstance(guard, int) and isinstance(upstream, int):
        return OK if guard == upstream else MISMATCH
    return REFUSED if isinstance(guard, Refusal) and isinstance(upstream, Refusal) else MISMATCH


def window_verdict(guard: int | None, upstream: int | None) -> str:
    """A guard window larger than the upstream's lets through prompts vLLM rejects (MISMATCH); a smaller one only
    clamps earlier than needed, which an operator may want (SMALLER)."""
    if guard is None or upstream is None:
        return UNKNOWN
    return OK if guard == upstream else MISMATCH if guard > upstream else SMALLER


@dataclass(frozen=True)
class Row:
    model: str
    sample: str
    guard: Count
    upstream: Count  # POST /tokenize
    charged: Count | None = None  # usage.prompt_tokens of a 1-token generation: what vLLM really counts

    @property
    def verdict(self) -> str:
        """Judged against what vLLM charges when that is known: /tokenize renders gpt-oss chat with the template
        rather than harmony, and refuses tool conversations in mistral mode, so it is no reference there."""
        return verdict(self.guard, self.charged if self.charged is not None else self.upstream)


@dataclass(frozen=True)
class Window:
    model: str
    guard: int | None
    source: str  # "config" or "discovered"
    upstream: int | None

    @property
    def verdict(self) -> str:
        return window_verdict(self.guard, self.upstream)


def compare(
    model: str,
    samples: Sequence[str],
    guard: Sequence[Count],
    upstream: Sequence[Count],
    charged: Sequence[Count | None] | None = None,
) -> list[Row]:
    charged = charged if charged is not None else [None] * len(samples)
    return [Row(model, *counts) for counts in zip(samples, guard, upstream, charged, strict=True)]


def drift_lines(rows: Sequence[Row]) -> list[str]:
    """One warning line per model whose counts disagree with the upstream's."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        own = [r for r in rows if r.model == model]
        bad = [r for r in own if r.verdict == MISMATCH]
        if bad:
            details = "; ".join(f"{r.sample}: guard {cell(r.guard)}, upstream {cell(_reference(r))}" for r in bad)
            lines.append(
                f"model {model}: the guard's token counts differ from what the upstream counts on {len(bad)} of "
                f"{len(own)} built-in samples ({details}); the tokenizer or chat template has drifted, so clamping "
                "and overflow decisions for this model are off unless the upstream counts them. Run "
                "`token-guard doctor` for details."
            )
    return lines


def _reference(row: Row) -> Count:
    return row.charged if row.charged is not None else row.upstream


def cell(count: Count | None) -> str:
    if count is None:
        return "-"
    return str(count) if isinstance(count, int) else "refused"
