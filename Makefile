# The two commands the README promises: `make serve` and `make test`.
# Both create .venv/ at the repository root when it is missing and install the host and every
# bundled plugin in editable mode with the dev extras (werk-omlx with its test extras: MLX for
# the oMLX stand-in).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.werk-setup
PLUGINS := plugins/werk-llamacpp plugins/werk-vllm plugins/werk-omlx plugins/werk-media
PYPROJECTS := pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS))

.PHONY: setup llama-server vllm-env media-env qwen-tts-env demo serve test lint typecheck pytest clean

# The test suite's managed backend environments (multi-gigabyte), cached across runs like the
# llama-server build; `werk backends install` is a no-op with --if-needed once one is ready.
TEST_BACKENDS ?= $(HOME)/.cache/werk/backends

$(STAMP): $(PYPROJECTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' \
		$(addprefix -e ,$(filter-out plugins/werk-omlx,$(PLUGINS))) -e 'plugins/werk-omlx[test]'
	# Bytecode for the editable sources, as a wheel install has (PYTHONDONTWRITEBYTECODE=1
	# would otherwise make every `werk` command compile its modules again: about 50 ms).
	$(BIN)/python -m compileall -q werk $(PLUGINS) > /dev/null
	@touch $(STAMP)

setup: $(STAMP)

# Build (once per llama.cpp source version; cached under ~/.cache/werk) the real llama-server.
llama-server: setup
	$(BIN)/python scripts/build_llama_server.py

# vLLM's CPU build in a managed environment (werk backends install vllm), for the vLLM tests.
vllm-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install vllm --if-needed

# torch (CPU build), Diffusers and Transformers for the media worker, for the media tests.
media-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install media --if-needed

# qwen-tts 0.1.1 (Transformers 4.57.3, its own environment) for the Qwen3-TTS tests.
qwen-tts-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install qwen-tts --if-needed

# The embedded default model: a small generated GGUF imported as `demo` (idempotent).
demo: llama-server
	$(BIN)/werk models create-demo --id demo

PORT ?= 11434

# Serves every imported model (demo included), each loaded on its first request; a model
# imported while it runs is served at once.
serve: demo
	$(BIN)/werk serve --port $(PORT)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

pytest: setup llama-server vllm-env media-env qwen-tts-env
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache .hypothesis
