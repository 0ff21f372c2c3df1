# `make demo` and `make test` set up everything on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# Two workers fit this 2-core machine; JAX gets 8 CPU devices in each. worksteal: a worker
# that runs out of tests takes some of the other's (a few tests take ~30 s each).
PYTEST_ARGS ?= -n 2 --dist worksteal

.PHONY: demo test docs setup bench fuzz clean test-gpu-image

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls gigabytes of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) examples/train_gpt.py

test: setup
	$(PY) -m pytest $(PYTEST_ARGS) tests

# The suite on the GPU machine's versions (Python 3.12, torch 2.11, JAX 0.11.2), here on
# CPU devices: what passes here runs there. Not part of `make test`: PyPI has torch 2.11
# only as its CUDA build (about 3 GB to download, runs on the CPU).
GPU_IMAGE_VENV ?= .venv-gpu-image
test-gpu-image:
	test -x $(GPU_IMAGE_VENV)/bin/python || python3.12 -m venv $(GPU_IMAGE_VENV)
	$(GPU_IMAGE_VENV)/bin/python -m pip install -q torch==2.11.0 jax==0.11.2 jaxlib==0.11.2 -e '.[dev]'
	$(GPU_IMAGE_VENV)/bin/python -m pytest $(PYTEST_ARGS) tests

# The documentation site (docs/, mkdocs.yml), offline and strict: a broken link or
# reference fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench: setup
	$(PY) benchmarks/trace_overhead.py
	$(PY) benchmarks/train_step.py

# The differential fuzzer: thousands of random sharded programs (op chains, loops, manual
# regions, checkpoints, failures, compiled training steps) vs CPU eager, one process per
# core; failures are written to fuzz-failures/ as standalone repro scripts.
FUZZ_PROGRAMS ?= 5000
FUZZ_SEED ?= 0
FUZZ_JOBS ?= 2
fuzz: setup
	$(PY) -m torchspmd.testing.fuzz --programs $(FUZZ_PROGRAMS) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) --out fuzz-failures

clean:
	rm -rf $(VENV) build *.egg-info
