# Two commands on a fresh machine (see README):  make demo   |   make test
# Both create .venv and install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch (from local disk on our machines). A GPU user passes a CUDA
# build instead, e.g.  make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

# The report test renders HTML in Debian's Chromium; installed here when apt-get exists.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo test browser clean FORCE

setup: $(VENV)/.installed

# A TORCH_SPEC given on the command line or in the environment is the torch the venv must
# hold: one other than the spec installed last takes the installed torch out first, since
# pip keeps 2.13.0+cpu for "torch==2.13.0 --index-url .../cu128" (a local version matches
# ==2.13.0), and `make setup TORCH_SPEC=...` did nothing. The default changes nothing: a
# later `make test` keeps a CUDA torch. .torch-installed holds the spec last installed (none
# once it is taken out: an install that then fails leaves none), .torch-spec the one last
# asked for (a change remakes the venv). The spec reaches the
# shell as a variable, split into words but never parsed again: `<` in it is no redirection.
export TORCH_SPEC
SPEC_GIVEN := $(filter-out file,$(origin TORCH_SPEC))
$(VENV)/.torch-spec: FORCE
	@mkdir -p $(VENV)
	@if [ ! -f $@ ] || { [ -n "$(SPEC_GIVEN)" ] && \
	  [ "$$(cat $(VENV)/.torch-installed 2>/dev/null)" != "$$TORCH_SPEC" ]; }; then printf '%s\n' "$$TORCH_SPEC" > $@; fi

$(VENV)/.installed: pyproject.toml constraints.txt $(VENV)/.torch-spec
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ -n "$(SPEC_GIVEN)" ] && [ -f $@ ] && [ "$$(cat $(VENV)/.torch-installed 2>/dev/null)" != "$$TORCH_SPEC" ]; \
	  then $(PY) -m pip uninstall --yes --quiet torch && rm -f $(VENV)/.torch-installed; fi
	$(PIP) $$TORCH_SPEC
	if [ -n "$(SPEC_GIVEN)" ] || [ ! -f $(VENV)/.torch-installed ]; then \
	  printf '%s\n' "$$TORCH_SPEC" > $(VENV)/.torch-installed; fi
	$(PIP) -c constraints.txt -e ".[test]"
	touch $@

demo: setup
	$(VENV)/bin/hpsearch run examples/digits-cnn.yaml

# Two test processes (pytest-xdist): on 2 cores the suite runs in about 0.7x the time of
# one, since its real searches wait on processes, Ray and signals 40% of the time. Three
# were no faster (754 s of pytest against 705-772 s, 2026-12-05), and two loopback-cluster
# tests failed under the contention. worksteal hands each process a contiguous share of
# the order tests/conftest.py gives (each share starts with its part of the slow searches)
# and lets an idle one steal from the back of the other's.
test: setup browser
	$(PY) -m pytest -n 2 --dist worksteal

browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { command -v apt-get >/dev/null && $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: no Chromium; the report-rendering test will be skipped"

clean:
	rm -rf $(VENV) runs .pytest_cache
