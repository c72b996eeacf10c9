# moe-lab: one command to set up and run each job. Every target creates .venv if it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
# The notebooks that create widgets (test-widgets7 runs these under ipywidgets 7.7.1); 00, 08, 09 and 10
# create none. A notebook that gains a widget belongs here (test_notebooks_static lists the stored widget views).
WIDGET_NOTEBOOKS := $(addprefix notebooks/,01_moe_in_pytorch.ipynb 02_align.ipynb 03_grouped_gemm_pointers.ipynb \
  04_tma_basics.ipynb 05_grouped_gemm_tma.ipynb 06_fused_moe_layer.ipynb 07_performance.ipynb)
# pytest-xdist: the unit tests on every core (XDIST= runs them in one process). The notebooks too, each
# notebook whole on one worker (its cells share a kernel).
XDIST    ?= -n auto
PYTEST   := -m pytest -p no:cacheprovider
NBVAL    := --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg $(XDIST) $(if $(XDIST),--dist loadscope)

UI_STAMP := $(VENV)/.installed-ui
CHROMIUM := /usr/bin/chromium
# Jupyter refuses to run as root unless told; apt-get needs root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
SUDO       := $(if $(filter 0,$(shell id -u)),,sudo)
LAB_ARGS   ?=

# Other supported Triton versions, each in an overlay venv over .venv (.ci/overlay-venv): the unit tests
# run under each of them, and `make compile-check` builds every kernel variant for GPU targets with all four.
# Triton 3.6's interpreter needs numpy < 2.4 (moe_lab.runtime checks it).
OTHER_TRITONS := 3.6.0 3.8.0 3.9.0
OVERLAY_TRITON = .ci/overlay-venv .venv-triton-$$v triton==$$v $$(case $$v in 3.6.*) echo 'numpy<2.4';; esac)

.PHONY: setup prefetch lint demo test test-matrix compile-check test-widgets7 test-fresh-host test-ui test-ui-all test-gpu lab \
  notebooks info doctor clean

# The first setup says what it installs and how large, and pip shows torch's download: PyPI's Linux torch is
# the CUDA build (its CUDA libraries are about 3 GB more to download); PyTorch's CPU index gives the small
# build (.venv about 2 GB in all): PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu before `make`, or
# as `make setup PIP_EXTRA_INDEX_URL=...` (pip reads it from the environment either way).
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell sed -n 's/^torch==//p' requirements-cpu.txt)

$(STAMP): pyproject.toml requirements-cpu.txt
	@echo "== setup: $(VENV) with torch $(TORCH_PIN) and the Triton it pins (requirements-cpu.txt), then moe-lab (editable) with its lab, test, lint and transformers extras"
	@if echo "$(PIP_EXTRA_INDEX_URL) $(PIP_INDEX_URL)" | grep -q "download.pytorch.org/whl/cpu"; then \
	  echo "   torch: PyTorch's CPU build (a few hundred MB); $(VENV) about 2 GB in all."; \
	else \
	  echo "   torch: PyPI's Linux build unless pip is set up otherwise, the CUDA one: about 3 GB more to download than"; \
	  echo "   the CPU build's $(VENV) of about 2 GB. For the CPU build: make setup PIP_EXTRA_INDEX_URL=$(CPU_INDEX)"; \
	fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -r requirements-cpu.txt
	@echo "== setup: moe-lab and its extras (JupyterLab, ipywidgets, matplotlib, the test tools, ruff, transformers: a few hundred MB)"
	$(PY) -m pip install -q -e '.[lab,test,lint,transformers]'
	@echo "== setup done: $$(du -sh $(VENV) | cut -f1) in $(VENV), with $$($(PY) -c 'import torch; print("torch", torch.__version__, "(its CUDA build)" if torch.version.cuda else "(its CPU build)")')"
	touch $(STAMP)

setup: $(STAMP)       ## create .venv (the pinned CPU world, the lab, test, lint and transformers extras), saying what and how large

