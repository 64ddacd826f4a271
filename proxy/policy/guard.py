"""The request path of a guarded endpoint: parse -> count -> decide, then the overflow policy when the prompt does
not fit. Returns what to do (forward a body, refuse, or fan out chunks); the server does it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.api.anthropic import MessagesRequest, messages_request
from proxy.api.audio import AudioRequest, audio_request
from proxy.api.batch import BatchChatRequest, batch_chat_request
from proxy.api.body import with_changes
from proxy.api.chat import ChatRequest, chat_request
from proxy.api.cohere import CohereEmbedRequest, cohere_embed_request
from proxy.api.completions import CompletionRequest, completion_request
from proxy.api.invocations import invocation_kind, invoked_body
from proxy.api.pooling import Kind as PoolingKind
from proxy.api.pooling import PoolingRequest, ScoringRequest, pooling_request
from proxy.api.responses import LIMIT_FIELD, ResponsesRequest, responses_request
from proxy.api.routes import Kind, Route
from proxy.api.tokens import GenerateRequest, generate_request
from proxy.counting.anthropic import messages_chat
from proxy.counting.bound import verbatim_texts
from proxy.counting.isolated import PARSER
from proxy.counting.local_count import count_chat
from proxy.counting.pooling import cohere_tokens, pooling_tokens, scoring_tokens
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.source import (
    LOCAL,
    UNCOUNTED,
    RemoteCount,
    Uncounted,
    batch_tokens,
    chat_tokens,
    completion_tokens,
)
from proxy.errors import ContextLengthExceeded, InvalidRequest, PermissionDenied
from proxy.policy import background, thinking
from proxy.policy.audio import settle_audio
from proxy.policy.batch import refuse_batch, settle_batch
from proxy.policy.choice import choose_policy, whole_prompt
from proxy.policy.cohere import settle_cohere
from proxy.policy.continued import continued, continued_chat
from proxy.policy.converted import (
    Converted,
    count_answer,
    message_kept,
    message_turn,
    response_kept,
    response_turn,
    settle,
)
from proxy.policy.decide import (
    Limits,
    Plan,
    decide_chat,
    decide_completion,
    limits_for,
    next_turn_share,
    reject_at_least,
)
from proxy.policy.generate import settle_generate
from proxy.policy.ledger import Ledger, Turn
from proxy.policy.outcome import Chunked, Decision, Findings, Forward, Outcome, Refuse, outcome_of
from proxy.policy.overflow import overflow_chat, overflow_completion
from proxy.policy.pooling import Pooled, settle_pooling
from proxy.policy.reduce import reduce_request
from proxy.policy.size import SIZE_FLOOR, proven_over, refuse_by_size
from proxy.policy.turns import CountItems
from proxy.policy.usage_event import usage_options
from proxy.settings import PolicySettings, Settings

log = logging.getLogger("token_guard.guard")


POOLING_KINDS: dict[str, PoolingKind] = {
    "embeddings": "embeddings", "pooling": "pooling", "classify": "classify", "score": "score", "rerank": "rerank",
}  # fmt: skip

CHUNK_UNAVAILABLE = (  # the guard as Envoy's external processor (extproc.chunk_instead)
    "The chunk policy was not applied: it sends one request upstream as several, which token-guard cannot do as "
    "Envoy's external processor (extproc.chunk_instead decides what a chunk request gets instead)."
)
UNTRUSTED_TEMPLATE = (  # vLLM's words, then the guard's switch
    "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with "
    "untrusted chat template. (token-guard: policy.trust_request_chat_template)"
)


@dataclass
class Guard:
    settings: Settings
    registry: ModelRegistry
    remote: RemoteCount | None = None  # counts through the upstream (counting.source); None: always local
    ceiling: Callable[[], int | None] | None = None  # the largest replica's whole KV budget (None: no token budget)
    chunk_instead: str | None = None  # a front end that cannot fan out: "reject" or "truncate" for chunk (None: chunk)
    ledger: Ledger | None = None  # the stored responses a Responses create continues (policy/ledger.py)

    def __post_init__(self) -> None:
        self._policies = {m.name: m.policy for m in self.settings.models if m.policy is not None}

    async def handle(
        self, route: Route, raw: bytes, headers: Mapping[str, str], findings: Findings, ask_usage: bool = False
    ) -> Outcome:
        """What to do with a request to a guarded `route` (api/routes.py: its kind, and the wire model that reads
        it). `findings.api_key`, when set, is the client's named key: its models and output cap apply. `ask_usage`:
        a chat, completions or token-in stream that does not ask vLLM for its usage event asks for it
        (usage_event.py), for a front end that takes the event out of the answer again."""
        server = self.settings.server
        if route.reads == "audio":  # a multipart form, not JSON
            req = audio_request(raw, headers.get("content-type", ""), route.path)
            outcome = self._audio(req, raw, headers, findings)
        else:
            body = await PARSER.parse(raw, server.max_json_depth, server.max_json_values)  # large: in a child process
            try:
                if route.kind is Kind.COUNT:
                    outcome = await self._counted(route, body, raw, headers, findings)
                else:
                    outcome = await self._read(route.reads, body, raw, headers, findings)
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
        self, reads: str | None, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        """The request read by its endpoint's wire model, counted and decided."""
        max_messages = self.settings.server.max_messages
        if reads == "chat":
            return await self._chat(chat_request(body, max_messages), raw, headers, findings)
        if reads == "completion":
            return await self._completion(completion_request(body), raw, headers, findings)
        if reads == "responses":
            return await self._responses(responses_request(body, max_messages), raw, headers, findings)
        if reads == "messages":
            return await self._messages(messages_request(body, False, max_messages), raw, headers, findings)
        if reads == "invocations":  # SageMaker: the model its header names, the endpoint vLLM dispatches the body to
            seen = invoked_body(body, headers)
            raw = raw if seen is body else with_changes(seen, {})  # what goes upstream names the model checked
            return await self._read(invocation_kind(seen), seen, raw, headers, findings)
        if reads in POOLING_KINDS:
            return await self._pooling(pooling_request(body, POOLING_KINDS[reads]), raw, headers, findings)
        if reads == "chat_batch":
            return await self._batch(batch_chat_request(body, max_messages), raw, headers, findings)
        if reads == "tokens":
            return self._tokens(generate_request(body), raw, headers, findings)
        if reads == "cohere_embed":
            return await self._cohere(cohere_embed_request(body), raw, headers, findings)
        raise InvalidRequest(f"token-guard cannot read requests of this endpoint ({reads}).")

    async def _counted(
        self, route: Route, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        """A count route: Anthropic's count_tokens, answered by the guard as vLLM answers it, or a render route,
        forwarded unchanged once its prompt is counted (vLLM renders it; nothing is generated, nothing is clamped). A
        prompt whose size proves it over the window is refused from that floor, uncounted, as on the other routes."""
        max_messages, newer = self.settings.server.max_messages, self.registry.upstream_newer()
        if route.reads == "completion":
            completion = completion_request(body)
            model, policy, _, limits = self._target(completion.model, headers, findings)
            texts = [[p] for p in completion.prompts if isinstance(p, str)]
            proven = await refuse_by_size(model, texts, limits, "reject", policy, "prompt", findings)
            if proven is not None:
                return proven
            counts, findings.count_source = await completion_tokens(model, completion, self.remote)
            return Forward(raw, Decision("count", sum(counts), count_source=findings.count_source))
        if route.reads == "count_tokens":
            messages = messages_request(body, True, max_messages)
            model, policy, _, limits = self._target(messages.model, headers, findings)
            chat = messages_chat(model.tokenizer, messages, newer)
        elif route.reads == "responses":
            responses = responses_request(body, max_messages)
            model, policy, _, limits = self._target(responses.model, headers, findings)
            chat = continued_chat(model.tokenizer, responses, newer, None)[0]  # gpt-oss: harmony messages
        elif route.reads == "chat":
            chat = chat_request(body, max_messages)
            model, policy, _, limits = self._target(chat.model, headers, findings)
            if not policy.trust_request_chat_template and _brings_template(chat):
                raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")
        else:
            raise InvalidRequest(f"token-guard cannot count requests of this endpoint ({route.reads}).")
        texts = [list(verbatim_texts(chat.messages))]
        proven = await refuse_by_size(model, texts, limits, "reject", policy, "messages", findings)
        if proven is not None:
            return proven
        prompt_tokens = await self._count(model, chat, findings)
        if route.answered:
            return count_answer(prompt_tokens, limits)
        return Forward(raw, Decision("count", prompt_tokens, count_source=findings.count_source))

    async def _chat(self, req: ChatRequest, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
        findings.max_tokens_before = req.requested_output[1] if req.requested_output else None
        model, policy, choice, limits = self._target(req.model, headers, findings, req.body, "chat")
        if not policy.trust_request_chat_template and _brings_template(req):
            raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")
        proven = await refuse_by_size(
            model, [list(verbatim_texts(req.messages))], limits, choice, policy, "messages", findings
        )
        if proven is not None:
            return proven
        started = time.perf_counter()
        prompt_tokens, findings.count_source = await chat_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        plan = decide_chat(req, prompt_tokens, limits)
        # Truncate and chunk re-count their cuts here; only a locally counted prompt can be cut exactly.
        if _fits_by_cutting(plan, choice) and findings.count_source == LOCAL:
            return await overflow_chat(model.tokenizer, model.counter, req, plan, limits, policy, choice)
        return outcome_of(plan, req.body, raw, plan.cost(limits, req.n), findings.count_source)

    async def _completion(
        self, req: CompletionRequest, raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        findings.max_tokens_before = req.requested_output[1]
        model, policy, choice, limits = self._target(req.model, headers, findings, req.body)
        if req.embeds and findings.api_key is not None and not findings.api_key.prompt_embeds:
            raise PermissionDenied("This API key may not send prompt_embeds ([[keys]] prompt_embeds = false).")
        texts = [[p] for p in req.prompts if isinstance(p, str)]
        proven = await refuse_by_size(model, texts, limits, choice, policy, "prompt", findings)
        if proven is not None:
            return proven
        started = time.perf_counter()
        counts, findings.count_source = await completion_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        plan = decide_completion(req, counts, limits)
        if _fits_by_cutting(plan, choice) and findings.count_source == LOCAL:
            return await overflow_completion(model.tokenizer, req, counts, plan, limits, policy, choice)
        return outcome_of(plan, req.body, raw, plan.cost(limits, req.sequences), findings.count_source)

    async def _responses(
        self, req: ResponsesRequest, raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        findings.max_tokens_before = req.max_output_tokens
        model, _, choice, limits = self._target(req.model, headers, findings, req.body, "responses")
        named, follows = background.named(req, self.settings.admission)
        if named is not req:  # the guard names a background response: the body forwarded carries its id
            req, raw = named, with_changes(named.body, {})
        newer = self.registry.upstream_newer()
        entry = await continued(self.ledger, req, findings.owner) if self.ledger is not None else None
        chat, messages = continued_chat(model.tokenizer, req, newer, entry)
        partial = req.previous_response_id is not None and messages is None
        if self.ledger is not None and (req.store or entry is not None):  # before counting: an uncounted one too
            messages = None if req.background else messages  # background: answered empty at first
            findings.turn = Turn(findings.owner, model.name, messages, entry, req.store, chat.harmony is not None)
        prompt_tokens = await self._count(model, chat, findings)

        async def recount(items: list[Any]) -> int:
            cut = replace(req, input=items, body={**req.body, "input": items})
            return await count_chat(model.tokenizer, continued_chat(model.tokenizer, cut, newer, entry)[0],
                                    model.counter)  # fmt: skip

        conv = Converted(
            "/v1/responses", req.body, raw, LIMIT_FIELD, req.max_output_tokens, "input", "input", req.input,
            response_turn, response_kept, partial=partial, upstream_truncates=req.truncation_auto,
        )  # fmt: skip
        outcome = await settle(conv, prompt_tokens, limits, choice, self._recount(findings, recount))
        return replace(outcome, follows=follows) if follows is not None and isinstance(outcome, Forward) else outcome

    async def _messages(
        self, req: MessagesRequest, raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        findings.max_tokens_before = req.max_tokens
        model, _, choice, limits = self._target(req.model, headers, findings, req.body, "messages")
        outcome = await self._settle_messages(model, req, raw, limits, choice, findings)
        if not thinking.needs_off(outcome, req):
            return thinking.noted(outcome, req, disabled=False)
        off = thinking.without_thinking(req)  # renders differently: counted and decided again
        outcome = await self._settle_messages(model, off, with_changes(off.body, {}), limits, choice, findings)
        return thinking.noted(outcome, req, disabled=True)

    async def _settle_messages(
        self, model: GuardedModel, req: MessagesRequest, raw: bytes, limits: Limits, choice: str, findings: Findings
    ) -> Outcome:
        newer = self.registry.upstream_newer()
        prompt_tokens = await self._count(model, messages_chat(model.tokenizer, req, newer), findings)

        async def recount(items: list[Any]) -> int:
            cut = replace(req, messages=items, body={**req.body, "messages": items})
            return await count_chat(model.tokenizer, messages_chat(model.tokenizer, cut, newer), model.counter)

        conv = Converted(
            "/v1/messages", req.body, raw, "max_tokens", req.max_tokens, "messages", "messages", req.messages,
            message_turn, message_kept, follow=thinking.follower(req),
        )  # fmt: skip
        return await settle(conv, prompt_tokens, limits, choice, self._recount(findings, recount))

    async def _pooling(
        self, req: PoolingRequest | ScoringRequest, raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        """Embeddings, /pooling, /classify, score and rerank: input tokens only (policy/pooling.py)."""
        model, _, choice, limits = self._target(req.model, headers, findings)
        started = time.perf_counter()
        if isinstance(req, PoolingRequest):
            counts, findings.count_source = await pooling_tokens(model, req, self.remote)
            pooled = Pooled(req.kind, req.body, raw, counts, req.param, req.truncate_prompt_tokens, req.uncounted)
        else:
            queries, documents = await scoring_tokens(model, req)
            findings.count_source = LOCAL
            pooled = Pooled(req.kind, req.body, raw, queries + documents, "input", req.truncate_prompt_tokens,
                            partial=True)  # fmt: skip
        findings.count_s = time.perf_counter() - started
        return settle_pooling(pooled, limits, choice, findings.count_source)

    async def _batch(
        self, req: BatchChatRequest, raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        """Each conversation counted as chat; the shared output limit decided for the longest (policy/batch.py)."""
        findings.max_tokens_before = req.requested_output[1] if req.requested_output else None
        model, policy, choice, limits = self._target(req.model, headers, findings)
        if not policy.trust_request_chat_template and _brings_template(req.chats[0]):
            raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")
        if model.tokenizer.native is None:
            texts = [list(verbatim_texts(chat.messages)) for chat in req.chats]
            floor = await proven_over(model, texts, limits.max_model_len - limits.min_output_tokens)
            if floor is not None:
                findings.count_source = SIZE_FLOOR
                return refuse_batch(reject_at_least(floor, limits, "messages"), floor, "", choice, SIZE_FLOOR)
        started = time.perf_counter()
        counts, findings.count_source = await batch_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        return settle_batch(req, counts, raw, limits, choice, findings.count_source)

    def _tokens(self, req: GenerateRequest, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
        """Token-in generation: the token ids are the count (policy/generate.py)."""
        findings.max_tokens_before = req.max_tokens
        _, _, choice, limits = self._target(req.model, headers, findings)
        findings.count_source = LOCAL
        return settle_generate(req, raw, limits, choice)

    def _audio(self, req: AudioRequest, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
        """Transcription and translation: the audio prompt is not counted, the output limit is (policy/audio.py)."""
        findings.max_tokens_before = req.max_completion_tokens
        limits = self._target(req.model, headers, findings)[3]
        return settle_audio(req, raw, limits)

    async def _cohere(
        self, req: CohereEmbedRequest, raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        """Cohere's /v2/embed: a pooling request that says its cuts its own way (policy/cohere.py)."""
        model, _, choice, limits = self._target(req.model, headers, findings)
        started = time.perf_counter()
        counts, findings.count_source = await cohere_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        return settle_cohere(req, counts, raw, limits, choice, findings.count_source)

    async def _count(self, model: GuardedModel, req: ChatRequest, findings: Findings) -> int:
        started = time.perf_counter()
        prompt_tokens, findings.count_source = await chat_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        return prompt_tokens

    @staticmethod
    def _recount(findings: Findings, recount: CountItems) -> CountItems | None:
        # Truncation re-counts its cuts; only a locally counted prompt can be cut exactly.
        return recount if findings.count_source == LOCAL else None

    def _target(
        self, name: str | None, headers: Mapping[str, str], findings: Findings, body: Mapping[str, Any] | None = None,
        reads: str = "",
    ) -> tuple[GuardedModel, PolicySettings, str, Limits]:  # fmt: skip
        """The model a request is for, its policy, the overflow choice (config or header: reject for a `body` whose
        prompt must reach vLLM whole) and its limits (with the next turn's share of the route that `reads` it)."""
        key = findings.api_key
        model = self.registry.resolve(name, key.models if key is not None else None)  # a 404 for one it may not use
        findings.model = model.name
        policy = self.policy_for(model.name)
        max_output = key.max_output_tokens if key is not None else None
        max_cost = self.ceiling() if self.ceiling is not None else None
        limits = limits_for(model.name, model.max_model_len, policy, max_output, max_cost)
        if reads:
            limits = replace(limits, next_turn=next_turn_share(policy, reads))
        choice = choose_policy(policy, headers)
        why = whole_prompt(body) if choice != "reject" and body is not None else None
        if why is not None:
            choice, findings.kept_whole = "reject", f"The {choice} policy was not applied: {why}."
        if choice == "chunk" and self.chunk_instead is not None:
            choice, findings.chunk_refused = self.chunk_instead, self.chunk_instead == "reject"
        return model, policy, choice, limits

    def _uncounted(self, raw: bytes, exc: Uncounted, findings: Findings, generates: bool = True) -> Outcome:
        """A prompt neither the guard nor the upstream's counting could count: forwarded as sent for vLLM's own
        answer (it may serve it), holding the whole window in admission (a render route holds none: nothing is
        generated); never the client's 400 on the guard's say."""
        log.warning("model %s: a prompt could not be counted (%s); forwarded uncounted", findings.model, exc)
        window = self.registry.resolve(findings.model).max_model_len
        findings.count_source = UNCOUNTED
        return Forward(raw, Decision("uncounted", 0, count_source=UNCOUNTED), window if generates else None)

    async def _asking_usage(self, outcome: Forward, route: Route, body: dict[str, Any], raw: bytes) -> Forward:
        """The forwarded body asking for its stream's usage event, when it is a chat, completions or token-in stream
        that does not (the body as forwarded: the client's, or the clamp's or the cut's rewrite of it)."""
        kind = invocation_kind(body) if route.reads == "invocations" else route.reads
        options = usage_options(body) if kind in ("chat", "completion", "tokens") else None
        if options is None:
            return outcome
        server = self.settings.server
        sent = body if outcome.body is raw else await PARSER.parse(outcome.body, server.max_json_depth,
                                                                    server.max_json_values)  # fmt: skip
        return replace(outcome, body=with_changes(sent, {"stream_options": options}), usage_asked=True)

    def policy_for(self, model: str) -> PolicySettings:
        return self._policies.get(model) or self.settings.policy

    async def reduce(self, chunked: Chunked, answers: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
        """The map-reduce step's request and its cost, or None when it would not fit (see policy/reduce.py)."""
        model = self.registry.resolve(chunked.original.model)
        limits = limits_for(model.name, model.max_model_len, chunked.policy, None,
                            self.ceiling() if self.ceiling is not None else None)  # fmt: skip
        return await reduce_request(model, chunked, answers, limits)


def _fits_by_cutting(plan: Plan, choice: str) -> bool:
    """True when the overflow policy may cut the prompt to fit the window (never for a request over the KV budget)."""
    return plan.action == "reject" and choice != "reject" and isinstance(plan.error, ContextLengthExceeded)


def _brings_template(req: ChatRequest) -> bool:
    return req.chat_template is not None or req.chat_template_kwargs.get("chat_template") is not None
