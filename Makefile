# moe-lab: one command to set up and run each job. Every target creates .venv if it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))

.PHONY: demo test test-gpu lab notebooks info clean

$(STAMP): pyproject.toml requirements-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-cpu.txt
	$(PY) -m pip install -q -e '.[lab,test]'
	touch $(STAMP)

demo: $(STAMP)        ## the main job: the fused MoE layer on real model shapes, checked against PyTorch
	$(VENV)/bin/moe-lab demo

test: $(STAMP)        ## the whole test suite: unit tests, then every notebook through nbval (interpreter on a CPU)
	$(PY) -m pytest tests -p no:cacheprovider
	@if [ -n "$(NOTEBOOKS)" ]; then $(PY) -m pytest $(NOTEBOOKS) --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider; fi

notebooks: $(STAMP)   ## rebuild each notebook from its py:percent script, execute it, store outputs (no timestamps)
	cd notebooks && for f in [0-9]*.py; do nb="$${f%.py}.ipynb"; \
	  ../$(VENV)/bin/jupytext --to ipynb -q "$$f" && \
	  ../$(VENV)/bin/jupyter execute --inplace --kernel_name=python3 "$$nb" && \
	  ../$(VENV)/bin/nbstripout --keep-output --keep-count "$$nb" || exit 1; done

test-gpu: $(STAMP)    ## GPU-only tests (on an H200)
	$(PY) -m pytest tests -m gpu

lab: $(STAMP)         ## JupyterLab on notebooks/
	$(VENV)/bin/jupyter lab notebooks/

info: $(STAMP)
	$(VENV)/bin/moe-lab info

clean:
	rm -rf $(VENV) build *.egg-info
