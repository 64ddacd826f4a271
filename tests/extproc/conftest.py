"""The Envoy rig for the module that asks for it: one Envoy, a listener per arrangement, the processors and serve
beside each (tests/extproc/rig.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.envoy import cluster, processor
from proxy.server.running import ServerThread
from proxy.settings import load_settings
from tests.extproc.rig import BUDGET, KEYS, MAX_BODY, Gate, Rig, picker, port_of, served, upstream
from tests.support.counting_upstream import STRICT, fake_vllm
from tests.support.envoy import ProcessorThread, envoy
from tests.support.ports import free_port
from tests.support.servers import MODEL, guard


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("envoy")
    gate = Gate()
    with (
        upstream(deepseek_dir, max_model_len=2048, reasoning_parser="deepseek_r1") as (fast_url, fast),
        upstream(deepseek_dir, max_model_len=2048, ttft_s=0.05, itl_s=0.05) as (slow_url, slow),
        ServerThread(gate.app) as gated,
        ServerThread(fake_vllm(renders=False)) as refusing,
    ):
        flags = {"upstream.urls": [slow_url, fast_url], "model.name": MODEL, "model.tokenizer": str(deepseek_dir),
                 "admission.max_inflight_tokens": BUDGET, "server.max_body_bytes": MAX_BODY}  # fmt: skip
        settings = load_settings(flags, environ={})
        keys = work / "keys.toml"
        keys.write_text(KEYS)
        keyed_settings = load_settings({**flags, "upstream.urls": [fast_url]}, environ={}, config_file=keys)
        tight_settings = load_settings({**flags, "upstream.urls": [slow_url], "admission.max_inflight_requests": 1,
                                        "admission.max_queue": 0}, environ={})  # fmt: skip
        template = work / "strict.jinja"
        template.write_text(STRICT)
        strict = {"upstream.url": refusing.url, "model.name": MODEL, "model.tokenizer": str(deepseek_dir),
                  "model.chat_template": str(template)}  # fmt: skip
        strict_settings = load_settings(strict, environ={})
        with (
            ProcessorThread(settings) as proc,
            ProcessorThread(keyed_settings) as keyed,
            ProcessorThread(tight_settings) as tight,
            ProcessorThread(strict_settings) as strict_processor,
            picker(f"127.0.0.1:{port_of(fast_url)}") as (picker_port, stand_in_picker),
            guard(fast_url, deepseek_dir, **{"admission.max_inflight_tokens": BUDGET}) as serve,
            served(keyed_settings) as keyed_serve,
            served(tight_settings) as tight_serve,
            served(strict_settings) as strict_serve,
        ):
            guarded = {"buffered": processor("guard", "BUFFERED"),
                       "duplex": processor("guard", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")}  # fmt: skip
            stand_in = processor("picker", "FULL_DUPLEX_STREAMED", picker=True)  # reads the body, as GIE's
            listeners = {
                "buffered": [guarded["buffered"]], "duplex": [guarded["duplex"]], "slow": [guarded["buffered"]],
                "down": [processor("nobody", "BUFFERED")],
                "picker-first": [stand_in, guarded["duplex"]], "guard-first": [guarded["duplex"], stand_in],
                "keyed-streamed": [processor("keyed", "BUFFERED", "STREAMED")],
                "keyed-none": [processor("keyed", "BUFFERED", "NONE")],
                "keyed-slow": [processor("keyed", "BUFFERED", "STREAMED")],
                "keyed-duplex": [processor("keyed", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
                "tight": [processor("tight", "BUFFERED", "NONE")],
                "gated-streamed": [guarded["buffered"]], "gated-duplex": [guarded["duplex"]],
                "strict": [processor("strict", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
            }  # fmt: skip
            clusters = [cluster("guard", proc.port, grpc=True), cluster("picker", picker_port, grpc=True),
                        cluster("keyed", keyed.port, grpc=True), cluster("tight", tight.port, grpc=True),
                        cluster("nobody", free_port(), grpc=True), cluster("slow", port_of(slow_url)),
                        cluster("gated", port_of(gated.url)), cluster("strict", strict_processor.port, grpc=True),
                        cluster("refusing", port_of(refusing.url))]  # fmt: skip
            for thread in (proc, keyed, tight, strict_processor):
                thread.checked()
            for url in (fast_url, slow_url):  # what the checks sent is forgotten: each test sees its own
                httpx.post(f"{url}/sim/reset", timeout=5)
            routes = {"slow": "slow", "picker-first": "slow", "guard-first": "slow", "tight": "slow",
                      "keyed-slow": "slow", "gated-streamed": "gated", "gated-duplex": "gated",
                      "strict": "refusing"}  # fmt: skip
            with envoy(work, port_of(fast_url), listeners, clusters, routes=routes) as running:
                yield Rig(
                    running,
                    serve.url,
                    fast,
                    slow,
                    proc,
                    keyed,
                    keyed_serve.url,
                    tight,
                    tight_serve.url,
                    strict_serve.url,
                    gate,
                    stand_in_picker,
                    fast_url,
                )
            gate.open.set()
