"""`token-guard check`, a doctor for drift: count sample requests with the guard's own tokenizer and chat template and
with the upstream's `POST /tokenize`, and report every disagreement, the context window each side believes and the
upstream's version. `drift_warnings()` runs the same comparison once at `serve` start-up.

A tokenizer or template that drifted (a vLLM upgrade, a model re-uploaded with a fixed template) makes every clamp
and overflow decision wrong by the size of the difference, silently; this is how it becomes visible.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.api.models import ModelCard
from proxy.check.samples import BUILTIN_SAMPLES, Sample, SamplesError, load_samples
from proxy.counting.conversation import template_inputs
from proxy.counting.count import count_chat, count_completion
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.errors import GuardError, InvalidRequest, UpstreamUnavailable
from proxy.server.relay import translate
from proxy.settings import Settings
from proxy.upstream.client import Upstream
from proxy.upstream.discovery import discover

OK, MISMATCH, REFUSED = "OK", "MISMATCH", "REFUSED"
SMALLER, UNKNOWN = "SMALLER", "UNKNOWN"
# Fields of a chat request that /tokenize accepts and that change the rendered prompt (wire contract, section 5).
CHAT_TOKENIZE_FIELDS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
)
JSON_HEADERS = {"content-type": "application/json"}


class CheckError(Exception):
    """The check could not run at all (exit 2): the upstream is unreachable, or there is no model to check."""


@dataclass(frozen=True)
class Refusal:
    """One side would not count the sample (a template error, an unknown model); the reason is what it said."""

    reason: str


Count = int | Refusal


# --- the comparison: pure functions over counts ---


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
    upstream: Count

    @property
    def verdict(self) -> str:
        return verdict(self.guard, self.upstream)


@dataclass(frozen=True)
class Window:
    model: str
    guard: int | None
    source: str  # "config" or "discovered"
    upstream: int | None

    @property
    def verdict(self) -> str:
        return window_verdict(self.guard, self.upstream)


def compare(model: str, samples: Sequence[str], guard: Sequence[Count], upstream: Sequence[Count]) -> list[Row]:
    return [Row(model, *counts) for counts in zip(samples, guard, upstream, strict=True)]


def drift_lines(rows: Sequence[Row]) -> list[str]:
    """One warning line per model whose counts disagree with the upstream's."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        own = [r for r in rows if r.model == model]
        bad = [r for r in own if r.verdict == MISMATCH]
        if bad:
            details = "; ".join(f"{r.sample}: guard {_cell(r.guard)}, upstream {_cell(r.upstream)}" for r in bad)
            lines.append(
                f"model {model}: the guard's token counts differ from the upstream's POST /tokenize on {len(bad)} of "
                f"{len(own)} built-in samples ({details}); the tokenizer or chat template has drifted, so clamping "
                "and overflow decisions for this model are off. Run `token-guard check` for details."
            )
    return lines


@dataclass(frozen=True)
class Report:
    upstream_url: str
    version: str | None
    version_error: str | None
    rows: list[Row]
    windows: list[Window]

    @property
    def failed(self) -> bool:
        return any(r.verdict == MISMATCH for r in self.rows) or any(w.verdict == MISMATCH for w in self.windows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "upstream": {"url": self.upstream_url, "version": self.version, "version_error": self.version_error},
            "samples": [
                {"model": r.model, "sample": r.sample, **_side("guard", r.guard), **_side("upstream", r.upstream)}
                | {"verdict": r.verdict}
                for r in self.rows
            ],
            "max_model_len": [
                {"model": w.model, "guard": w.guard, "source": w.source, "upstream": w.upstream, "verdict": w.verdict}
                for w in self.windows
            ],
            "ok": not self.failed,
        }

    def table(self) -> str:
        out = [f"upstream {self.upstream_url}, vLLM version {self.version or f'unknown ({self.version_error})'}", ""]
        samples = [[r.model, r.sample, _cell(r.guard), _cell(r.upstream), r.verdict] for r in self.rows]
        out += _columns(["model", "sample", "guard", "upstream", "verdict"], samples)
        for r in self.rows:
            refusals = [
                (side, c) for side, c in (("guard", r.guard), ("upstream", r.upstream)) if isinstance(c, Refusal)
            ]
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
        return f"{'FAIL' if self.failed else 'OK'}: {'; '.join(parts)} ({models} model(s) checked)"


def _cell(count: Count) -> str:
    return str(count) if isinstance(count, int) else "refused"


def _opt(value: int | None) -> str:
    return "?" if value is None else str(value)


