"""`token-guard simulate`: serve the simulator on a port until Ctrl-C (the CLI hands it the flags after `simulate`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from proxy.assets import write_demo_tokenizer_dir
from simulator.profiles import PROFILES


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="token-guard simulate", description="Run the vLLM simulator.")
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="Hugging Face tokenizer directory (default: the demo DeepSeek one)"
    )
    parser.add_argument("--chat-template", type=Path, default=None, help="Jinja chat template file to use instead")
    parser.add_argument("--model", default="tiny", help="served model name (default: tiny)")
    parser.add_argument("--alias", action="append", default=[], help="another served name (repeatable), as vLLM's "
                        "--served-model-name tiny other")  # fmt: skip
    parser.add_argument("--max-model-len", type=int, default=2048, help="context window in tokens (default: 2048)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="0.32", help="vLLM release to imitate")
    parser.add_argument("--ttft", type=float, default=0.0, help="seconds before the first token (default: 0)")
    parser.add_argument("--itl", type=float, default=0.0, help="seconds between tokens (default: 0)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="port to listen on (default: 8001)")
    parser.add_argument(
        "--kv-capacity", type=int, default=None, help="KV cache in tokens; over it every request slows (preemption)"
    )
    parser.add_argument("--root", default=None, help="`root` shown by /v1/models (default: the tokenizer path)")
    parser.add_argument("--reasoning-parser", default=None, help="as vLLM's: without one, thinking budgets are refused")
    parser.add_argument(
        "--max-num-queued-reqs", type=int, default=None, help="as vLLM's: over it, requests get 503 (engine busy)"
    )
    parser.add_argument("--enable-prompt-embeds", action="store_true", help="as vLLM's: completions take prompt_embeds")
    parser.add_argument("--hidden-size", type=int, default=64, help="the hidden size prompt_embeds must have")
    parser.add_argument("--enable-scale-out", action="store_true", help="as vLLM's: serve the render routes")
    parser.add_argument(
        "--responses-store",
        action="store_true",
        help="as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1 (which also turns it on): responses stored for "
        "retrieval and previous_response_id, background mode served",
    )


def store_in_environment() -> bool:
    """vLLM's own switch for its Responses store, read as vLLM reads it (envs.py: an integer, non-zero is on)."""
    try:
        return bool(int(os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0")))
    except ValueError:
        return False


def demo_tokenizer_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return write_demo_tokenizer_dir(cache / "token-guard" / "demo-tokenizer")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from simulator import SimulatorSettings, create_app

    try:
        settings = SimulatorSettings(
            tokenizer=args.tokenizer or demo_tokenizer_dir(),
            model=args.model,
            aliases=tuple(args.alias),
            max_model_len=args.max_model_len,
            profile=args.profile,
            chat_template=args.chat_template,
            ttft_s=args.ttft,
            itl_s=args.itl,
            root=args.root,
            kv_capacity_tokens=args.kv_capacity,
            reasoning_parser=args.reasoning_parser,
            max_num_queued_reqs=args.max_num_queued_reqs,
            enable_prompt_embeds=args.enable_prompt_embeds,
            hidden_size=args.hidden_size,
            responses_store=args.responses_store or store_in_environment(),
            enable_scale_out=args.enable_scale_out,
        )
        app = create_app(settings)
    except (OSError, ValueError) as exc:
        print(f"token-guard simulate: {exc}", file=sys.stderr)
        return 2
    print(
        f"vLLM {settings.vllm_version} simulator serving {settings.model!r} "
        f"(max_model_len {settings.max_model_len}) on http://{args.host}:{args.port}",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
