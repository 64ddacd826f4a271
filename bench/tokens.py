"""`python -m bench tokens`: CPU per render of a chat's token ids, on the same requests, by `token-guard render` (no
upstream), by a real vLLM 0.32.0 API server's render route (--enable-scale-out, the same tiny model) and by a raw
`tokenizers` encode of the rendered prompt in this process: a fresh ~100K-token prompt, turn 20 of an agent
conversation, 32 concurrent small chats. Every request's token ids must be equal on every system (a mismatch fails the
run). Also the guard's resident memory serving four models' renders against one vLLM render server's.
Writes bench/results/<date>/tokens-<commit>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.machine import describe, git_commit
from bench.procstats import resident_mb, run_s, usage
from bench.token_systems import MODEL, VLLM_VERSION, Server, start_guard, start_guard_models, start_vllm, vllm_model_dir
from bench.token_texts import Message, Shape, Texts
from bench.tokens_report import GUARD, RAW, VLLM, markdown

FAMILIES = "llama3.1,qwen3,mistral-nemo,gemma"
ROUTE = "/v1/chat/completions/render"
Chat = list[Message]
Unit = tuple[list[Chat], list[Chat]]  # the chats measured together, after the chats sent unmeasured before them


@dataclass
class Tally:
    """One system's figures in one scenario: CPU seconds summed over the measured requests."""

    requests: int = 0
    cpu_s: float = 0.0  # threads' run time (schedstat), the whole process tree
    tick_cpu_s: float = 0.0  # utime + stime of the tree (10 ms ticks): the check of cpu_s
    own_cpu_s: float = 0.0  # the top process alone (vLLM's API server)
    tokens: list[int] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--systems", default=f"{GUARD},{VLLM},{RAW}", help="comma-separated: guard, vllm, raw")
    parser.add_argument("--fresh", type=int, default=5, help="fresh long prompts (default 5)")
    parser.add_argument("--fresh-tokens", type=int, default=Shape.fresh_tokens, help="tokens of a fresh prompt")
    parser.add_argument("--conversations", type=int, default=4, help="agent conversations (default 4)")
    parser.add_argument("--turns", type=int, default=Shape.turns, help="the turn measured (default 20)")
    parser.add_argument("--turn-tokens", type=int, default=Shape.turn_tokens, help="tokens a turn adds (default 2500)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of concurrent small chats (default 3)")
    parser.add_argument("--concurrency", type=int, default=32, help="small chats per round (default 32)")
    parser.add_argument("--small-tokens", type=int, default=Shape.small_tokens, help="tokens of a small chat")
    parser.add_argument("--max-model-len", type=int, default=131_072, help="the window both servers render for")
    parser.add_argument("--families", default=FAMILIES, help="the zoo tokenizers of the guard's RSS run ('' skips)")
    parser.add_argument("--out", type=Path, help="output folder (default: bench/results/<today>)")
    parser.add_argument("--note", default="", help="a sentence about the machine's state during the run")


def main(args: argparse.Namespace) -> int:
    systems = [s for s in args.systems.split(",") if s]
    if not systems or set(systems) - {GUARD, VLLM, RAW}:
        raise SystemExit(f"bench tokens: --systems takes {GUARD}, {VLLM} and {RAW}, not {args.systems!r}")
    shape = Shape(args.fresh_tokens, args.turns, args.turn_tokens, args.small_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = vllm_model_dir() if VLLM in systems else _demo_tokenizer(work)
        texts = Texts(tokenizer, shape)
        load_before = describe({"vllm": VLLM_VERSION})
        with _servers(systems, tokenizer, args.max_model_len, work) as servers:
            figures, mismatches = asyncio.run(_measure(args, texts, servers, RAW in systems))
            rss = {name: _rss(server) for name, server in servers.items()}
        if GUARD in systems and args.families:
            rss["guard-models"] = _models_rss(args, texts, work)
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": load_before,
        "load_average_after": list(os.getloadavg()),
        "settings": {**vars(args), "out": None, "vllm": VLLM_VERSION},
        "scenarios": {key: {name: vars(t) for name, t in tallies.items()} for key, tallies in figures.items()},
        "mismatches": mismatches,
        "rss_mb": rss,
    }
    text = markdown(result)
    print(text)
    out = args.out or Path("bench/results") / datetime.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"tokens-{git_commit().split()[0]}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(text)
    return 1 if sum(mismatches.values()) else 0


def _demo_tokenizer(work: Path) -> Path:
    from proxy.assets import write_demo_tokenizer_dir

    return write_demo_tokenizer_dir(work / "tokenizer")


@contextlib.contextmanager
def _servers(systems: list[str], tokenizer: Path, window: int, work: Path) -> Iterator[dict[str, Server]]:
    servers: dict[str, Server] = {}
    try:
        if GUARD in systems:
            servers[GUARD] = start_guard(tokenizer, window, work)
        if VLLM in systems:
            servers[VLLM] = start_vllm(tokenizer, window, work)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


