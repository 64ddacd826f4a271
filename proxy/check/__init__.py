"""`token-guard check`: compare the guard's counts with the upstream's, to catch tokenizer and template drift."""