def _short(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _side(name: str, count: Count) -> dict[str, Any]:
    if isinstance(count, int):
        return {name: count, f"{name}_error": None}
    return {name: None, f"{name}_error": count.reason}


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    numeric = {i for i, h in enumerate(header) if h in ("guard", "upstream")}
    return [
        "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


# --- counting on both sides ---


async def guard_count(model: GuardedModel, sample: Sample) -> Count:
    raw = json.dumps(sample.body).encode()
    try:
        if sample.kind == "chat":
            return await count_chat(model.tokenizer, parse_chat(raw), model.counter)
        (count,) = await count_completion(model.tokenizer, parse_completion(raw), model.counter)
        return count
    except InvalidRequest as exc:
        return Refusal(exc.message)


def tokenize_body(model: str, sample: Sample) -> dict[str, Any]:
    """The /tokenize request that renders what the chat or completions endpoint would. /tokenize has no `documents`
    or `reasoning_effort` fields, so the template inputs travel as chat_template_kwargs, as vLLM's chat path hands
    them to the template."""
    body = sample.body
    if sample.kind == "completion":
        extra = {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
        return {"model": model, "prompt": body["prompt"], **extra}
    fields = {key: body[key] for key in CHAT_TOKENIZE_FIELDS if body.get(key) is not None}
    kwargs = template_inputs(body, body.get("chat_template_kwargs") or {})
    return {"model": model, **fields, **({"chat_template_kwargs": kwargs} if kwargs else {})}


def tokenize_result(status: int, raw: bytes) -> Count:
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if status == 200 and isinstance(payload, dict) and isinstance(payload.get("count"), int):
        return int(payload["count"])
    return Refusal(f"{status} {_error_message(payload, raw)}")


def _error_message(payload: Any, raw: bytes) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        messages = (
            error.get("message") if isinstance(error, dict) else error,
            payload.get("message"),
            payload.get("detail"),
        )
        for message in messages:
            if isinstance(message, str):
                return message
    return raw.decode(errors="replace")[:200]


async def upstream_count(upstream: Upstream, model: str, sample: Sample) -> Count:
    """The upstream's count; raises GuardError when it cannot be asked at all (unreachable, no /tokenize)."""
    body = json.dumps(tokenize_body(model, sample)).encode()
    response = (await upstream.open("POST", "/tokenize", "", JSON_HEADERS, body)).response
    try:
        raw = await response.aread()
    except httpx.HTTPError as exc:
        raise translate(exc, upstream.url) from None
    finally:
        await response.aclose()
    if response.status_code == 404 and raw.strip() == b'{"detail":"Not Found"}':
        raise UpstreamUnavailable(f"The upstream at {upstream.url} has no POST /tokenize to compare counts with.")
    return tokenize_result(response.status_code, raw)


async def count_both(model: GuardedModel, samples: Sequence[Sample], upstream: Upstream) -> list[Row]:
    guard = [await guard_count(model, s) for s in samples]
    theirs = [await upstream_count(upstream, model.name, s) for s in samples]
    return compare(model.name, [s.name for s in samples], guard, theirs)


async def drift_warnings(settings: Settings, registry: ModelRegistry, upstream: Upstream) -> list[str]:
    """The built-in samples for every guarded model, as warning lines (none when all agree). Never raises: start-up
    goes on whatever happens, and a check that could not run is itself a warning line."""
    try:
        rows = []
        for name in registry.names:
            rows += await count_both(registry.resolve(name), BUILTIN_SAMPLES, upstream)
    except GuardError as exc:
        return [f"drift check against {upstream.url} could not run: {exc.message}"]
    except Exception as exc:  # a warning must never stop the proxy from serving
        return [f"drift check against {upstream.url} failed unexpectedly: {exc!r}"]
    return drift_lines(rows)


# --- the command ---


async def check(settings: Settings, samples: Sequence[Sample], wait_s: float) -> Report:
    registry = ModelRegistry.from_settings(settings.models, settings.counting)
    upstream = Upstream(settings.upstream)
    try:
        cards = await _discover(upstream, wait_s, settings.upstream.connect_timeout_s)
        registry.apply_discovery(cards)
        if not registry.names:
            raise CheckError(
                "no model to check: configure one (--model and --tokenizer), or share the model volume so the roots "
                f"the upstream reports ({_roots(cards)}) are readable here"
            )
        models = [registry.resolve(name) for name in registry.names]
        rows = [row for model in models for row in await count_both(model, samples, upstream)]
        windows = [_window(model, cards) for model in models]
        version, version_error = await _version(upstream)
    except GuardError as exc:
        raise CheckError(exc.message) from None
    finally:
        await upstream.aclose()
    return Report(upstream.url, version, version_error, rows, windows)


async def _discover(upstream: Upstream, wait_s: float, connect_timeout_s: float) -> list[ModelCard]:
    try:
        async with asyncio.timeout(wait_s + connect_timeout_s):  # one slow attempt must not outlast --wait
            return await discover(upstream, wait_s, retry_s=1.0)
    except (GuardError, TimeoutError) as exc:
        last = exc.__cause__ if isinstance(exc.__cause__, GuardError | ValueError) else exc
        reason = last.message if isinstance(last, GuardError) else str(last) or "no answer to GET /v1/models"
        raise CheckError(f"cannot reach the upstream at {upstream.url} within {wait_s:g} s: {reason}") from None


def _window(model: GuardedModel, cards: list[ModelCard]) -> Window:
    card = next((c for c in cards if c.id == model.name), None)
    return Window(model.name, model.max_model_len, model.length_source, card.max_model_len if card else None)


async def _version(upstream: Upstream) -> tuple[str | None, str | None]:
    try:
        payload = await upstream.get_json("/version", timeout_s=5.0)
    except GuardError as exc:
        return None, exc.message
    version = payload.get("version") if isinstance(payload, dict) else None
    return (version, None) if isinstance(version, str) else (None, "GET /version has no 'version'")


def _roots(cards: list[ModelCard]) -> str:
    return ", ".join(f"{c.id}: {c.root}" for c in cards) or "it lists no models"


def run_check(settings: Settings, samples_file: Path | None, wait_s: float, as_json: bool) -> int:
    """Exit status: 0 all agree, 1 a count or window mismatch, 2 the check could not run."""
    logging.basicConfig(level=settings.server.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /tokenize call says nothing the table does not
    try:
        samples = [*BUILTIN_SAMPLES, *(load_samples(samples_file) if samples_file else [])]
        report = asyncio.run(check(settings, samples, wait_s))
    except (CheckError, SamplesError) as exc:
        print(f"token-guard check: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2) if as_json else report.table())
    return 1 if report.failed else 0
