# KPool parity harness. Every target bootstraps what it needs (scripts/bootstrap.sh):
#   PYTHON=...        use this interpreter as is (no installs)
#   else system python3 if it already imports torch + (triton | torch_npu)
#   else .venv with CPU torch 2.13.0 + triton 3.6.0
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

BOOTSTRAP := bash scripts/bootstrap.sh
RUN_PYTEST := bash scripts/run-pytest.sh

# Interpreter override; empty = auto (see above). Exported so bootstrap sees it.
PYTHON ?=
PYTHON_ASCEND ?=
export PYTHON PYTHON_ASCEND

# ---- parity knobs ---------------------------------------------------------
# Every knob becomes a flag of `python -m parity run`; the CLI's own defaults are the same
# (suite all, size all), so `make parity` and `python -m parity run` run the same cases.
# CI workflows call `make parity` with these knobs, never with a replacement command line.
DEVICE ?=
SIZE   ?= all
SUITE  ?= all
PROFILE ?=
KERNEL ?=
JOBS   ?= auto
SEED   ?=
REPORT ?=
JUNIT  ?=
PARITY_EXTRA ?=
PARITY_ARGS_GONE = PARITY_ARGS replaced the whole command line (a device job ran the seed suite only) \
and is gone: use DEVICE= SIZE= SUITE= PROFILE= KERNEL= JOBS= SEED= REPORT= JUNIT=, and PARITY_EXTRA= for other flags
PARITY_FLAGS = $(if $(DEVICE),--device $(DEVICE)) --suite $(SUITE) --size $(SIZE) \
               $(if $(PROFILE),--profile $(PROFILE)) $(if $(KERNEL),--kernel $(KERNEL)) \
               $(if $(SEED),--seed $(SEED)) $(if $(REPORT),--report $(REPORT)) \
               $(if $(JUNIT),--junit $(JUNIT)) $(if $(filter-out 1,$(JOBS)),--jobs $(JOBS)) \
               $(PARITY_EXTRA)
# `make ab BASELINE=IMPL CANDIDATE=IMPL`: kernel vs kernel, bitwise (python -m parity ab), same
# selection knobs as `make parity`; AB_EXTRA for other flags (e.g. --all-steps).
BASELINE ?=
CANDIDATE ?=
AB_EXTRA ?=
AB_FLAGS = --baseline $(BASELINE) --candidate $(CANDIDATE) $(if $(DEVICE),--device $(DEVICE)) \
           --suite $(SUITE) --size $(SIZE) $(if $(PROFILE),--profile $(PROFILE)) $(if $(SEED),--seed $(SEED)) \
           $(if $(REPORT),--report $(REPORT)) $(AB_EXTRA)
BENCH_JSON ?=
BENCH_COMPARE ?=
BENCH_ARGS  ?= $(if $(DEVICE),--device $(DEVICE)) $(if $(BENCH_JSON),--json $(BENCH_JSON)) $(if $(BENCH_COMPARE),--compare $(BENCH_COMPARE))

# ---- pytest knobs ---------------------------------------------------------
# xdist flags are dropped automatically if pytest-xdist is missing
# (scripts/run-pytest.sh). KPOOL_DEVICE is left to the code.
PYTEST_WORKERS ?= 2
PYTEST_ARGS    ?= -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: help bootstrap parity ab test test-unit test-integration bench ascend-interp-env test-ascend-interp clean

help:
	@echo "make parity   - Triton kernels vs PyTorch reference: corpus of shrunk failures first, seed"
	@echo "                scenarios, public cases C01..C31, a generated budget with coverage (SUITE=all)"
	@echo "                (DEVICE=npu|cuda|cpu SIZE=$(SIZE) SUITE=all|corpus|seed|public|generated"
	@echo "                 PROFILE=ci|dev|device|nightly KERNEL=kpool|mutant:NAME|vllm-ascend:PATH|module:function"
	@echo "                 SEED= JOBS= REPORT=DIR JUNIT=FILE PARITY_EXTRA='more flags', e.g. '--shard 0/4';"
	@echo "                 python -m parity merge DIR... combines the shards' reports)"
	@echo "                A run writes only under REPORT (default ./parity-out): shrunk failures in"
	@echo "                corpus-candidates/ (promote: python -m parity corpus add PATH), bundles/"
	@echo "make ab BASELINE=IMPL CANDIDATE=IMPL - two implementations (kpool, mutant:NAME, git:REV,"
	@echo "                module:function) on one device, every output of every step bitwise (same knobs"
	@echo "                as make parity; exit 1 when they differ)"
	@echo "make test     - corpus replay, then the unit tier, then the integration tier (hypothesis searches,"
	@echo "                CLI runs, multi-worker runs, GLM-size tests): three pytest runs, all must pass; ci hypothesis"
	@echo "                profile (HYPOTHESIS_PROFILE=ci; PYTEST_ARGS='$(PYTEST_ARGS)'); make test-unit /"
	@echo "                make test-integration run one tier"
	@echo "make bench    - benchmarks"
	@echo "make test-ascend-interp - interpreter_ok tests + small parity run on triton-ascend"
	@echo "                under TRITON_INTERPRET=1 (CPU); fails if no test is marked interpreter_ok"
	@echo "make bootstrap / ascend-interp-env - only build the environment"
	@echo "make clean    - remove .venv, .venv-ascend, caches, reports"

