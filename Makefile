# Each target installs what it needs into .venv: the CPU build of torch first (a plain `torch` requirement would
# pull a CUDA build of several GB), then the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: install demo test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install  ## the main job: train a small causal TNN on the embedded corpus, report perplexity, generate
	$(PY) run_scripts/demo.py

test: install  ## the test suite
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
