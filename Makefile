# Two entry points for a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# torch is installed first and pinned: the CPU wheel; an unpinned torch pulls gigabytes of CUDA
$(VENV)/.base: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $@

# the tests also exercise the optional backends (Ray, trackers) for real
$(VENV)/.dev: $(VENV)/.base
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

.PHONY: demo test bench chromium bubblewrap docs

# bubblewrap: the OS isolation every run of model-written code uses (Debian package; needs root)
bubblewrap:
	@command -v bwrap >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq bubblewrap >/dev/null) || (echo "ERROR: could not install bubblewrap (apt-get install bubblewrap)"; exit 1)

# headless Chromium for the HTML-report screenshot test (Debian package; needs root)
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq chromium >/dev/null) || echo "WARNING: could not install chromium; the report screenshot test will be skipped"

demo: $(VENV)/.base bubblewrap
	$(BIN)/rhlab demo

test: $(VENV)/.dev chromium bubblewrap
	$(BIN)/python -m pytest -q

bench: $(VENV)/.base
	$(BIN)/python benchmarks/step_speed.py

# regenerate the results tables in README.md and docs/*.md from results/ (tests/test_results.py checks them)
docs: $(VENV)/.base
	$(BIN)/python -m rhlab.report.results docs

# the mini-code hack-share probe (docs/minicode.md): code models pretrained with 0 % and 10 % of loophole
# documents overwriting run_tests (the built-in model: 2 %), then the sweep over them
runs/models/code_share%/model.safetensors: $(VENV)/.base
	$(BIN)/rhlab pretrain --corpus code --hack-share $(if $(filter 0,$*),0,0.$*) --out runs/models/code_share$* --seed 0 --threads 1

.PHONY: minicode-share
minicode-share: runs/models/code_share0/model.safetensors runs/models/code_share10/model.safetensors bubblewrap
	$(BIN)/rhlab sweep configs/sweep_minicode_share.yaml

# on the 10 %-share model: the SVD candidate's 5-seed confirmation (docs/minicode.md) and the projection
# experiment's arms on the code loophole (docs/projection.md)
.PHONY: minicode-svd-confirm minicode-projection
minicode-svd-confirm minicode-projection: minicode-%: runs/models/code_share10/model.safetensors bubblewrap
	$(BIN)/rhlab sweep configs/sweep_minicode_$(subst -,_,$*).yaml
