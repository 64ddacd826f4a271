"""Benchmarks of token-guard: a load generator, a comparison report against direct, nginx and LiteLLM, and a
micro-benchmark of counting. Never part of `make test`."""

import proxy  # noqa: F401  (first: it quiets transformers' "PyTorch was not found" advisory for every bench command)
