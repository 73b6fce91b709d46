"""Where a step's time goes: `common/step_phases.py` records seconds per phase only while a run holds the
`PhaseTimes` callback, which writes one line per step (the healthy toy run holds it); bench/profile_fit.py's config
and summary."""

import json
import time
from pathlib import Path

import pytest
import yaml
from helpers.healthy_run import PHASE_TIMES, STEPS

from bench import profile_fit  # bench/ is a folder of scripts: a namespace package from the repository root
from erpo_lightning.common import step_phases

REPO = Path(__file__).resolve().parents[2]
# every phase an on-policy erpo step with exact scoring and the HF engine goes through
STEP_PHASES = {"generation", "grading", "rollout_batch", "query_pass", "forward", "backward", "optimizer", "metrics",
               "release_heap"}  # fmt: skip


def test_phases_are_recorded_only_while_recording():
    with step_phases.timed("forward"):
        pass
    step_phases.add("generation", 1.0)
    assert step_phases.take() == {} and not step_phases.recording()
    step_phases.start_recording()
    try:
        with step_phases.timed("forward"):
            time.sleep(0.01)
        step_phases.add("generation", 1.5)
        step_phases.add("generation", 0.5)
        taken = step_phases.take()
        assert set(taken) == {"forward", "generation"} and taken["generation"] == 2.0 and taken["forward"] >= 0.01
        assert step_phases.take() == {}  # taken once
    finally:
        step_phases.stop_recording()
    with step_phases.timed("forward"):
        pass
    assert step_phases.take() == {}


def test_the_healthy_run_wrote_each_steps_phases_within_its_wall_time(healthy_toy_run):
    lines = [json.loads(line) for line in (healthy_toy_run.root / PHASE_TIMES).read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    for line in lines:
        phases = {key[:-2]: value for key, value in line.items() if key not in ("step", "wall_s", "other_s")}
        assert STEP_PHASES <= set(phases), sorted(phases)
        assert all(seconds >= 0 for seconds in phases.values())
        assert line["other_s"] == pytest.approx(line["wall_s"] - sum(phases.values()))
        assert line["other_s"] >= 0  # the phases happened within the step's wall time and do not overlap


def test_profile_fit_moves_the_sweep_inside_training_and_drops_the_export(tmp_path):
    args = profile_fit.argparse.Namespace(config=str(REPO / "configs/quickstart.yaml"), sweep_every=3)
    config = yaml.safe_load(profile_fit.profiled_config(args, tmp_path).read_text())
    original = yaml.safe_load((REPO / "configs/quickstart.yaml").read_text())
    names = [callback["class_path"].rsplit(".", 1)[1] for callback in config["trainer"]["callbacks"]]
    assert names == ["ModelCheckpoint", "TemperatureSweepCallback"]
    sweep = config["trainer"]["callbacks"][1]["init_args"]
    assert (sweep["every_n_steps"], sweep["run_at_start"], sweep["run_at_end"]) == (3, False, False)
    assert sweep["sweep"] == original["trainer"]["callbacks"][2]["init_args"]["sweep"]
    assert {key: config[key] for key in ("model", "data", "rollout")} == {
        key: original[key] for key in ("model", "data", "rollout")
    }


def test_profile_fit_summarises_the_timed_steps():
    records = [
        {"step": 1, "wall_s": 9.0, "forward_s": 5.0, "other_s": 4.0},
        {"step": 2, "wall_s": 2.0, "forward_s": 1.0, "generation_s": 0.5, "other_s": 0.5},
        {"step": 3, "wall_s": 4.0, "forward_s": 3.0, "other_s": 1.0},
    ]
    summary = profile_fit.summarise(records, skip=1)
    assert summary["timed_steps"] == 2 and summary["wall_s_median"] == 3.0
    assert summary["median_s"] == {"forward": 2.0, "generation": 0.25, "other": 0.75}
    assert summary["share_of_wall"] == {"forward": 4.0 / 6.0, "generation": 0.5 / 6.0, "other": 1.5 / 6.0}
