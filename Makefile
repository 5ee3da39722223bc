# One virtual environment with everything (library, test, benchmark and lint tools).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test check bench mutation ci clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The demo needs only its own extra (YAML and the OpenTelemetry SDK), not the whole
# development set: a fresh clone runs it after a small install.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)  ## the main job: order semantics, the two guards, tracing
	$(BIN)/guardstack demo

test: $(STAMP)  ## every test, asyncio and trio, in virtual time
	$(BIN)/python -m pytest

TYPECHECK := build/typecheck/guardstack

check: $(STAMP)  ## lint, format, strict type checks, the import contract, the guides
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --no-cache --check .
	@# mypy cannot follow the editable install's import hook: give it guardstack/ as links
	mkdir -p $(TYPECHECK)
	for package in pipeline guards wrappers integrations gateway cli; do ln -sfn ../../../$$package $(TYPECHECK)/$$package; done
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)  ## ordering simulation and overhead against peers (not part of the tests)
	$(BIN)/python -m benchmarks.ordering
	$(BIN)/python -m benchmarks.overhead
	$(BIN)/python -m benchmarks.wrappers
	$(BIN)/python -m benchmarks.stack
	$(BIN)/python -m benchmarks.loop
	$(BIN)/python -m benchmarks.resilience
	$(BIN)/python -m benchmarks.loops
	$(BIN)/python -m benchmarks.temporal
	$(BIN)/python -m benchmarks.store
	$(BIN)/python -m benchmarks.agents
	$(BIN)/python -m benchmarks.adaptive --change
	$(BIN)/python -m benchmarks.frameworks
	$(BIN)/python -m benchmarks.model_proxy
	@echo "benchmarks.telemetry needs an older checkout: python -m benchmarks.telemetry --before DIR"

mutation: $(STAMP)  ## every mutant of the core (hours): the score and the survivors
	$(BIN)/python .ci/mutation_sample.py --all --out build/mutation

ci: check test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
