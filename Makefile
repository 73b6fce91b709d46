# The two commands of the README. Each sets up .venv/ first (idempotent), then runs.
.PHONY: quickstart test env

env:
	@bash scripts/setup_env.sh

# The quickstart's model and task are built here, once (about 2 minutes on 2 CPU cores; see erpo_lightning/toy).
quickstart: env
	.venv/bin/python -m erpo_lightning.toy --root .cache/toy-arith-v1
	.venv/bin/erpo fit --config configs/quickstart.yaml

test: env
	.venv/bin/python -m pytest -q tests
