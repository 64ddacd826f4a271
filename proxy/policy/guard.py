"""The request path of a guarded endpoint: the body parsed, then the recipe of the wire model that reads it (parse ->
count -> decide, then the overflow policy when the prompt does not fit; policy/<endpoint>.py). Returns what to do
(forward a body, refuse, or fan out chunks); the front end does it. An endpoint is one recipe module and one row."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.api.body import with_changes
from proxy.api.invocations import invocation_kind, invoked_body
from proxy.api.routes import Kind, Reads, Route
from proxy.counting.isolated import BodyParser
from proxy.counting.registry import ModelRegistry
from proxy.counting.source import CountSource, Uncounted
from proxy.errors import ContextLengthExceeded, RouteNotFound
from proxy.policy import recipes
from proxy.policy.decide import Action, limits_for
from proxy.policy.outcome import Chunked, Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.reduce import reduce_request
from proxy.policy.steps import Steps
from proxy.policy.usage_event import usage_options
from proxy.settings import PolicySettings, Settings

log = logging.getLogger("token_guard.guard")

USAGE_ASKED = (Reads.CHAT, Reads.COMPLETION, Reads.TOKENS)  # the streams whose usage event the guard can ask for
CHUNK_UNAVAILABLE = (  # the guard as Envoy's external processor (extproc.chunk_instead)
    "The chunk policy was not applied: it sends one request upstream as several, which token-guard cannot do as "
    "Envoy's external processor (extproc.chunk_instead decides what a chunk request gets instead)."
)


@dataclass
class Guard:
    steps: Steps  # what the recipes share: settings, models, the upstream's counting, the KV ceiling, the ledger
    parser: BodyParser  # the largest bodies parsed in a child process (owner: exchange/core.py)

    @property
    def settings(self) -> Settings:
        return self.steps.settings

    @property
    def registry(self) -> ModelRegistry:
        return self.steps.registry

    async def handle(
        self, route: Route, raw: bytes, headers: Mapping[str, str], findings: Findings, ask_usage: bool = False
    ) -> Outcome:
        """What to do with a request to a guarded `route` (api/routes.py: its kind, and the wire model that reads
        it). `findings.api_key`, when set, is the client's named key: its models and output cap apply. `ask_usage`:
        a chat, completions or token-in stream that does not ask vLLM for its usage event asks for it
        (usage_event.py), for a front end that takes the event out of the answer again."""
        server = self.settings.server
        if route.since is not None and not self.registry.upstream_at_least(route.since):
            raise _not_yet(route, self.registry.upstream_version)
        if route.reads is Reads.AUDIO:  # a multipart form, not JSON
            outcome = recipes.form(self.steps, route, raw, headers, findings)
        else:
            body = await self.parser.parse(raw, server.max_json_depth, server.max_json_values)  # large: in a child
            try:
                outcome = await self._read(route, route.reads, body, raw, headers, findings)
            except Uncounted as exc:
                if route.answered:  # a count the guard would answer itself: it has none to give
                    raise exc.local from None
                outcome = self._uncounted(raw, exc, findings, route.kind is not Kind.COUNT)
            if ask_usage and isinstance(outcome, Forward) and route.kind is Kind.GENERATE:
                outcome = await self._asking_usage(outcome, route, body, raw)
        if outcome.decision.count_source is None and findings.count_source is not None:  # the overflow policies'
            outcome = replace(outcome, decision=replace(outcome.decision, count_source=findings.count_source))
        why = findings.kept_whole or (CHUNK_UNAVAILABLE if findings.chunk_refused else None)
        if why is not None and isinstance(outcome, Refuse) and isinstance(outcome.error, ContextLengthExceeded):
            error = ContextLengthExceeded(f"{outcome.error.message} {why}", param=outcome.error.param or "messages")
            outcome = replace(outcome, error=error)
        findings.decision = outcome.decision
        return outcome

    async def _read(
        self, route: Route, reads: Reads | None, body: dict[str, Any], raw: bytes, headers: Mapping[str, str],
        findings: Findings,
    ) -> Outcome:  # fmt: skip
        """The request read by its endpoint's wire model, counted and decided by its recipe (recipes.py)."""
        if reads is Reads.INVOCATIONS:  # SageMaker: the model its header names, the endpoint vLLM dispatches it to
            seen = invoked_body(body, headers)
            raw = raw if seen is body else with_changes(seen, {})  # what goes upstream names the model checked
            return await self._read(route, Reads(invocation_kind(seen)), seen, raw, headers, findings)
        return await recipes.run(self.steps, route, reads, body, raw, headers, findings)

    def _uncounted(self, raw: bytes, exc: Uncounted, findings: Findings, generates: bool = True) -> Outcome:
        """A prompt neither the guard nor the upstream's counting could count: forwarded as sent for vLLM's own
        answer (it may serve it), holding the whole window in admission (a render route holds none: nothing is
        generated); never the client's 400 on the guard's say."""
        log.warning("model %s: a prompt could not be counted (%s); forwarded uncounted", findings.model, exc)
        window = self.registry.resolve(findings.model).max_model_len
        findings.count_source = CountSource.UNCOUNTED
        return Forward(
            raw, Decision(Action.UNCOUNTED, 0, count_source=CountSource.UNCOUNTED), window if generates else None
        )

    async def _asking_usage(self, outcome: Forward, route: Route, body: dict[str, Any], raw: bytes) -> Forward:
        """The forwarded body asking for its stream's usage event, when it is a chat, completions or token-in stream
        that does not (the body as forwarded: the client's, or the clamp's or the cut's rewrite of it)."""
        kind = invocation_kind(body) if route.reads is Reads.INVOCATIONS else route.reads
        options = usage_options(body) if kind in USAGE_ASKED else None
        if options is None:
            return outcome
        server = self.settings.server
        sent = body if outcome.body is raw else await self.parser.parse(outcome.body, server.max_json_depth,
                                                                         server.max_json_values)  # fmt: skip
        return replace(outcome, body=with_changes(sent, {"stream_options": options}), usage_asked=True)

    def policy_for(self, model: str) -> PolicySettings:
        return self.steps.policy_for(model)

    async def reduce(self, chunked: Chunked, answers: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
        """The map-reduce step's request and its cost, or None when it would not fit (see policy/reduce.py)."""
        model = self.registry.resolve(chunked.original.model)
        limits = limits_for(model.name, model.max_model_len, chunked.policy, None, self.steps.max_cost())
        return await reduce_request(model, chunked, answers, limits)


def _not_yet(route: Route, version: str | None) -> RouteNotFound:
    """A route of a later vLLM release than the upstream's: vLLM answers it 404, and so does the guard."""
    since = ".".join(map(str, route.since or ()))
    upstream = f"vLLM {version}" if version is not None else "an upstream whose version is not known"
    return RouteNotFound(f"Invalid URL (POST {route.path}): the upstream is {upstream}; vLLM serves {route.path} from "
                         f"{since} on.")  # fmt: skip
