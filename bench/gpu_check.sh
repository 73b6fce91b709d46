#!/usr/bin/env bash
# The GPU check of issue 27 (item 6), for one lent NVIDIA H200, in under 8 minutes; prints JSON lines.
#
#  1. env: Python, torch, the CUDA device, package versions; the package's training module imports.
#  2. bench/bench_step.py: 3 timed steps (after one warm-up) of each arm (erpo and grpo, exact and with the shared
#     prompt, and erpo with the fused output layer; or the shared-prompt and fused arms against .baseline/'s erpo and
#     grpo, below) on a randomly initialised Qwen2 of the Qwen2-1.5B shape
#     (built there: nothing is downloaded), bf16, under Lightning's ModelParallelStrategy (FSDP2 over a 1-GPU mesh),
#     on the same replayed rollout batch (no generation engine); step time, peak and memory above the step's rest.
#  3. bench/bench_memory.py on CUDA at a 152,064-token vocabulary, float32 and bfloat16, one round.
#  4. bench/bench_query_exactness.py: are the training step's query scores the reference cache's to the bit (issue
#     38 item 3), in float32 and bfloat16, at the 1.5B shape; and the shared forward's gap, for contrast.
#  5. summary: env, step-time ratios, peak GPU memory per algorithm, bench_memory's peaks and times, exactness.
# Each part prints one JSON status line ({"part", "rc", "seconds"}, and its log's tail when it failed or ran past its
# time limit: rc 124), then the summary line. Files, in $OUT (or a temporary folder the summary names): env.json,
# env.log, bench_step.json, bench_step.log, bench_memory.json, bench_memory.log, query_exactness.json,
# query_exactness.log, summary.json.
#
# Through the device tool (that machine has no network: the wheels it lacks travel in .whl/, git-ignored):
#   here, once:  bash bench/gpu_wheels.sh
#   device run:  command "bash bench/gpu_check.sh", carry [".whl"], timeout_s 540
# On CPU, the same path at the `tiny` size, float32, 1 step, small bench_memory sizes, no time limits:
#   GPU_CHECK_SMOKE=1 PYTHON=.venv/bin/python bash bench/gpu_check.sh      # or: bash bench/gpu_check.sh --smoke
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
smoke=${GPU_CHECK_SMOKE:-0}
[[ ${1:-} == --smoke ]] && smoke=1
results=${OUT:-$(mktemp -d)}
mkdir -p "$results"
export PYTHONUNBUFFERED=1

if [[ $smoke == 0 && -d .whl ]]; then # wheels for the GPU machine's Python 3.12, not for a smoke run's
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # this checkout's erpo_lightning, installed or not

if [[ $smoke == 1 ]]; then
    mode=smoke env_limit=0 step_limit=0 memory_limit=0 # no limits: a loaded CPU machine can take minutes
    step_args=(--device cpu --size tiny --dtype float32 --steps 1 --threads 1 --queries 2 --group-size 2
        --prompt-len 16 --response-len 16)
    memory_args=(--device cpu --dtypes float32 --vocab 4096 --tokens 256 --prompt-len 32 --response-len 96
        --steps 1 --threads 1)
    exact_limit=0 exact_args=(--device cpu --size tiny --queries 10)
else
    mode=gpu env_limit=40 step_limit=300 memory_limit=120 # 7.7 minutes at most, and the exactness check:
    exact_limit=60 exact_args=(--device cuda --size 1.5b --queries 24)
    step_args=(--device cuda --size 1.5b --dtype bfloat16 --steps 3 --threads 8 --queries 8 --group-size 4
        --prompt-len 256 --response-len 1024 --micro-batch-tokens 16384)
    memory_args=(--device cuda --dtypes float32 bfloat16 --steps 2 --threads 8)
fi
# Before against after: an earlier commit's package in .baseline/ (git-ignored; made here with
# `mkdir -p .baseline && git archive <commit> erpo_lightning | tar -x -C .baseline`, carried with [".whl", ".baseline"])
# runs erpo and grpo with that code, interleaved with this code's shared-prompt arms (bench_step's --baseline-source):
# five workers, as without it, within the same time limit.
if [[ -d .baseline/erpo_lightning ]]; then
    step_args+=(--arms erpo_shared_prompt grpo_shared_prompt erpo_fused --baseline-source .baseline
        --baseline-arms erpo grpo)
else
    step_args+=(--arms erpo erpo_shared_prompt grpo grpo_shared_prompt erpo_fused)
fi

env_probe=$(
    cat <<'EOF'
import importlib.metadata, json, platform, sys

import torch

import erpo_lightning.modules.erpo_module  # noqa: F401  (fails here, not mid-bench, when a dependency is missing)

cuda = torch.cuda.is_available()
versions = {}
for name in ("lightning", "transformers", "torchmetrics", "datasets", "jsonargparse"):
    try:
        versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        versions[name] = None
print(json.dumps({
    "mode": sys.argv[1], "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
    "gpu": torch.cuda.get_device_name() if cuda else None,
    "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None, **versions,
}))
EOF
)

# run_part NAME LIMIT_S ARGS...: `python ARGS`, for LIMIT_S seconds at most (0: no limit), its stdout (JSON) to
# NAME.json, its stderr to NAME.log; prints its status line.
run_part() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$python" "$@" >"$results/$name.json" 2>"$results/$name.log"
    local rc=$?
    "$python" - "$name" "$rc" "$((SECONDS - start))" "$results" <<'EOF'
import json, pathlib, sys

name, rc, seconds, results = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4])
line = {"part": name, "rc": rc, "seconds": seconds}
if rc != 0:
    line["log_tail"] = (results / f"{name}.log").read_text(errors="replace")[-2000:]
print(json.dumps(line))
EOF
}

run_part env "$env_limit" -c "$env_probe" "$mode"
run_part bench_step "$step_limit" bench/bench_step.py --strategy model_parallel --rounds 1 "${step_args[@]}"
run_part bench_memory "$memory_limit" bench/bench_memory.py --rounds 1 "${memory_args[@]}"
run_part query_exactness "$exact_limit" bench/bench_query_exactness.py "${exact_args[@]}"

"$python" - "$results" >"$results/summary.json" <<'EOF'
import json, pathlib, sys

results = pathlib.Path(sys.argv[1])


def read(name: str) -> dict | None:
    try:
        return json.loads((results / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


summary = {"part": "summary", "results": str(results), "env": read("env")}
step = read("bench_step")
if step is not None:
    per_algorithm = step["results"]
    summary["step"] = {
        **{key: step["config"][key] for key in ("strategy", "size", "dtype", "steps")},
        "ratios": step["ratios"],
        **{
            key: {name: result[key] for name, result in per_algorithm.items()}
            for key in ("step_s_median", "peak_mib", "above_rest_mib_median", "sharded")
        },
    }
memory = read("bench_memory")
if memory is not None:
    keep = ("peak_mib_median", "step_s_median", "peak_over_old", "time_over_old")
    summary["memory"] = {
        **{key: memory["config"][key] for key in ("vocab", "tokens", "steps")},
        "results": {
            dtype: {path: {key: figures[key] for key in keep if key in figures} for path, figures in paths.items()}
            for dtype, paths in memory["results"].items()
        },
    }
exactness = read("query_exactness")
if exactness is not None:
    summary["query_exactness"] = exactness["results"]
print(json.dumps(summary))
EOF
cat "$results/summary.json"
