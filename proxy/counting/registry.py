"""Which models the guard knows: their tokenizers and context windows, from the config and from discovery.

Configured models are loaded before serving (a bad tokenizer stops start-up). Their `max_model_len`, when not
configured, and every model of a zero-config sidecar are learned from the upstream in the background; until then
a guarded request for them is answered 503 rather than forwarded unguarded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.api.models import ModelCard
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, TokenizerLoadError, load_tokenizer
from proxy.errors import ModelNotFound, NotReady
from proxy.settings import CountingSettings, ModelSettings

if TYPE_CHECKING:
    from proxy.counting.isolated import IsolatedRenderer

log = logging.getLogger("token_guard.registry")


@dataclass(frozen=True)
class GuardedModel:
    name: str
    tokenizer: ModelTokenizer
    max_model_len: int | None
    length_source: str
    counter: TokenCounter  # one per tokenizer: its segment cache outlives requests
    count_source: str = "auto"  # "local", "upstream", or "auto": local until the start-up check says otherwise
    source_reason: str = "counting.source auto: local until the start-up check compares with vLLM"


class ModelRegistry:
    def __init__(self, models: list[GuardedModel], discovering: bool, counting: CountingSettings | None = None) -> None:
        self._models = {m.name: m for m in models}
        self._order = [m.name for m in models]
        self._configured = bool(models)  # [[models]] given: discovery fills in their windows, adds none
        self.discovering = discovering
        self._counting = counting or CountingSettings()
        self.upstream_version: str | None = None  # vLLM's, once the start-up check has read it
        self._upstream_release: tuple[int, int] | None = None  # its (major, minor), read once: asked on every request
        self._learned: dict[str, GuardedModel] = {}  # each model as it was before the check changed it
        self.checked = False  # the start-up check has run (drift/startup.py): count sources are decided
        self.default: str | None = None  # the model the upstream serves a request that names none (its first card)
        self._discovered = False
        self._sandbox: IsolatedRenderer | None = None

    @classmethod
    def from_settings(
        cls, configured: tuple[ModelSettings, ...], counting: CountingSettings | None = None
    ) -> ModelRegistry:
        counting = counting or CountingSettings()
        models = []
        for i, spec in enumerate(configured):
            try:
                tok = load_tokenizer(spec.tokenizer, spec.chat_template, spec.tokenizer_mode,
                                     spec.default_chat_template_kwargs, spec.reasoning_effort_map)  # fmt: skip
            except TokenizerLoadError as exc:
                raise TokenizerLoadError(f"models[{i}] ({spec.name}): {exc}") from exc
            source = "config" if spec.max_model_len is not None else "pending discovery"
            counter = TokenCounter(tok.backend, counting, name=spec.name)
            counts = _count_source(spec.count_source or counting.source, "models[].count_source" if spec.count_source
                                   else "counting.source")  # fmt: skip
            models.append(GuardedModel(spec.name, tok, spec.max_model_len, source, counter, *counts))
            log.info("model %s: tokenizer from %s; chat rendered by %s (%s); counted by %s",
                     spec.name, spec.tokenizer, tok.rendering.mode, tok.rendering.reason, counts[0])  # fmt: skip
        # Readiness waits for discovery only when a window is unknown; discovery itself always runs, to warn when the
        # configured window disagrees with the upstream's.
        return cls(models, discovering=not models or any(m.max_model_len is None for m in models), counting=counting)

    @property
    def names(self) -> list[str]:
        return list(self._order)

    def serves(self, name: str) -> bool:
        """A model by this name is guarded here (configured or discovered): `names` without the copy."""
        return name in self._models

    def set_default_kwargs(self, name: str, kwargs: dict[str, Any]) -> None:
        """The server's default_chat_template_kwargs for this model, learned from the upstream."""
        model = self._models[name]
        self._learned.setdefault(name, model)
        self._models[name] = replace(model, tokenizer=replace(model.tokenizer, default_kwargs=kwargs))

    def render_requests_in(self, sandbox: IsolatedRenderer) -> None:
        """Where a chat template a request brings renders, for every model: a child process, which the caller owns
        and closes (exchange/core.py; the doctor command)."""
        self._sandbox = sandbox
        for name, model in self._models.items():
            self._models[name] = replace(model, tokenizer=replace(model.tokenizer, sandbox=sandbox))

    def set_upstream_version(self, version: str) -> None:
        """What the upstream's vLLM version changes in counting: 0.32 strips a billing-header line, 0.33 follows
        namespace aliases of `messages` when it decides a template's content format (see conversation.py), 0.34
        gives a tool result's references and text one tool message (anthropic.py), reads more Responses input items
        (responses.py) and renders a gpt-oss reasoning item without content (harmony_responses.py), reads a
        processor template stored as a dict by its "default" entry, which 0.31-0.33 refuse to render
        (processor.py), hands mistral_common the request's response_format and effort (mistral.py,
        anthropic_probes.py), and reads any error of the Messages API's inline-system probe as "merge"
        (anthropic_probes.py)."""
        self.upstream_version = version
        release = self._upstream_release = _release(version)
        newest = release >= (0, 34)
        rules = (release >= (0, 32), release >= (0, 33), newest, newest, not newest, newest, newest)
        for name, model in self._models.items():
            tok = model.tokenizer
            if (tok.strip_billing_header, tok.namespace_aliases, tok.tool_references_joined, tok.fills_response_items,
                    tok.processor_dict_refused, tok.mistral_034, tok.probe_catches_any) != rules:  # fmt: skip
                strip, namespaces, joined, fills, refused, mistral, catches = rules
                tok = replace(tok, strip_billing_header=strip, namespace_aliases=namespaces,
                              tool_references_joined=joined, fills_response_items=fills,
                              processor_dict_refused=refused, mistral_034=mistral,
                              probe_catches_any=catches)  # fmt: skip
                self._models[name] = replace(model, tokenizer=tok)

    @property
    def upstream_release(self) -> tuple[int, int] | None:
        """The upstream's (major, minor), once the start-up check has read it."""
        return self._upstream_release

    def upstream_newer(self) -> bool:
        """True for an upstream of vLLM 0.32 or later; False while its version is not known (the older rules)."""
        return self.upstream_at_least((0, 32))

    def upstream_at_least(self, release: tuple[int, int]) -> bool:
        """True for an upstream of vLLM `release` or later; False while its version is not known."""
        return self._upstream_release is not None and self._upstream_release >= release

    def anthropic_error_types(self) -> bool:
        """True for an upstream of vLLM 0.33 or later, whose Messages API names its errors in Anthropic's own types
        (invalid_request_error, ...); False while its version is not known (vLLM's exception names, as before)."""
        return self.upstream_at_least((0, 33))

    def set_count_source(self, name: str, source: str, reason: str) -> None:
        """Who counts this model's prompts from now on (the start-up check's verdict in counting.source auto)."""
        model = self._models[name]
        if (model.count_source, model.source_reason) != (source, reason):
            self._learned.setdefault(name, model)
            self._models[name] = replace(model, count_source=source, source_reason=reason)
            level = logging.WARNING if source == "upstream" else logging.INFO
            log.log(level, "model %s: count source %s: %s", name, source, reason)

    def forget_learned(self) -> None:
        """Undo what the start-up check learned (server defaults, count sources in counting.source auto), to learn it
        again from an upstream that may have restarted with other flags; discovery runs again too."""
        for name, before in self._learned.items():
            model = self._models[name]
            tokenizer = replace(model.tokenizer, default_kwargs=before.tokenizer.default_kwargs)
            self._models[name] = replace(model, tokenizer=tokenizer, count_source=before.count_source,
                                         source_reason=before.source_reason)  # fmt: skip
        self._learned.clear()
        self.checked = False

    def resolve(self, name: str | None, allowed: tuple[str, ...] | None = None) -> GuardedModel:
        """The model a request is for, of those `allowed` (a key's [[keys]] models; None: any). One that names none
        is the upstream's default, as vLLM serves it (its first served name), whatever order the guard's own
        [[models]] are in: a key held to some models is checked against the model that will answer. A model it may
        not use is a 404 worded as for one that does not exist, as OpenAI answers it, naming only models it may use."""
        if name is None:
            return self._default(allowed)
        model = self._models.get(name)
        if model is not None and (allowed is None or name in allowed):
            return model
        if model is None and self.discovering:
            raise NotReady("token-guard is starting: it is still learning the upstream's models.")
        if allowed is None:
            raise ModelNotFound(f"The model `{name}` does not exist. Models this guard serves: {self._listed(None)}.")
        raise ModelNotFound(
            f"The model `{name}` does not exist or you do not have access to it.{self._usable(allowed)}"
        )

    def _default(self, allowed: tuple[str, ...] | None) -> GuardedModel:
        if not self._discovered:
            raise NotReady("token-guard is starting: it does not know yet which model the upstream serves to a request "
                           "that names none; name the model, or try again shortly.")  # fmt: skip
        if self.default is None:
            raise ModelNotFound("The request names no model, and the upstream lists none.")
        model = self._models.get(self.default)
        if allowed is not None and (model is None or model.name not in allowed):  # whose name it may not learn
            raise ModelNotFound("The request names no model, and the model the upstream serves to such a request is "
                                f"not one you have access to; name the model.{self._usable(allowed)}")  # fmt: skip
        if model is None:
            raise ModelNotFound(f"The request names no model, and the upstream's default model `{self.default}` is "
                                "not one this guard serves; name the model.")  # fmt: skip
        return model

    def _listed(self, allowed: tuple[str, ...] | None) -> str:
        return ", ".join(n for n in self._order if allowed is None or n in allowed) or "none"

    def _usable(self, allowed: tuple[str, ...]) -> str:
        """The models a key may use that the guard serves, as the end of its 404's message (nothing when none)."""
        listed = self._listed(allowed)
        return "" if listed == "none" else f" Models you have access to: {listed}."

    def apply_discovery(self, cards: list[ModelCard]) -> None:
        self.default = cards[0].id if cards else None
        self._discovered = True
        by_id = {c.id: c for c in cards}
        for name in self._order:
            self._models[name] = _with_discovered(self._models[name], by_id.get(name))
        if not self._configured:  # zero-config: every model the upstream serves, once (a restart may add one)
            self._add_discovered(cards)
        self.discovering = False

    def _add_discovered(self, cards: list[ModelCard]) -> None:
        loaded: dict[str, tuple[ModelTokenizer, TokenCounter]] = {}
        for card in cards:
            if card.id in self._models:  # known from an earlier discovery
                continue
            root = card.root
            if card.parent is not None and card.parent in by_name(cards):
                root = by_name(cards)[card.parent].root  # a LoRA adapter counts with its base model's tokenizer
            length = card.max_model_len or _parent_length(card, cards)
            if root is None or not Path(root).is_dir() or length is None:
                log.warning("model %s: root %r is not a local directory this sidecar can read; not guarded "
                            "(configure [[models]] with a tokenizer for it)", card.id, root)  # fmt: skip
                continue
            try:
                tok, counter = loaded.get(root) or self._load(root, card.id)
            except TokenizerLoadError as exc:
                log.warning("model %s: not guarded: %s", card.id, exc)
                continue
            loaded[root] = tok, counter
            counts = _count_source(self._counting.source, "counting.source")
            self._models[card.id] = GuardedModel(card.id, tok, length, "discovered", counter, *counts)
            self._order.append(card.id)
            log.info("model %s: tokenizer from %s, max_model_len %d (discovered); chat rendered by %s (%s)",
                     card.id, root, length, tok.rendering.mode, tok.rendering.reason)  # fmt: skip

    def _load(self, root: str, name: str) -> tuple[ModelTokenizer, TokenCounter]:
        tok = replace(load_tokenizer(root), sandbox=self._sandbox)
        return tok, TokenCounter(tok.backend, self._counting, name=name)


