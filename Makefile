# Two commands on a fresh machine (see README):  make demo   |   make test
# Both create .venv and install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (from local disk on our machines). A GPU user passes a CUDA
# build instead, e.g.  make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH_SPEC)
	$(PIP) -c constraints.txt -e ".[test]"
	touch $@

demo: setup
	$(VENV)/bin/hpsearch run examples/digits-cnn.yaml

test: setup
	$(PY) -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache
