# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench setup clean
PEERS = kronfluence==1.0.1 dattri==0.3.0 traker==0.3.2 einops==0.8.2 einconv==0.1.0 opt-einsum==3.4.0

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gradian demo --out demo-out

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	# one worker per CPU: the scenario builds and retrains are single-threaded, and a scenario fixture builds each
	# scenario once (a file lock per scenario), whichever worker asks first; worksteal: an idle worker takes tests
	# queued on a busy one (with the default split the slow e2e verify tests queued on one worker while the other
	# sat idle for the last 20+ minutes)
	$(PY) -m pytest -q -n auto --dist worksteal --durations=30

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	# peers for benchmarks/speed/peer_speed.py, without their declared deps (kronfluence's torchvision would swap torch)
	$(PY) -m pip install --quiet --no-deps $(PEERS)
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	$(PY) -m benchmarks.harness.run_all

clean:
	rm -rf $(VENV) demo-out
