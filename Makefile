# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch; the package metadata itself only asks for torch>=2.3.
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test lint test-quick test-integration test-ultralytics openimages-reference bench fuzz clean venv

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

test: lint openimages-reference
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

# The reference that tests/train/test_openimages_eval.py compares the Open Images evaluator to:
# the TF Object Detection API's challenge evaluation (a PyPI copy of its research/object_detection,
# numpy parts only; TensorFlow stays out, see tests/train/openimages_reference.py). A side
# environment without the project: the code needs numpy < 1.24; pycocotools only for its import.
VENV_OI ?= .venv-openimages
OPENIMAGES_PINS ?= numpy==1.23.5 pandas==1.5.3 protobuf==3.20.3 six==1.17.0 absl-py==2.5.1
OPENIMAGES_NODEPS ?= pycocotools==2.0.7 object-detection-by-ovi==0.0.1

$(VENV_OI)/.installed:
	$(PYTHON) -m venv $(VENV_OI)
	echo '*' > $(VENV_OI)/.gitignore
	$(VENV_OI)/bin/python -m pip install --quiet $(OPENIMAGES_PINS)
	$(VENV_OI)/bin/python -m pip install --quiet --no-deps $(OPENIMAGES_NODEPS)
	touch $@

openimages-reference: $(VENV_OI)/.installed

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
