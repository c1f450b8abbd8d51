# Two commands on a fresh machine: `make demo` and `make test` (and `make demo-vllm`: a real vLLM on the CPU).
# The demo installs tuitune alone (~100 MB); the tests add pytest & co. and torch (the nccl extra:
# nccl-bench's orchestration tests run it with the gloo backend). Everything comes from the package index.
# The tests' torch is held to TORCH: the CPU build where this machine kind keeps its file on disk (about
# 1 GB in the venv, where a plain `torch` would take a CUDA build of about 5 GB), PyPI's elsewhere.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: demo demo-vllm demo-sglang test setup screenshots bench docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed $(VENV)/.installed-support
	$(BIN)/pip install -q -e '.[test,nccl]' '$(TORCH)'
	touch $@

# the tests' and benchmarks' support package (support/: the real engines' builders, the simulator and
# sshd helpers, preset factories, the stream client), editable; the demos of the real engines use its builders
$(VENV)/.installed-support: support/pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e ./support
	touch $@

$(VENV)/.installed-docs: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/tuitune demo

# A real engine without a GPU: vLLM's CPU build and tiny generated models (built once into .cache/,
# ~3.4 GB, a few minutes, progress shown), then the TUI on it (presets/vllm-cpu-demo.yaml)
demo-vllm: $(VENV)/.installed-support
	$(BIN)/python -m tuitune_support.real_vllm --demo
	$(BIN)/tuitune demo --engine vllm

# The real SGLang without a GPU: PyPI sglang 0.5.18 with its CPU kernels built from the source in
# ../shared/sglang-cpu/ (once into .cache/, ~4 GB, 5-8 minutes, progress shown), then the TUI on it
# (presets/sglang-cpu-demo.yaml). Needs g++, cmake, patch and libnuma-dev (.ci/run installs them).
demo-sglang: $(VENV)/.installed-support
	$(BIN)/python -m tuitune_support.real_sglang --demo
	$(BIN)/tuitune demo --engine sglang

test: $(VENV)/.installed-test
	-$(BIN)/python -m tuitune_support.vllm_cli  # vLLM's real command line for tests/engines/test_vllm_parser.py (once)
	$(BIN)/python -m tuitune_support.real_vllm  # the real vLLM CPU engine and tiny models for tests/real/test_real_vllm.py (once)
	$(BIN)/python -m tuitune_support.real_draft  # an EAGLE-3 head for SmolLM2, trained on the CPU once (about 13 minutes on 2 cores)
	$(BIN)/python -m tuitune_support.real_sglang  # the real SGLang CPU engine (kernels built once) for tests/real/test_real_sglang.py
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --reruns 1 -rR --durations=25  # a failure is run once more (docs/testing.md); the slowest, for the suite's time

screenshots: $(VENV)/.installed-test
	$(BIN)/python screenshots/make.py screenshots  # from the live demo (the simulator), about two minutes

# the documentation site, strictly: a broken link or anchor, or a page missing from nav, fails (into site/)
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# every benchmark through one runner (benchmarks/run.py: groups, worlds, one record a run in .cache/bench/);
# `make bench ARGS="--group performance"` for one group, ARGS="--list" for the table
bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info support/*.egg-info .pytest_cache .cache site
