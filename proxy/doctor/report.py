"""The check's report: the table printed for people, the JSON for machines, and the verdict that sets the exit
status."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from proxy.counting.registry import GuardedModel
from proxy.doctor.fleet import FleetInfo
from proxy.drift.compare import MISMATCH, Count, Refusal, Row, Window, cell


@dataclass(frozen=True)
class ModelInfo:
    """How the guard counts a model's prompts: the rendering path and the count source, each with its reason."""

    model: str
    rendering: str
    rendering_reason: str
    count_source: str
    source_reason: str
    default_chat_template_kwargs: dict[str, Any]
    processor_notice: str | None = None  # what the guard cannot know about the processor's chat template

    @classmethod
    def of(cls, model: GuardedModel) -> ModelInfo:
        tok = model.tokenizer
        return cls(model.name, tok.rendering.mode, tok.rendering.reason, model.count_source, model.source_reason,
                   dict(tok.default_kwargs), tok.processor_notice)  # fmt: skip

    def lines(self) -> list[str]:
        lines = [f"  {self.model}: chat rendered by {self.rendering}: {self.rendering_reason}"]
        if self.default_chat_template_kwargs:
            lines.append(f"  {self.model}: default_chat_template_kwargs {self.default_chat_template_kwargs}")
        if self.processor_notice:
            lines.append(f"  {self.model}: {self.processor_notice}")
        return [*lines, f"  {self.model}: counted by {self.count_source}: {self.source_reason}"]


@dataclass(frozen=True)
class Report:
    upstream_url: str
    version: str | None
    version_error: str | None
    rows: list[Row]
    windows: list[Window]
    models: list[ModelInfo] = field(default_factory=list)
    fleet: FleetInfo | None = None  # redis.url's Redis, when set

    @property
    def failed(self) -> bool:
        drift = any(r.verdict == MISMATCH for r in self.rows) or any(w.verdict == MISMATCH for w in self.windows)
        return drift or (self.fleet is not None and not self.fleet.reachable)

    def as_dict(self) -> dict[str, Any]:
        return {
            "upstream": {"url": self.upstream_url, "version": self.version, "version_error": self.version_error},
            "models": [asdict(m) for m in self.models],
            "samples": [
                {"model": r.model, "sample": r.sample, **_side("guard", r.guard), **_side("upstream", r.upstream)}
                | _side("charged", r.charged)
                | {"verdict": r.verdict}
                for r in self.rows
            ],
            "max_model_len": [
                {"model": w.model, "guard": w.guard, "source": w.source, "upstream": w.upstream, "verdict": w.verdict}
                for w in self.windows
            ],
            "redis": asdict(self.fleet) if self.fleet else None,
            "ok": not self.failed,
        }

    def table(self) -> str:
        out = [f"upstream {self.upstream_url}, vLLM version {self.version or f'unknown ({self.version_error})'}"]
        out += [self.fleet.line(), ""] if self.fleet else [""]
        if self.models:
            out += ["how each model is counted:", *[line for m in self.models for line in m.lines()], ""]
        samples = [[r.model, r.sample, cell(r.guard), cell(r.upstream), cell(r.charged), r.verdict] for r in self.rows]
        out += _columns(["model", "sample", "guard", "upstream", "charged", "verdict"], samples)
        out.append("  (upstream: POST /tokenize; charged: usage.prompt_tokens of a 1-token generation, the reference)")
        for r in self.rows:
            sides = (("guard", r.guard), ("upstream", r.upstream), ("charged", r.charged))
            refusals = [(side, c) for side, c in sides if isinstance(c, Refusal)]
            out += [f"  {r.model} / {r.sample}: {side} refused: {_short(c.reason)}" for side, c in refusals]
        windows = [[w.model, f"{_opt(w.guard)} ({w.source})", _opt(w.upstream), w.verdict] for w in self.windows]
        out += ["", "max_model_len each side believes:", *_columns(["model", "guard", "upstream", "verdict"], windows)]
        wider = sum(w.verdict == MISMATCH for w in self.windows)
        if wider:
            out.append("  MISMATCH: the guard's window is larger, so prompts it lets through can be rejected upstream")
        return "\n".join([*out, "", self._summary(wider)])

    def _summary(self, wider: int) -> str:
        bad = sum(r.verdict == MISMATCH for r in self.rows)
        models = len({r.model for r in self.rows})
        parts = [f"{bad} of {len(self.rows)} sample counts differ" if bad else f"all {len(self.rows)} samples agree"]
        if wider:
            parts.append(f"{wider} model(s) with a larger max_model_len than the upstream's")
        if self.fleet is not None and not self.fleet.reachable:
            parts.append("Redis unreachable")
        return f"{'FAIL' if self.failed else 'OK'}: {'; '.join(parts)} ({models} model(s) checked)"


def _opt(value: int | None) -> str:
    return "?" if value is None else str(value)


def _short(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _side(name: str, count: Count | None) -> dict[str, Any]:
    if count is None:
        return {name: None, f"{name}_error": None}
    if isinstance(count, int):
        return {name: count, f"{name}_error": None}
    return {name: None, f"{name}_error": count.reason}


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    numeric = {i for i, h in enumerate(header) if h in ("guard", "upstream", "charged")}
    return [
        "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]