bootstrap:
	@$(BOOTSTRAP) main

parity:
	$(if $(strip $(PARITY_ARGS)),$(error $(PARITY_ARGS_GONE)))
	@PY="$$($(BOOTSTRAP) main)"; \
	echo "[make] $$PY -m parity run $(strip $(PARITY_FLAGS))" >&2; \
	"$$PY" -m parity run $(strip $(PARITY_FLAGS))

ab:
	$(if $(and $(strip $(BASELINE)),$(strip $(CANDIDATE))),,$(error make ab needs BASELINE=IMPL and CANDIDATE=IMPL (python -m parity list implementations)))
	@PY="$$($(BOOTSTRAP) main)"; \
	echo "[make] $$PY -m parity ab $(strip $(AB_FLAGS))" >&2; \
	"$$PY" -m parity ab $(strip $(AB_FLAGS))

# Two tiers (ci hypothesis profile unless HYPOTHESIS_PROFILE says otherwise): the corpus of
# shrunk failures is replayed first, then the unit tier, then the integration tier (hypothesis
# searches, CLI runs, multi-worker runs: marker `integration`; GLM-size tests: marker `slow`),
# each its own pytest invocation; every one runs and all must pass.
UNIT_TIER        = tests --ignore=tests/test_corpus.py -m "not integration and not slow"
INTEGRATION_TIER = tests --ignore=tests/test_corpus.py -m "integration or slow"

test:
	@PY="$$($(BOOTSTRAP) main)"; rc=0; \
	$(RUN_PYTEST) "$$PY" tests/test_corpus.py || rc=1; \
	echo "[make] unit tier" >&2; SECONDS=0; \
	$(RUN_PYTEST) "$$PY" $(PYTEST_ARGS) $(UNIT_TIER) || rc=1; \
	echo "[make] unit tier: $${SECONDS} s" >&2; echo "[make] integration tier" >&2; SECONDS=0; \
	$(RUN_PYTEST) "$$PY" $(PYTEST_ARGS) $(INTEGRATION_TIER) || rc=1; \
	echo "[make] integration tier: $${SECONDS} s" >&2; exit $$rc

test-unit:
	@PY="$$($(BOOTSTRAP) main)"; \
	$(RUN_PYTEST) "$$PY" tests/test_corpus.py && $(RUN_PYTEST) "$$PY" $(PYTEST_ARGS) $(UNIT_TIER)

test-integration:
	@PY="$$($(BOOTSTRAP) main)"; $(RUN_PYTEST) "$$PY" $(PYTEST_ARGS) $(INTEGRATION_TIER)

bench:
	@PY="$$($(BOOTSTRAP) main)"; \
	echo "[make] $$PY -m parity.bench $(strip $(BENCH_ARGS))" >&2; \
	"$$PY" -m parity.bench $(BENCH_ARGS)

ascend-interp-env:
	@$(BOOTSTRAP) ascend

test-ascend-interp: export TRITON_INTERPRET = 1
test-ascend-interp: export KPOOL_DEVICE = cpu
test-ascend-interp:
	@PY_ASCEND="$$($(BOOTSTRAP) ascend)"; \
	$(RUN_PYTEST) "$$PY_ASCEND" $(PYTEST_ARGS) tests -m interpreter_ok; \
	echo "[make] $$PY_ASCEND -m parity run --device cpu --suite seed --size small --failures-only" >&2; \
	"$$PY_ASCEND" -m parity run --device cpu --suite seed --size small --failures-only

clean:
	rm -rf .venv .venv-ascend .pytest_cache .hypothesis reports bundles parity-out build *.egg-info
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