def _release(version: str) -> tuple[int, int]:
    """(0, 32) from "0.32.0+cpu"; (0, 0) when unreadable (the older behaviour: the safe side)."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return 0, 0


def _count_source(setting: str, key: str) -> tuple[str, str]:
    if setting == "auto":
        return "auto", f"{key} auto: local, until the start-up check finds the guard disagreeing with vLLM"
    return setting, f"{key} {setting} (configured)"


def by_name(cards: list[ModelCard]) -> dict[str, ModelCard]:
    return {c.id: c for c in cards}


def _parent_length(card: ModelCard, cards: list[ModelCard]) -> int | None:
    parent = by_name(cards).get(card.parent or "")
    return parent.max_model_len if parent else None


def _with_discovered(model: GuardedModel, card: ModelCard | None) -> GuardedModel:
    found = card.max_model_len if card else None
    if model.max_model_len is None:
        if found is None:
            log.error("model %s: max_model_len is not configured and the upstream does not report it; "
                      "requests for it will be refused with 503 until it is configured", model.name)  # fmt: skip
            return model
        log.info("model %s: max_model_len %d (discovered)", model.name, found)
        return replace(model, max_model_len=found, length_source="discovered")
    if found is not None and found != model.max_model_len and model.length_source == "discovered":
        log.warning("model %s: max_model_len %d now (discovered again; was %d)", model.name, found, model.max_model_len)
        return replace(model, max_model_len=found)
    if found is not None and found != model.max_model_len:
        log.warning("model %s: configured max_model_len %d differs from the upstream's %d; using %d",
                    model.name, model.max_model_len, found, model.max_model_len)  # fmt: skip
    elif card is None:
        log.warning("model %s: the upstream does not list this model", model.name)
    return model
