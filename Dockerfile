# The CPU world with JupyterLab, for learners whose laptop cannot install Triton (macOS, Windows):
#   docker build -t moe-lab .
#   docker run --rm -p 8888:8888 moe-lab        # then open the http://127.0.0.1:8888/lab?token=... URL it prints
# Kernels run under Triton's interpreter (no GPU needed). Works on x86-64 and arm64 (Apple silicon) hosts:
# PyPI has Linux wheels of torch and Triton for both. See docs/container.md.
FROM python:3.11-slim
# On x86-64, PyPI's torch is the CUDA build (about 3 GB more); PyTorch's CPU index gives a small one:
#   docker build --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu -t moe-lab .
ARG PIP_EXTRA_INDEX_URL=

RUN apt-get update && apt-get install -y --no-install-recommends make git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /moe-lab
# Dependencies first, so that editing a notebook does not reinstall torch. The same .venv and stamp as the
# Makefile's, so `make test` in the container finds everything installed.
COPY requirements-cpu.txt pyproject.toml README.md LICENSE ./
COPY moe_lab/__init__.py moe_lab/__init__.py
RUN python3 -m venv .venv && .venv/bin/pip install --no-cache-dir -r requirements-cpu.txt \
    && .venv/bin/pip install --no-cache-dir -e '.[lab,test,transformers]' && touch .venv/.installed
ENV PATH=/moe-lab/.venv/bin:$PATH
COPY . .
RUN touch .venv/.installed
# Check the environment at build time, not in the workshop.
RUN moe-lab doctor
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", "--ServerApp.root_dir=/moe-lab/notebooks"]
