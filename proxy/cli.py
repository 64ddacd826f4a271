"""The `token-guard` command: `serve` (the proxy), `render` (only the render routes, for a router's token ids),
`extproc` (the guard as Envoy's external processor), `simulate` (the vLLM simulator) and `demo` (both, with a tour).

Commands only build settings and hand them to the server; nothing here holds logic of its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from proxy.counting.tokenizer import TokenizerLoadError
from proxy.exchange.logs import configure_logging
from proxy.settings import Settings, SettingsError, load_settings
from proxy.settings.loader import WORKER_SETUP

SIMULATOR_MODULES = {"simulator", "starlette", "httpx", "multipart", "python_multipart"}  # what the extra brings
FLAGS = {  # flag destination -> settings key
    "host": "server.host",
    "port": "server.port",
    "log_level": "server.log_level",
    "log_format": "server.log_format",
    "workers": "server.workers",
    "upstream": "upstream.url",
    "min_output_tokens": "policy.min_output_tokens",
    "default_max_tokens": "policy.default_max_tokens",
    "model": "model.name",
    "tokenizer": "model.tokenizer",
    "chat_template": "model.chat_template",
    "max_model_len": "model.max_model_len",
    "tokenizer_mode": "model.tokenizer_mode",
    "default_chat_template_kwargs": "model.default_chat_template_kwargs",
    "reasoning_effort_map": "model.reasoning_effort_map",
    "count_source": "counting.source",
    "redis_url": "redis.url",
    "vllm_version": "render.vllm_version",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="token-guard", description="A token-aware OpenAI-compatible proxy for vLLM.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = add_settings_flags(commands.add_parser("serve", help="run the proxy in front of an upstream"))
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", help="port to listen on (default 8080)")
    serve.add_argument("--min-output-tokens", help="reject prompts that leave fewer tokens for the answer")
    serve.add_argument("--default-max-tokens", help='max_tokens for chat requests without one: N or "50%%"')
    serve.add_argument("--log-format", help="text (default) or json: one JSON object per line")
    serve.add_argument("--workers", help="processes serving the port, e.g. one per core (default 1)")
    render = add_settings_flags(commands.add_parser(
        "render", help="answer only vLLM's render routes (token ids for a router), with no upstream"))  # fmt: skip
    render.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    render.add_argument("--port", help="port to listen on (default 8080)")
    render.add_argument("--log-format", help="text (default) or json: one JSON object per line")
    render.add_argument("--workers", help="processes serving the port, e.g. one per core (default 1)")
    render.add_argument("--vllm-version", help="the vLLM release whose rules and answer shape to follow (e.g. 0.32.0)")
    extproc = add_settings_flags(commands.add_parser("extproc", help="run the guard as Envoy's external processor"))
    extproc.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    extproc.add_argument("--port", help="gRPC port to listen on (default 9002: extproc.port)")
    extproc.add_argument("--log-format", help="text (default) or json: one JSON object per line")
    doctor = commands.add_parser("doctor", aliases=["check"], help="compare the guard's token counts with vLLM's")
    check = add_settings_flags(doctor)
    check.add_argument("--samples", type=Path, help="JSONL file of chat or completions requests to check as well")
    check.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the upstream (default 5)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")

    # simulate's flags are the simulator's own (simulator/command.py), read there: it is imported only when run
    commands.add_parser("simulate", help="run the vLLM simulator (the simulator extra)", add_help=False)
    demo = commands.add_parser("demo", help="the simulator and the guard on loopback, a short tour (simulator extra)")
    demo.add_argument("--port", type=int, default=8080, help="port for the guard (a free one if taken)")
    demo.add_argument("--once", action="store_true", help="exit after the tour instead of serving")
    return parser


def add_settings_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags `serve`, `extproc` and `doctor` share: where the config, the upstream and the model are."""
    parser.add_argument("--config", type=Path, help="TOML settings file (also TOKEN_GUARD_CONFIG)")
    parser.add_argument("--upstream", help="base URL of vLLM or any OpenAI-compatible server (replicas: a,b)")
    parser.add_argument("--model", help="served model name clients send as `model`")
    parser.add_argument("--tokenizer", help="tokenizer directory, tokenizer.json, or cached Hugging Face id")
    parser.add_argument("--chat-template", help="chat template file overriding the tokenizer's")
    parser.add_argument("--max-model-len", help="context window in tokens (default: asked from the upstream)")
    parser.add_argument("--tokenizer-mode", help="as vLLM's: auto (decide as vLLM does), hf or mistral")
    parser.add_argument(
        "--default-chat-template-kwargs", help="as vLLM's: a JSON object, e.g. '{\"enable_thinking\": false}'"
    )
    parser.add_argument("--reasoning-effort-map", help='as vLLM\'s (0.33+): a JSON object, e.g. \'{"minimal": "low"}\'')
    parser.add_argument("--count-source", help="who counts prompts: auto (default), local or upstream")
    parser.add_argument("--log-level", help="critical, error, warning, info or debug")
    parser.add_argument("--redis-url", help="share the admission budget with every guard using this Redis")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "simulate":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "serve":
            return serve(settings_from(args), flags_from(args), args.config)
        if args.command == "render":  # the proxy's app with only its render routes and its own, asking no upstream
            flags = {**flags_from(args), "render.only": True, "render.local": True}
            return serve(load_settings(flags, config_file=args.config), flags, args.config)
        if args.command == "extproc":
            return extproc(settings_from(args, port="extproc.port"))
        if args.command in ("doctor", "check"):
            from proxy.doctor.run import run_doctor

            if args.command == "check":  # its name until 2026-12: `make check` lints, this compares counts
                print("token-guard: `token-guard check` is now `token-guard doctor`", file=sys.stderr)
            return run_doctor(settings_from(args), args.samples, args.wait, args.json)
        if args.command == "simulate":
            return simulate(rest)
        return demo(args.port, args.once)
    except (SettingsError, TokenizerLoadError) as exc:
        print(f"token-guard: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def simulate(argv: list[str]) -> int:
    try:
        from simulator import command
    except ModuleNotFoundError as exc:
        return _without_simulator("simulate", exc)
    return command.main(argv)


def demo(port: int, once: bool) -> int:
    try:
        from proxy.demo import run_demo
    except ModuleNotFoundError as exc:
        return _without_simulator("demo", exc)
    return run_demo(port=port, once=once)


def _without_simulator(command: str, exc: ModuleNotFoundError) -> int:
    """The simulator and its libraries come with the simulator extra; a production install (the image) has neither."""
    if (exc.name or "").split(".")[0] not in SIMULATOR_MODULES:
        raise exc
    print(f"token-guard: error: {command} needs the simulator (simulator/ beside proxy/, and the simulator extra: "
          f"pip install '.[simulator]' in a clone; a production image has neither): {exc}",
          file=sys.stderr)  # fmt: skip
    return 2


def flags_from(args: argparse.Namespace, port: str = "server.port") -> dict[str, Any]:
    """The settings the flags give; `port`: the setting --port sets."""
    flags = {FLAGS[dest]: getattr(args, dest) for dest in FLAGS if getattr(args, dest, None)}
    if "server.port" in flags and port != "server.port":
        flags[port] = flags.pop("server.port")
    return flags


def settings_from(args: argparse.Namespace, port: str = "server.port") -> Settings:
    return load_settings(flags_from(args, port), config_file=args.config)


def serve(settings: Settings, flags: dict[str, Any], config_file: Path | None) -> int:
    import uvicorn

    from proxy.server import worker
    from proxy.server.running import freeze_heap, uvicorn_options

    configure_logging(settings.server.log_level, settings.server.log_format)
    server = settings.server
    options = {"host": server.host, "port": server.port, "log_level": "warning", **uvicorn_options(server)}
    upstream = "none: render routes only" if settings.render.only else ", ".join(settings.upstream.urls)
    logging.getLogger("token_guard").info(
        "token-guard listening on http://%s:%d with %d worker(s), upstream %s", server.host, server.port,
        server.workers, upstream,
    )  # fmt: skip
    # uvicorn drains on SIGTERM, then raises it again, to die of it: the stop was asked for and done, so exit 0
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        if server.workers == 1:
            from proxy.counting.registry import ModelRegistry
            from proxy.server.app import create_app

            app = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
            freeze_heap()
            uvicorn.run(app, **options)
        else:  # each worker builds its own app from the same flags and config file (proxy/server/worker.py)
            os.environ[WORKER_SETUP] = worker.handover(flags, config_file)
            uvicorn.run("proxy.server.worker:app", factory=True, workers=server.workers, **options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _stopped(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(0)


def extproc(settings: Settings) -> int:
    """The guard as Envoy's external processor, until SIGTERM (proxy/extproc/)."""
    try:
        from proxy.extproc.service import serve as serve_extproc
    except ImportError as exc:
        print(f"token-guard: error: extproc needs the extproc extra (pip install 'token-guard[extproc]'): {exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    from proxy.counting.registry import ModelRegistry
    from proxy.server.running import freeze_heap

    configure_logging(settings.server.log_level, settings.server.log_format)
    registry = ModelRegistry.from_settings(settings.models, settings.counting)
    freeze_heap()
    serve_extproc(settings, registry)
    return 0
