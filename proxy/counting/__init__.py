"""Counting prompt tokens exactly as vLLM does: tokenizers and templates, rendering, the cached counting engine, and
the registry of the models counted for. Pure: no HTTP."""
