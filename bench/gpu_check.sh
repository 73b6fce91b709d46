#!/usr/bin/env bash
# The GPU check (issue 27 item 6, issue 69 item 7), for one lent NVIDIA H200, in under 8 minutes; prints JSON lines.
#
#  1. env: Python, torch, the CUDA device, package versions; the package's training module imports.
#  2. recipe: bench/recipe_check.py, the one-GPU recipe's own training step (configs/one_gpu_qwen2.5_math_1.5b.yaml,
#     read as it is when this runs: every setting of its model, rollout and batch) on a randomly initialised model of
#     its shape (built there: nothing is downloaded), the packaged GSM8K problems, the HF engine unless vLLM imports,
#     2 steps: each step's time by phase, peak CUDA memory and the engine-trainer log-prob gap.
#  3. bench/bench_step.py: 2 timed steps (after one warm-up) of erpo (exact and shared prompt) and grpo, or the
#     shared-prompt arm against a baseline tree's erpo (below), on a randomly initialised Qwen2 of the Qwen2-1.5B
#     shape, bf16, under Lightning's ModelParallelStrategy (FSDP2 over a 1-GPU mesh), on the same replayed rollout
#     batch (no generation engine); step time, peak and memory above the step's rest.
#  4. bench/bench_memory.py on CUDA at a 152,064-token vocabulary, float32 and bfloat16, one round.
#  5. bench/bench_query_exactness.py: are the training step's query scores the reference cache's to the bit (issue
#     38 item 3), in float32 and bfloat16, at the 1.5B shape; and the shared forward's gap, for contrast.
#  6. summary: env, the recipe's step, step-time ratios, peak GPU memory per arm, bench_memory's peaks and times,
#     exactness.
# Each part prints one JSON status line ({"part", "rc", "seconds"}, and its log's tail when it failed or ran past its
# time limit: rc 124), then the summary line. Files, in $OUT (or a temporary folder the summary names), 7 of them
# (the device tool brings back 8 at most): env.json, recipe.json, bench_step.json, bench_memory.json,
# query_exactness.json, summary.json, and logs.txt (every part's stderr, each under a header).
#
# Through the device tool (that machine has no network: the wheels it lacks travel in .whl/, git-ignored):
#   here, once:  bash bench/gpu_wheels.sh
#   device run:  command "bash bench/gpu_check.sh", carry [".whl"], timeout_s 540
# On CPU, the same path at tiny sizes, float32, no time limits:
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
    mode=smoke env_limit=0 recipe_limit=0 step_limit=0 memory_limit=0 exact_limit=0 # no limits: a loaded CPU
    recipe_args=(--smoke --steps 2)                                                  # machine can take minutes
    step_args=(--device cpu --size tiny --dtype float32 --steps 1 --threads 1 --queries 2 --group-size 2
        --prompt-len 16 --response-len 16)
    memory_args=(--device cpu --dtypes float32 --vocab 4096 --tokens 256 --prompt-len 32 --response-len 96
        --steps 1 --threads 1)
    exact_args=(--device cpu --size tiny --queries 10)
else # 8 minutes at most: 30 + 210 + 150 + 50 + 40 seconds
    mode=gpu env_limit=30 recipe_limit=210 step_limit=150 memory_limit=50 exact_limit=40
    recipe_args=(--steps 2)
    step_args=(--device cuda --size 1.5b --dtype bfloat16 --steps 2 --threads 8 --queries 8 --group-size 4
        --prompt-len 256 --response-len 1024 --micro-batch-tokens 16384)
    memory_args=(--device cuda --dtypes float32 bfloat16 --steps 1 --threads 8)
    exact_args=(--device cuda --size 1.5b --queries 24)
fi
# Before against after: an earlier commit's package in $GPU_CHECK_BASELINE (default .baseline/, git-ignored; made
# here with `mkdir -p .baseline && git archive <commit> erpo_lightning | tar -x -C .baseline`, carried with
# [".whl", ".baseline"]) runs erpo with that code, interleaved with this code's erpo and shared-prompt arm
# (bench_step's --baseline-source, which finds each name where that commit keeps it: back to abe1dcd at least):
# three workers, as without it, within the same time limit. The recipe part runs this code only.
baseline=${GPU_CHECK_BASELINE:-.baseline}
if [[ -d $baseline/erpo_lightning ]]; then
    step_args+=(--arms erpo erpo_shared_prompt --baseline-source "$baseline" --baseline-arms erpo)
else
    step_args+=(--arms erpo erpo_shared_prompt grpo)
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
# NAME.json, its stderr appended to logs.txt under a header; prints its status line.
: >"$results/logs.txt"
run_part() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "===== $name =====" >>"$results/logs.txt"
    local offset
    offset=$(wc -c <"$results/logs.txt")
    timeout "$limit" "$python" "$@" >"$results/$name.json" 2>>"$results/logs.txt"
    local rc=$?
    "$python" - "$name" "$rc" "$((SECONDS - start))" "$results" "$offset" <<'EOF'
import json, pathlib, sys

name, rc, seconds, results, offset = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
line = {"part": name, "rc": rc, "seconds": seconds}
if rc != 0:  # this part's own lines of the log
    log = pathlib.Path(results, "logs.txt").read_bytes()[offset:]
    line["log_tail"] = log.decode(errors="replace")[-2000:]
print(json.dumps(line))
EOF
}

run_part env "$env_limit" -c "$env_probe" "$mode"
run_part recipe "$recipe_limit" bench/recipe_check.py "${recipe_args[@]}"
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
recipe = read("recipe")
if recipe is not None:
    keep = ("engine", "model_settings", "sizes", "step_s_median", "cuda_peak_mib_max", "logprob_abs_diff_median")
    summary["recipe"] = {key: recipe[key] for key in keep}
    summary["recipe"]["step_s"] = [step["wall_s"] for step in recipe["steps"]]
step = read("bench_step")
if step is not None:
    per_algorithm = step["results"]
    summary["step"] = {
        **{key: step["config"][key] for key in ("strategy", "size", "dtype", "steps")},
        "ratios": step["ratios"],
        **{
            key: {name: result[key] for name, result in per_algorithm.items()}
            for key in ("step_s_median", "step_s_min", "step_s_max", "peak_mib", "above_rest_mib_median", "sharded")
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
