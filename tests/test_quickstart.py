"""A shortened quickstart: the real configs/quickstart.yaml, run by the real `erpo` command, on a quickly built toy."""

import json
import shutil
from pathlib import Path

from test_cli import run_erpo

from erpo_lightning.toy import PretrainConfig, ToyConfig, ensure_toy_assets

REPO = Path(__file__).resolve().parents[1]
# A toy build of seconds, not minutes: same task and files, far fewer pre-training steps (its accuracy is low).
QUICK_TOY = ToyConfig(
    num_test=40, num_val=20, eval_samples=2,
    pretrain=PretrainConfig(batch_size=16, max_steps=6, eval_every=3, warmup_steps=2, target_accuracy=2.0),
)  # fmt: skip


def test_shortened_quickstart_runs_and_summarises(tmp_path):
    ensure_toy_assets(tmp_path / ".cache" / "toy-arith-v1", config=QUICK_TOY)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    result = run_erpo(
        "fit", "--config", "configs/quickstart.yaml", "--trainer.max_steps", "3", "--data.batch_size", "4",
        "--rollout.group_size", "4", cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "held-out accuracy before and after training" in output
    assert "final Query-KL" in output
    summary = json.loads(next((tmp_path / "runs" / "quickstart").rglob("sweep_summary.json")).read_text())
    assert (summary["first_step"], summary["last_step"]) == (0, 3)
    assert "val/avg@k/toy_test/T=1" in summary["before"] and "val/avg@k/toy_test/T=1" in summary["after"]
    # The barely pre-trained toy solves nothing: zero advantages, no update, so Query-KL stays at its θ0 value 0.
    assert summary["query_kl"] == 0.0
