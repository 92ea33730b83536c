# Developer entry points. Every target runs from the repository root with $(PYTHON).
# `make test` is what CI runs after `make lint` (see .ci/run); benchmarks are documented in
# docs/BENCHMARKS.md.
PYTHON ?= python3
ARGS ?=
# the namespace labs the benchmarks use live in devtools/netlab (ADR 0190)
BENCHES := $(basename $(notdir $(wildcard bench/*.py)))

.PHONY: help install lint type test test-slow sim bench $(addprefix bench-,$(BENCHES))

help:
	@echo "make install    install dekube and its test extra (scripts/install.sh)"
	@echo "make lint       ruff and mypy (scripts/lint.sh)"
	@echo "make type       mypy only"
	@echo "make test       the default test suite (scripts/test.sh)"
	@echo "make test-slow  also the slow tests (DEKUBE_SLOW=1)"
	@echo "make sim        the deterministic consensus and all-reduce simulators, 200 seeds each"
	@echo "make bench      list the benchmarks; make bench-NAME ARGS='...' runs bench/NAME.py"

install:
	PYTHON=$(PYTHON) bash scripts/install.sh

lint:
	PYTHON=$(PYTHON) bash scripts/lint.sh

type:
	$(PYTHON) -m mypy

test:
	PYTHON=$(PYTHON) bash scripts/test.sh $(ARGS)

test-slow:
	DEKUBE_SLOW=1 PYTHON=$(PYTHON) bash scripts/test.sh $(ARGS)

sim:
	$(PYTHON) -m devtools.consensus_sim --seeds 200
	$(PYTHON) -m devtools.allreduce_sim --seeds 200

bench:
	@echo "Benchmarks (docs/BENCHMARKS.md gives the arguments used for each recorded figure):"
	@for b in $(BENCHES); do echo "  make bench-$$b ARGS='...'   # $(PYTHON) bench/$$b.py"; done

$(addprefix bench-,$(BENCHES)): bench-%:
	$(PYTHON) bench/$*.py $(ARGS)
