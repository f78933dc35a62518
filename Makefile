# Each target installs what it needs into .venv: the CPU build of torch first (a plain `torch` requirement would
# pull a CUDA build of several GB), then the project.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: install demo test glue clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install  ## the main job: train a small causal TNN on the embedded corpus, report perplexity, generate
	$(PY) run_scripts/train_clm.py --config_name small --output_dir outputs/demo --vocab_size 2048 \
		--block_size 128 --per_device_train_batch_size 16 --learning_rate 2e-3 --weight_decay 0.01 \
		--num_warmup_steps 20 --max_train_steps 200 --eval_steps 100 \
		--sample_prompt "The assert statement" --sample_prompt "A function definition"

test: install  ## the test suite
	$(PY) -m pytest -q

glue: install  ## GLUE: pretrain a small TNN and a BERT of matched size (MLM), finetune both on every local GLUE task
	$(PY) run_scripts/glue_recipe.py --results_dir results/glue

clean:
	rm -rf $(VENV) build *.egg-info
