# ghofl — the two commands of the set-up contract are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Real datasets: $GHOFL_DATA_DIR, else ../shared/data when it exists.
GHOFL_DATA_DIR ?= $(if $(wildcard ../shared/data/.),$(abspath ../shared/data),)
export GHOFL_DATA_DIR
export FLWR_TELEMETRY_ENABLED=0
export FLWR_DISABLE_UPDATE_CHECK=1
export RAY_USAGE_STATS_ENABLED=0
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export PYTHONDONTWRITEBYTECODE=1

DEMO_EXTRAS := torch,bench
TEST_EXTRAS := dev,torch,bench,text,flower,privacy,dp-anchors
# The benchmarks also build CIFAR-10-C's frost corruption (textures from the 'corruptions' extra).
BENCH_EXTRAS := $(TEST_EXTRAS),corruptions

.PHONY: demo test test-fast lint typecheck pytest pytest-parallel bench bench-secure clean venv

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Re-install only when pyproject.toml changes or another set of extras is asked for.
$(VENV)/.stamp-%: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e ".[$*]"
	@rm -f $(VENV)/.stamp-*
	@touch $@

venv: $(VENV)/.stamp-$(TEST_EXTRAS)

demo: $(VENV)/.stamp-$(DEMO_EXTRAS)
	$(VENV)/bin/ghofl demo

lint: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(VENV)/bin/mypy

pytest: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(VENV)/bin/pytest -q

# Lint, type check and the suite run side by side (the Flower tests spend most of their time
# waiting on processes, so the type check fits beside them); each one's output is printed whole
# when it ends, and `make test` fails when any of them fails.
test: $(VENV)/.stamp-$(TEST_EXTRAS)
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck pytest-parallel

# The edit loop: unit, property, contract, oracle and fuzz tests without the end-to-end ones
# (marker `slow`: the CLI, Flower and other process tests), on 2 workers. `make test` stays the
# whole suite (what CI runs).
test-fast: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup -m "not slow" tests/unit tests/property \
		tests/contract tests/oracle tests/fuzz

pytest-parallel: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup --durations=15

# Every benchmark script rewrites its own BENCHMARKS.md section: about 8 hours in all on 2 quiet
# cores. Timed on 2026-12-08 (SkylakeX, 2 cores): the first embedding of CIFAR-10 8.5 minutes,
# of the text sets and Tiny-ImageNet 7 (then cached); every experiment config 2.5 minutes from
# the cache; bench_paper 11, bench_qda_floor 10, bench_client_stats 3.5, bench_tiny_imagenet 3,
# bench_demo, bench_validation 2 each, bench_core 1.5, bench_trainable_heads 1.3, the ablation
# and dp_synthetic under a minute. The long ones: the DP anchors' grid (about 5 minutes per
# CIFAR-10 part, 25 parts), bench_accuracy_bytes 30-60 minutes, the peers 40, bench_c1000 25,
# bench_defaults_cv 20, bench_fedavg and bench_clip_norms 15 each, the secure benchmarks about
# 10 each. The long grids resume from their saved parts. The order matters: the experiments
# cache the embeddings the later scripts read. `benchmarks/stale_sections.py --stale` lists the
# sections older than the code they ran, to re-run only those.
bench: $(VENV)/.stamp-$(BENCH_EXTRAS)
	$(PY) benchmarks/bench_core.py
	$(PY) benchmarks/bench_payload_bytes.py
	$(PY) benchmarks/bench_encoders.py
	$(PY) benchmarks/bench_trainable_heads.py
	$(PY) benchmarks/bench_ablation_cifar10.py
	$(PY) benchmarks/bench_demo.py
	$(PY) benchmarks/bench_experiments.py cifar10_main upload_size text cifar10_auto cifar10_sqrt cifar10_expand tiny_imagenet tiny_imagenet_trained
	$(PY) benchmarks/bench_tiny_imagenet.py --heads nb,lda,qda,fedcgs
	$(PY) benchmarks/bench_trainable_vs_base.py --no-before tiny-imagenet --skip-c200-paper
	$(PY) benchmarks/bench_defaults.py
	$(PY) benchmarks/bench_defaults_cv.py
	$(PY) benchmarks/bench_accuracy_bytes.py
	$(PY) benchmarks/bench_peers.py --pca
	$(PY) benchmarks/bench_tiny_levers.py
	$(PY) benchmarks/bench_cifar10c.py
	$(PY) benchmarks/bench_predict.py
	$(PY) benchmarks/bench_ood.py
	$(PY) benchmarks/bench_personalize.py
	$(PY) benchmarks/bench_clip_norms.py
	$(PY) benchmarks/bench_fedavg.py --train-per-class 2000 --test-per-class 500
	$(PY) benchmarks/bench_dp.py
	$(PY) benchmarks/bench_dp_synthetic.py
	$(PY) benchmarks/bench_dp_anchors.py
	$(PY) benchmarks/bench_flower.py
	$(PY) benchmarks/bench_validation.py
	$(PY) benchmarks/bench_client_stats.py
	$(PY) benchmarks/bench_qda_floor.py
	$(if $(PAPER_REPO),$(PY) benchmarks/bench_paper.py --paper-repo $(PAPER_REPO),@echo "skipped benchmarks/bench_paper.py: set PAPER_REPO to a checkout of https://github.com/FabioTur-dev/One-Shot-FL")
	$(PY) benchmarks/bench_secure_cost.py
	$(PY) benchmarks/bench_secure_graph.py
	$(PY) benchmarks/bench_secure_regions.py
	$(PY) benchmarks/bench_c1000.py
	$(MAKE) bench-secure

# Flower's SecAgg+ (the side-by-side comparison) runs from the venv's own flwr (extra flower).
bench-secure: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(PY) benchmarks/bench_secure.py --flower-python $(PY)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
