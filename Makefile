# rayft developer targets. `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: install demo test test-unit test-integration test-gpu lint format proto bench lock clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull GBs of CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[all,dev]"
	touch $@

# checkov (tests/k8s scans the manifests) in a venv of its own: its pins clash with ours.
$(VENV)/checkov/.installed: $(VENV)/.installed constraints-checkov.txt
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install -q -c constraints-checkov.txt checkov
	touch $@

install: $(VENV)/.installed $(VENV)/checkov/.installed

demo: install             ## train the tiny model on 2 CPU workers (local Ray), print the adapter's path
	$(VENV)/bin/rayft demo

test: install             ## unit + integration tests (local Ray, real parts); GPU tests are skipped off-GPU
	$(PY) -m pytest tests -m "not gpu" -n 2 --dist loadscope  # the Ray tests in order on one worker, the rest beside it (tests/conftest.py)

test-unit: install
	$(PY) -m pytest tests -m "not integration and not gpu"

test-integration: install
	$(PY) -m pytest tests -m integration

test-gpu:                 ## on a GPU machine (the device): the gpu-marked tests
	python3 -m pytest tests/gpu -m gpu

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

proto: install            ## regenerate rayft_contract/v1 from proto/ (a test fails if it is stale)
	$(PY) proto/generate.py

bench: install            ## CPU benchmarks here (service; tenant isolation; data pipeline, cold vs warm start); GPU ones: bench/*.sh on the device
	$(PY) bench/service_bench.py
	$(PY) bench/tenant_bench.py
	$(PY) bench/data_bench.py

lock: install             ## re-pin constraints.txt from the current venv
	{ head -2 constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^rayft'; } > constraints.new && mv constraints.new constraints.txt

clean:
	rm -rf $(VENV) .rayft runs .pytest_cache
