#!/usr/bin/env bash
# Fetch, here, the wheels that the lent GPU machine (nvidia-h200: Python 3.12, no network) lacks for bench/gpu_check.sh,
# at the versions this checkout's environment has, into .whl/ (git-ignored). The device tool carries .whl when a
# `run` names it in `carry`; gpu_check.sh installs .whl/*.whl into /tmp/site first.
#
#   bash bench/gpu_wheels.sh                       # versions read from .venv/bin/python
#   PYTHON=/path/to/python WHEEL_DIR=/tmp/w bash bench/gpu_wheels.sh
#
# Missing there (its image lists torch, lightning, transformers, torchmetrics, pyarrow, pandas, fsspec, xxhash, ...):
# datasets (imported by erpo_lightning.data) with its dill and multiprocess, and jsonargparse[signatures], which makes
# lightning.pytorch.cli's OptimizerCallable what it is here.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
wheel_dir=${WHEEL_DIR:-.whl}
packages=(datasets dill multiprocess jsonargparse docstring_parser typeshed_client)

mapfile -t pins < <("$python" -c '
import importlib.metadata as metadata, sys
for name in sys.argv[1:]:
    print(f"{name}=={metadata.version(name)}")
' "${packages[@]}")
mkdir -p "$wheel_dir"
"$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$wheel_dir" "${pins[@]}"
ls -l "$wheel_dir"