# The browser test's extras: playwright (its Python package only: it drives Debian's chromium, no download).
$(UI_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[lab,test,ui]'
	touch $(UI_STAMP)

demo: $(STAMP)        ## the main job: the fused MoE layer on real model shapes, checked against PyTorch
	$(VENV)/bin/moe-lab demo

# ruff (pinned in the lint extra; settings in pyproject.toml): lint and formatting, in seconds.
lint: $(STAMP)        ## ruff check and ruff format --check (line length 120; pyproject.toml's [tool.ruff])
	$(VENV)/bin/ruff check --output-format concise .
	$(VENV)/bin/ruff format --check .

test: $(STAMP)        ## the whole test suite: unit tests, then every notebook through nbval (interpreter on a CPU)
	$(PY) $(PYTEST) tests $(XDIST) $(if $(XDIST),--dist worksteal)
	@if [ -n "$(NOTEBOOKS)" ]; then $(PY) $(PYTEST) $(NOTEBOOKS) $(NBVAL); fi

# Under the other Tritons, the kernel tests only (marker `kernels`: kernels against references, the
# interpreter's traps, what depends on the Triton version); the viz, CLI, doctor, notebook and compile
# tests do not depend on which Triton runs the kernels, and run once, in `make test`; so does the property
# fuzz (marker `slow`: random shapes over what the kernel tests' parameters cover, half a minute each time).
test-matrix: $(STAMP) ## the kernel tests (-m kernels) under each other supported Triton (3.6.0, 3.8.0, 3.9.0; .venv has 3.7.1)
	@for v in $(OTHER_TRITONS); do \
	  $(OVERLAY_TRITON) || exit 1; \
	  echo "== kernel tests under Triton $$v"; \
	  .venv-triton-$$v/bin/python $(PYTEST) tests -m "kernels and not slow" -q $(XDIST) $(if $(XDIST),--dist worksteal) || exit 1; done

# Every variant for sm_80, sm_90 and sm_100 under .venv's Triton; under the other Tritons every variant for
# sm_90, the target the tuned tables ship for and where Triton's lowering (TMA, wgmma) changes most between
# releases (sm_80 and sm_100 once each: compiling all three under all four Tritons is most of CI's time).
# The notebooks' launches are recorded (under the interpreter) by the first run and replayed by the others.
OTHER_TARGETS ?= 90
compile-check: $(STAMP) ## every kernel variant compiled for sm_80, sm_90, sm_100 with Triton 3.7.1, for sm_90 with 3.6.0, 3.8.0, 3.9.0 (no GPU)
	@rc=0; echo "== compile check, Triton 3.7.1"; $(PY) .ci/compile_check.py || rc=1; \
	for v in $(OTHER_TRITONS); do $(OVERLAY_TRITON) || exit 1; echo "== compile check, Triton $$v"; \
	  .venv-triton-$$v/bin/python .ci/compile_check.py --targets $(OTHER_TARGETS) || rc=1; done; exit $$rc

notebooks: $(STAMP)   ## rebuild each notebook from its py:percent script, execute it, store outputs (no timestamps)
	cd notebooks && for f in [0-9]*.py; do nb="$${f%.py}.ipynb"; \
	  ../$(VENV)/bin/jupytext --to ipynb -q "$$f" && \
	  ../$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=120 "$$nb" && \
	  ../$(VENV)/bin/nbstripout --keep-output --keep-count --keep-metadata-keys metadata.widgets "$$nb" || exit 1; done

# What the later stages download (the overlay venvs, Debian's chromium), fetched while the tests run:
# .ci/run starts it in the background after `make setup` (downloads, not compiles: the cores stay the tests').
prefetch: $(STAMP)
	@for v in $(OTHER_TRITONS); do $(OVERLAY_TRITON) || exit 1; done
	.ci/overlay-venv $(WIDGETS7_VENV) $(WIDGETS7_PKGS)
	$(MAKE) --no-print-directory $(CHROMIUM)

# The kernel side of the widgets under ipywidgets 7.7.1 (what hosted notebooks run with their own front end):
# an overlay venv over .venv swaps in ipywidgets 7.7.1 and the companions it requires, then the widget tests
# (builders, and a kernel driven as a front end drives it) and the notebooks that create widgets, through nbval.
WIDGETS7_VENV := .venv-ipywidgets-7.7.1
WIDGETS7_PKGS := ipywidgets==7.7.1 widgetsnbextension==3.6.10 jupyterlab-widgets==1.1.11 ipython-genutils==0.2.0
test-widgets7: $(STAMP)   ## widget tests and the notebooks with widgets (nbval) with ipywidgets 7.7.1 instead of 8
	.ci/overlay-venv $(WIDGETS7_VENV) $(WIDGETS7_PKGS)
	$(WIDGETS7_VENV)/bin/python $(PYTEST) tests/workbook/test_viz_*.py $(XDIST) \
	  -W 'ignore:The `ipykernel.comm.Comm` class has been deprecated:DeprecationWarning'
	$(WIDGETS7_VENV)/bin/python $(PYTEST) $(WIDGET_NOTEBOOKS) $(NBVAL)

# Each notebook alone in a fresh hosted runtime: a venv of its own with only torch, Triton, numpy, ipywidgets and
# the Jupyter kernel (hard-linked from .venv: seconds, no download), where the setup cell must install moe-lab
# from this clone and keep those versions (.ci/fresh_host.py says what it checks). Up to each notebook's first
# kernel launch (make test runs every cell already); FRESH_HOST_ARGS=--all-cells runs every cell.
FRESH_HOST_ARGS ?=
test-fresh-host: $(STAMP) ## each notebook alone in a fresh host venv (torch, Triton, ipywidgets only): setup cell installs moe-lab
	$(PY) .ci/fresh_host.py $(FRESH_HOST_ARGS)

# The browser test in CI: notebook 02 run in JupyterLab in headless Chromium, its widget drawn and its slider
# dragged until the figure is redrawn: what only a browser shows (the widgets' front end in JupyterLab 4, the
# comm round trip, a figure replaced in an Output widget). test-ui-all runs every notebook in the browser too
# (Run All, no error output, every widget drawn, screenshots): about 290 s on 2 cores against 50 s for the
# slider test, and mostly what nbval checks already, so it is opt-in, not in CI.
UI_TESTS ?= -k test_align_widget_redraws_on_slider
test-ui: $(UI_STAMP) $(CHROMIUM)  ## browser test: notebook 02's widget in JupyterLab in headless Chromium, slider moved (screenshots in tests/ui/artifacts/)
	MOE_LAB_CHROMIUM=$(CHROMIUM) $(PY) $(PYTEST) tests/ui --run-ui $(UI_TESTS)

test-ui-all: $(UI_STAMP) $(CHROMIUM)  ## browser test: every notebook run in JupyterLab in headless Chromium, widgets live
	$(MAKE) test-ui UI_TESTS=

$(CHROMIUM):
	@echo "installing Debian's chromium"
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

test-gpu: $(STAMP)    ## GPU-only tests (on an H200)
	$(PY) -m pytest tests -m gpu

lab: $(STAMP)         ## JupyterLab on notebooks/ (ipywidgets included); open the URL it prints. LAB_ARGS="--port=8890" etc.
	@echo "JupyterLab on notebooks/: open the http://localhost:...?token=... URL printed below; Ctrl-C stops it."
	@echo "On a remote machine: ssh -N -L 8888:localhost:8888 you@host from your laptop first (LAB_ARGS=--port=8888)."
	$(VENV)/bin/jupyter lab --no-browser --ServerApp.root_dir=notebooks $(ALLOW_ROOT) $(LAB_ARGS)

info: $(STAMP)
	$(VENV)/bin/moe-lab info

doctor: $(STAMP)      ## check this environment for moe-lab and the notebooks, and say what to fix
	$(VENV)/bin/moe-lab doctor

clean:
	rm -rf $(VENV) .venv-* build *.egg-info
