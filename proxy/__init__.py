"""token-guard: a token-aware, OpenAI-compatible reverse proxy for vLLM."""

import os

# transformers announces "PyTorch was not found. Models won't be available..." when it is imported without torch.
# token-guard only uses its tokenizers and chat templates, never a model, so that line is noise that reads like an
# error. It is transformers' one "advisory" warning, and this is its documented switch; every other warning stays.
# Set here, before any of our modules imports transformers, so every entry point (CLI, python -m, bench) gets it.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
