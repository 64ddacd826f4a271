"""`python -m bench <command>`: each subcommand is one module with `add_arguments(parser)` and `main(args)`."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {  # name -> (module, help)
    "load": ("bench.load", "run an OpenAI-compatible load against a server and summarize it"),
    "report": ("bench.report", "run the comparison (direct, nginx, token-guard, LiteLLM) and write the report"),
    "counting": ("bench.counting", "time exact counting against the raw tokenizer floor (no server needed)"),
    "overhead": ("bench.overhead", "what counting adds end to end through the proxy, as a ratio to the encode floor"),
    "count-source": ("bench.count_source", "what counting through the upstream adds, against counting locally"),
    "chunking": ("bench.chunking", "an N-part chunked request against one part alone (fan-out at work)"),
    "admission": ("bench.admission", "a burst of long requests against a small KV cache, admission off vs on"),
    "ceiling": ("bench.ceiling", "the proxies as the bottleneck, in front of an upstream that answers at once"),
    "plot-ceiling": ("bench.ceiling_plots", "the PNG plots of a ceiling result: CPU per request and requests/s"),
    "calls": ("bench.calls", "Python function calls per request, checkouts side by side (a count: host load aside)"),
    "tokens": ("bench.tokens", "CPU per render: the guard's token ids against vLLM's render route and raw tokenizers"),
    "bodies": ("bench.bodies", "what the largest bodies cost the guard: time, peak and final RSS, /livez meanwhile"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        importlib.import_module(module).add_arguments(commands.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    result: int = importlib.import_module(COMMANDS[args.command][0]).main(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
