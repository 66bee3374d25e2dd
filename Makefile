# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; the package metadata itself only asks for torch>=2.3.
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed
# the reference evaluators' environment (below), which make test builds first
VENV_REF ?= .venv-reference

.PHONY: demo test lint test-quick test-integration test-ultralytics reference bench fuzz clean venv

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

test: lint reference
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

# The reference evaluators the scoring tests compare detloader with, in one environment without
# detloader or torch (both need numpy < 1.24): lvis-api 0.5.3 (LVISEval; it uses np.float), and
# the TF Object Detection API's Open Images challenge evaluation (object-detection-by-ovi, a PyPI
# copy of its research/object_detection; numpy parts only, TensorFlow stays out: see
# tests/train/openimages_reference.py). Both are installed without their declared dependencies;
# what they import is pinned here (OpenCV's headless build serves lvis-api).
VENV_REF ?= .venv-reference
REFERENCE_PINS ?= numpy==1.23.5 pycocotools==2.0.11 matplotlib==3.10.9 opencv-python-headless==4.11.0.86 \
	pandas==1.5.3 protobuf==3.20.3 six==1.17.0 absl-py==2.5.1
REFERENCE_NODEPS ?= lvis==0.5.3 object-detection-by-ovi==0.0.1

$(VENV_REF)/.installed:
	$(PYTHON) -m venv $(VENV_REF)
	echo '*' > $(VENV_REF)/.gitignore
	$(VENV_REF)/bin/python -m pip install --quiet $(REFERENCE_PINS)
	$(VENV_REF)/bin/python -m pip install --quiet --no-deps $(REFERENCE_NODEPS)
	touch $@

reference: $(VENV_REF)/.installed

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