async def _measure(
    args: argparse.Namespace, texts: Texts, servers: dict[str, Server], raw: bool
) -> tuple[dict[str, dict[str, Tally]], dict[str, int]]:
    figures: dict[str, dict[str, Tally]] = {}
    mismatches: dict[str, int] = {}
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        runner = Runner(client, servers, raw, texts)
        units: dict[str, list[Unit]] = {
            "first": [([texts.fresh(-1)], [])],  # the first long prompt after start: the guard's caches empty
            "fresh": [([texts.fresh(i)], []) for i in range(args.fresh)],
            "turn": [
                ([texts.conversation(c, args.turns)], [texts.conversation(c, k) for k in range(1, args.turns)])
                for c in range(args.conversations)
            ],
            "small": [
                ([texts.small(r * args.concurrency + i) for i in range(args.concurrency)], [])
                for r in range(args.rounds)
            ],
        }
        warm_up: dict[str, list[Chat]] = {"first": [], "fresh": [], "turn": [], "small": [texts.small(-1)]}
        for key, scenario in units.items():
            await runner.warm_up(warm_up[key])
            figures[key], mismatches[key] = await runner.scenario(scenario)
    return figures, mismatches


class Runner:
    def __init__(self, client: httpx.AsyncClient, servers: dict[str, Server], raw: bool, texts: Texts) -> None:
        self.client, self.servers, self.raw, self.texts = client, servers, raw, texts

    async def warm_up(self, chats: list[Chat]) -> None:
        """Requests not measured before a scenario's first measured one (its code paths and caches made)."""
        for server in self.servers.values():
            for chat in chats:
                await render(self.client, server, chat)

    async def scenario(self, units: list[Unit]) -> tuple[dict[str, Tally], int]:
        """Each unit's chats sent at once and measured, after its earlier chats (a conversation's earlier turns) sent
        one by one unmeasured. Systems take turns unit by unit, the order rotated each unit."""
        names = [*self.servers, *([RAW] if self.raw else [])]
        tallies = {name: Tally() for name in names}
        mismatches = 0
        for index, (measured, before) in enumerate(units):
            ids: dict[str, list[list[int]]] = {}
            for name in names[index % len(names) :] + names[: index % len(names)]:
                ids[name] = await self._unit(name, measured, before, tallies[name])
            mismatches += sum(len({json.dumps(got[i]) for got in ids.values()}) > 1 for i in range(len(measured)))
        return tallies, mismatches

    async def _unit(self, name: str, measured: list[Chat], before: list[Chat], tally: Tally) -> list[list[int]]:
        if name == RAW:
            return self._raw(measured, tally)
        server = self.servers[name]
        for chat in before:
            await render(self.client, server, chat)
        cpu, ticks, own = run_s(server.pid), usage(server.pid).cpu_s, run_s(server.pid, descendants=False)
        got = await asyncio.gather(*(render(self.client, server, chat) for chat in measured))
        tally.cpu_s += run_s(server.pid) - cpu
        tally.tick_cpu_s += usage(server.pid).cpu_s - ticks
        tally.own_cpu_s += run_s(server.pid, descendants=False) - own
        tally.requests += len(measured)
        tally.tokens += [len(ids) for ids in got]
        return list(got)

    def _raw(self, measured: list[Chat], tally: Tally) -> list[list[int]]:
        prompts = [self.texts.rendered(chat) for chat in measured]  # the template's share is not the encode's
        started = time.process_time()
        got = [self.texts.backend.encode(p, add_special_tokens=False).ids for p in prompts]
        tally.cpu_s += time.process_time() - started
        tally.requests += len(measured)
        tally.tokens += [len(ids) for ids in got]
        return got


async def render(client: httpx.AsyncClient, server: Server, chat: Chat, model: str = MODEL) -> list[int]:
    """The token ids of the chat, from the server's render route."""
    answer = await client.post(server.url + ROUTE, json={"model": model, "messages": chat})
    if answer.status_code != 200:
        raise RuntimeError(f"{server.name} answered {answer.status_code}: {answer.text[:300]}")
    if server.name.startswith("token-guard") and answer.headers.get("x-token-guard-render") != "local":
        raise RuntimeError(f"{server.name} did not render locally: {answer.headers.get('x-token-guard-render')}")
    ids: list[int] = answer.json()["token_ids"]
    return ids


def _rss(server: Server) -> dict[str, float]:
    return {"all processes": usage(server.pid).rss_mb, "top process": resident_mb(server.pid)}


def _models_rss(args: argparse.Namespace, texts: Texts, work: Path) -> dict[str, Any]:
    """`token-guard render` serving a model per zoo tokenizer, after one fresh long prompt and one small chat each."""
    from tests.support.zoo import family_dir

    families = args.families.split(",")
    server = start_guard_models({f: family_dir(f) for f in families}, args.max_model_len * 2, work)
    try:

        async def ask() -> None:
            async with httpx.AsyncClient(timeout=600) as client:
                for family in families:
                    for chat in (texts.fresh(-1), texts.small(-100)):
                        await render(client, server, chat, family)

        asyncio.run(ask())
        return {**_rss(server), "models": families}
    finally:
        server.stop()
