"""The Envoy rig for the module that asks for it: one Envoy, a listener per arrangement, the processors and serve
beside each (tests/extproc/rig.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.envoy import cluster, processor
from proxy.server.running import ServerThread
from proxy.settings import load_settings
from tests.extproc.rig import BUDGET, GATEWAY, KEYS, MAX_BODY, Gate, Rig, picker, port_of, served, upstream
from tests.support.counting_upstream import STRICT, fake_vllm
from tests.support.envoy import ProcessorThread, envoy
from tests.support.ports import free_port
from tests.support.raw_upstream import RawUpstream
from tests.support.servers import MODEL, guard


def overriding(ext_proc: dict[str, Any]) -> dict[str, Any]:
    """A BUFFERED filter that sends no request trailers unless the processor asks (allow_mode_override)."""
    config = ext_proc["typed_config"]
    config["processing_mode"]["request_trailer_mode"] = "SKIP"
    config["allow_mode_override"] = True
    return ext_proc


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("envoy")
    gate = Gate()
    with (
        upstream(deepseek_dir, max_model_len=2048, reasoning_parser="deepseek_r1", responses_store=True) as (
            fast_url,
            fast,
        ),
        upstream(deepseek_dir, max_model_len=2048, ttft_s=0.05, itl_s=0.05) as (slow_url, slow),
        ServerThread(gate.app) as gated,
        ServerThread(fake_vllm(renders=False)) as refusing,
        RawUpstream() as raw,
    ):
        flags = {"upstream.urls": [slow_url, fast_url], "model.name": MODEL, "model.tokenizer": str(deepseek_dir),
                 "admission.max_inflight_tokens": BUDGET, "server.max_body_bytes": MAX_BODY,
                 "render.local": True}  # fmt: skip
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
        gateway_settings = load_settings({**flags, **GATEWAY, "upstream.urls": [fast_url]}, environ={})
        trusting_settings = load_settings({**flags, "extproc.picker_sets_destination": True}, environ={})
        with (
            ProcessorThread(settings) as proc,
            ProcessorThread(keyed_settings) as keyed,
            ProcessorThread(tight_settings) as tight,
            ProcessorThread(strict_settings) as strict_processor,
            ProcessorThread(gateway_settings) as gateway,
            ProcessorThread(trusting_settings) as trusting,
            picker(f"127.0.0.1:{port_of(fast_url)}") as (picker_port, stand_in_picker),
            guard(fast_url, deepseek_dir, **{"admission.max_inflight_tokens": BUDGET, "render.local": True}) as serve,
            served(keyed_settings) as keyed_serve,
            served(tight_settings) as tight_serve,
            served(strict_settings) as strict_serve,
            served(gateway_settings) as gateway_serve,
        ):
            guarded = {"buffered": processor("guard", "BUFFERED"),
                       "duplex": processor("guard", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")}  # fmt: skip
            stand_in = processor("picker", "FULL_DUPLEX_STREAMED", picker=True)  # reads the body, as GIE's
            listeners = {
                "buffered": [guarded["buffered"]], "duplex": [guarded["duplex"]], "slow": [guarded["buffered"]],
                "slow-duplex": [guarded["duplex"]],
                "down": [processor("nobody", "BUFFERED")],
                "picker-first": [stand_in, processor("trusting", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
                "guard-first": [guarded["duplex"], stand_in],
                "keyed-streamed": [processor("keyed", "BUFFERED", "STREAMED")],
                "keyed-none": [processor("keyed", "BUFFERED", "NONE")],
                "keyed-slow": [processor("keyed", "BUFFERED", "STREAMED")],
                "keyed-duplex": [processor("keyed", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
                "tight": [processor("tight", "BUFFERED", "NONE")],
                "gated-streamed": [guarded["buffered"]], "gated-duplex": [guarded["duplex"]],
                "strict": [processor("strict", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
                "gateway": [processor("gateway", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
                "gateway-buffered": [processor("gateway", "BUFFERED")],
                "raw-duplex": [guarded["duplex"]], "raw-buffered": [guarded["buffered"]],
                "buffered-override": [overriding(processor("guard", "BUFFERED"))],
            }  # fmt: skip
            clusters = [cluster("guard", proc.port, grpc=True), cluster("picker", picker_port, grpc=True),
                        cluster("keyed", keyed.port, grpc=True), cluster("tight", tight.port, grpc=True),
                        cluster("nobody", free_port(), grpc=True), cluster("slow", port_of(slow_url)),
                        cluster("gated", port_of(gated.url)), cluster("strict", strict_processor.port, grpc=True),
                        cluster("refusing", port_of(refusing.url)), cluster("gateway", gateway.port, grpc=True),
                        cluster("trusting", trusting.port, grpc=True),
                        cluster("raw", raw.port, trailers=True)]  # fmt: skip
            for thread in (proc, keyed, tight, strict_processor, gateway, trusting):
                thread.checked()
            for url in (fast_url, slow_url):  # what the checks sent is forgotten: each test sees its own
                httpx.post(f"{url}/sim/reset", timeout=5)
            routes = {"slow": "slow", "slow-duplex": "slow", "picker-first": "slow", "guard-first": "slow",
                      "tight": "slow", "keyed-slow": "slow", "gated-streamed": "gated", "gated-duplex": "gated",
                      "strict": "refusing", "raw-duplex": "raw", "raw-buffered": "raw"}  # fmt: skip
            # the gateway's own prefix route, which rewrites it too: what reaches vLLM is still the processor's path
            rewrite = {
                "match": {"prefix": "/llama/"},
                "route": {"cluster": "vllm", "prefix_rewrite": "/", "timeout": "0s"},
            }
            with envoy(work, port_of(fast_url), listeners, clusters, routes=routes,
                       first_routes={"gateway": rewrite}) as running:  # fmt: skip
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
                    trusting,
                    gateway,
                    gateway_serve.url,
                    raw,
                    fast_url,
                )
            gate.open.set()
