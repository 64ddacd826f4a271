"""`token-guard doctor`: compare the guard's counts with the upstream's, to catch tokenizer and template drift."""
