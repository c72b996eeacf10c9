# moe-lab: one command to set up and run each job. Every target creates .venv if it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-gpu lab notebooks info clean

$(STAMP): pyproject.toml requirements-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-cpu.txt
	$(PY) -m pip install -q -e '.[lab,test]'
	touch $(STAMP)

demo: $(STAMP)        ## the main job: the fused MoE layer on real model shapes, checked against PyTorch
	$(VENV)/bin/moe-lab demo

test: $(STAMP)        ## the whole test suite (unit tests + notebooks through nbval), interpreter on a CPU
	TRITON_INTERPRET=$${TRITON_INTERPRET-$$($(PY) -c 'import torch;print(0 if torch.cuda.is_available() else 1)')} \
	  $(PY) -m pytest tests notebooks --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider

test-gpu: $(STAMP)    ## GPU-only tests (on an H200)
	$(PY) -m pytest tests -m gpu

lab: $(STAMP)         ## JupyterLab on notebooks/
	$(VENV)/bin/jupyter lab notebooks/

info: $(STAMP)
	$(VENV)/bin/moe-lab info

clean:
	rm -rf $(VENV) build *.egg-info
