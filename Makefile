# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; the package metadata itself only asks for torch>=2.3.
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
# lvis-api's own environment (below), which make test builds first
VENV_LVIS ?= .venv-lvis

.PHONY: demo test lint test-quick test-integration test-ultralytics bench fuzz clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev]"
# litdata (packs on an object store) without its declared dependencies: it declares
# torchvision, which cannot be loaded beside the CPU torch, and never imports it
	$(PY) -m pip install --quiet --no-deps "litdata==0.2.76" "lightning-utilities>=0.11"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m detloader demo

test: lint $(VENV_LVIS)/.installed
	$(PY) -m pytest -q

# ruff's settings (rules, line length) are in pyproject.toml; make test runs it first.
lint: $(STAMP)
	$(PY) -m ruff check src tests

test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# The tests marked integration (torchvision detectors, the README's torchvision block) in a
# second environment: torchvision's ops need the torch build it was made for (CUDA, ~5 GB).
VENV_INT ?= .venv-integration
INTEGRATION_PINS ?= torch==2.14.1 torchvision==0.29.1

# A side environment: $(1) its folder (git-ignored), $(2) the pins installed before the project.
define side_venv
	$(PYTHON) -m venv $(1)
	echo '*' > $(1)/.gitignore
	$(1)/bin/python -m pip install --quiet $(2)
	$(1)/bin/python -m pip install --quiet -e ".[dev]"
	touch $@
endef

$(VENV_INT)/.installed: pyproject.toml
	$(call side_venv,$(VENV_INT),$(INTEGRATION_PINS))

test-integration: $(VENV_INT)/.installed
	$(VENV_INT)/bin/python -m pytest -q -m integration

# The tests marked ultralytics (detloader.ultralytics, the README's Ultralytics block) in a
# third environment: ultralytics pulls the torch build it wants (CUDA, ~6 GB).
VENV_ULTRA ?= .venv-ultralytics
ULTRALYTICS_PINS ?= ultralytics==8.4.190

$(VENV_ULTRA)/.installed: pyproject.toml
	$(call side_venv,$(VENV_ULTRA),$(ULTRALYTICS_PINS))

test-ultralytics: $(VENV_ULTRA)/.installed
	$(VENV_ULTRA)/bin/python -m pytest -q -m ultralytics

# lvis-api, the reference the LVIS scoring test compares detloader with, in its own environment
# (neither detloader nor torch): its 0.5.3 release uses np.float, which numpy 1.24 removed. It is
# installed without its declared dependencies: it imports numpy, pycocotools (undeclared),
# matplotlib and OpenCV (the headless build serves); Cython is for building only.
LVIS_PINS ?= "numpy==1.23.5" "pycocotools==2.0.11" "matplotlib==3.10.9" "opencv-python-headless==4.11.0.86"

$(VENV_LVIS)/.installed:
	$(PYTHON) -m venv $(VENV_LVIS)
	echo '*' > $(VENV_LVIS)/.gitignore
	$(VENV_LVIS)/bin/python -m pip install --quiet $(LVIS_PINS)
	$(VENV_LVIS)/bin/python -m pip install --quiet --no-deps "lvis==0.5.3"
	touch $@

# Long fuzzing of every annotation reader and of the image decoder (the suite runs 25
# examples per reader, 150 per decoder test).
FUZZ_EXAMPLES ?= 5000
fuzz: $(STAMP)
	DETLOADER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/robustness/test_fuzz_readers.py tests/robustness/test_fuzz_decode.py

bench: $(STAMP)
	$(PY) -m detloader bench

clean:
	rm -rf $(VENV) build .pytest_cache .hypothesis src/*.egg-info

# torchvision's VOCDetection baseline where torchvision loads (.venv-integration, see
# test-integration); `detloader bench` reads the recorded run from benchmarks/results/.
BENCH_DATA ?= ../shared/datasets/bccd
.PHONY: bench-torchvision
bench-torchvision: $(VENV_INT)/.installed
	$(VENV_INT)/bin/python benchmarks/bench_torchvision.py $(BENCH_DATA) --out benchmarks/results/torchvision.json
