# The two commands of the README. Each sets up .venv/ first (idempotent), then runs.
.PHONY: quickstart test env

env:
	@bash scripts/setup_env.sh

quickstart: env
	.venv/bin/erpo fit --config configs/quickstart.yaml

test: env
	.venv/bin/python -m pytest -q tests
