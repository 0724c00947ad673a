# The two commands the README promises: `make serve` and `make test`.
# Both create .venv/ at the repository root when it is missing and install the host and every
# bundled plugin in editable mode with the dev extras.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.werk-setup
PLUGINS := plugins/werk-llamacpp plugins/werk-vllm plugins/werk-omlx plugins/werk-media
PYPROJECTS := pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))

.PHONY: setup serve test lint typecheck pytest clean

$(STAMP): $(PYPROJECTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(addprefix -e ,$(PLUGINS))
	@touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(BIN)/werk plugins
	$(BIN)/werk capabilities

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

pytest: setup
	$(BIN)/pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache .hypothesis
