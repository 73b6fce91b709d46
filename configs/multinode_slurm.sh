#!/bin/bash
# ERPO on 2 nodes × 8 GPUs under SLURM: one task per GPU; Lightning reads the SLURM environment (ranks, master).
#   sbatch configs/multinode_slurm.sh
# Run `erpo cache --config configs/fsdp_qwen2.5_math_7b.yaml` once beforehand (or let the first fit compute it).
#SBATCH --job-name=erpo-7b
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=48:00:00
set -euo pipefail
cd "${SLURM_SUBMIT_DIR}"
# Shared storage for what every node reads or writes: the reference cache and the checkpoints.
export ERPO_CACHE_HOME="${ERPO_CACHE_HOME:-${SLURM_SUBMIT_DIR}/.cache/erpo_lightning}"
# Lightning takes ranks and the master address from SLURM; the colocated vLLM engines (external_launcher) read the
# torchrun-style variables, set here from SLURM's for each task.
srun bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS; exec "$0" "$@"' \
  .venv/bin/erpo fit \
  --config configs/fsdp_qwen2.5_math_7b.yaml \
  --config configs/multinode_2x8.yaml \
  "$@"
