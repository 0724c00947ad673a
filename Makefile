# The two commands the README promises: `make serve` and `make test`.
# Both create .venv/ at the repository root when it is missing and install the host, every
# bundled plugin and the ComfyUI node pack in editable mode with the dev extras (werk-omlx with
# its test extras: MLX for the oMLX stand-in).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.werk-setup
PLUGINS := plugins/werk-llamacpp plugins/werk-vllm plugins/werk-omlx plugins/werk-media \
	plugins/werk-transformers plugins/werk-onnx plugins/werk-mlx
# ComfyUI's node pack (installed for its tests; ComfyUI loads it from its custom_nodes folder).
INTEGRATIONS := integrations/comfyui-werk
PYPROJECTS := pyproject.toml $(addsuffix /pyproject.toml,$(PLUGINS) $(INTEGRATIONS))

.PHONY: n8n-nodes n8n-runtime setup llama-server vllm-env media-env qwen-tts-env transformers-env onnx-env mlx-env mlx-vlm-env llamacpp-inproc-env browser demo serve test lint typecheck pytest screenshots clean

# The test suite's managed backend environments (multi-gigabyte), cached across runs like the
# llama-server build; `werk backends install` is a no-op with --if-needed once one is ready.
TEST_BACKENDS ?= $(HOME)/.cache/werk/backends

$(STAMP): $(PYPROJECTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' \
		$(addprefix -e ,$(filter-out plugins/werk-omlx,$(PLUGINS))) -e 'plugins/werk-omlx[test]' \
		$(addprefix -e ,$(INTEGRATIONS))
	# Bytecode for the editable sources, as a wheel install has (PYTHONDONTWRITEBYTECODE=1
	# would otherwise make every `werk` command compile its modules again: about 50 ms).
	$(BIN)/python -m compileall -q werk $(PLUGINS) $(INTEGRATIONS) > /dev/null
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

# torch (CPU build) and Transformers for the Transformers text-generation worker.
transformers-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install transformers --if-needed

# ONNX Runtime GenAI (CPU) and its model builder, for the onnx-genai and onnx-runner backends.
onnx-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install onnx --if-needed

# MLX (CPU build) and mlx-lm for the mlx backend's runner (and torch for its demo model).
mlx-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install mlx --if-needed

# MLX-VLM 0.7.10 with the Transformers it works with (5.14.0), for the mlx-vlm backend's runner.
mlx-vlm-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install mlx-vlm --if-needed

# llama-cpp-python built from its sdist (CPU, the llama-server build's ISA flags; the wheel is
# cached under ~/.cache/werk/wheels, so a fresh clone reuses it) for the llamacpp-inproc backend.
llamacpp-inproc-env: setup
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) $(BIN)/werk backends install llamacpp-inproc --if-needed

# The n8n package integrations/n8n-nodes-werk: its dev tools from the committed lockfile
# (--ignore-scripts: eslint-plugin-n8n-nodes-base's preinstall script refuses npm), the
# TypeScript build and n8n's own lint in strict mode.
N8N_PACKAGE := integrations/n8n-nodes-werk
n8n-nodes:
	cd $(N8N_PACKAGE) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	cd $(N8N_PACKAGE) && npm run --silent build > /dev/null && npm run --silent lint

# A real n8n for the workflow tests, installed once under ~/.cache/werk/n8n (about 2 GB): 2.8.4 is
# the newest n8n that runs on Node 20. `xlsx` is pinned to 0.18.5, the last release on the npm
# registry (n8n asks for a tarball from a CDN); npm_config_nodedir: build native modules
# against the installed Node's headers. Built in a scratch folder, published with one rename.
N8N_VERSION := 2.8.4
N8N_DIR ?= $(HOME)/.cache/werk/n8n/$(N8N_VERSION)
n8n-runtime:
	@test -x $(N8N_DIR)/node_modules/.bin/n8n || { \
		rm -rf $(N8N_DIR).building && mkdir -p $(N8N_DIR).building && \
		echo '{"name": "werk-n8n-runtime", "private": true, "dependencies": {"n8n": "$(N8N_VERSION)"}, "overrides": {"xlsx": "0.18.5"}}' \
			> $(N8N_DIR).building/package.json && \
		echo "installing n8n $(N8N_VERSION) into $(N8N_DIR) (a few minutes, once)" && \
		(cd $(N8N_DIR).building && npm_config_nodedir=/usr npm install --no-audit --no-fund \
			--loglevel=error) && \
		mv $(N8N_DIR).building $(N8N_DIR); }

# Debian's Chromium for the dashboard's browser tests (Playwright drives it through
# executable_path). Installed when missing, as root; otherwise this says what to install.
browser:
	@command -v chromium > /dev/null || { \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq --no-install-recommends chromium > /dev/null; \
		else \
			echo "the dashboard tests need Debian's chromium: sudo apt-get install --no-install-recommends chromium" >&2; \
			exit 1; \
		fi; }

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

pytest: setup llama-server vllm-env media-env qwen-tts-env transformers-env onnx-env mlx-env mlx-vlm-env \
		llamacpp-inproc-env browser n8n-nodes n8n-runtime
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) WERK_N8N_DIR=$(N8N_DIR) $(BIN)/pytest

# The dashboard screenshots in docs/images/, taken by its browser test.
screenshots: setup llama-server media-env browser
	WERK_BACKENDS_DIR=$(TEST_BACKENDS) WERK_DASHBOARD_SCREENSHOTS=docs/images \
		$(BIN)/pytest -q tests/dashboard/test_dashboard_browser.py

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .pytest_cache .hypothesis
