"""Settings that used to be accepted without a word (issue 54): a key given twice in a config file (YAML keeps the
last one; item 8), and a Query-KL tolerance so wide that it switches the loss off (item 9). Both are refused before
anything loads, in one line naming the key or the field; the `erpo` runs are in this process."""

from __future__ import annotations

import pytest
import yaml
from helpers.cli_runs import fails_in_one_line
from helpers.fit_configs import fit_config, write_config

from erpo_lightning.objectives import MAX_QUERY_KL_TOLERANCE
from erpo_lightning.objectives.algorithms import resolve_algorithm
from erpo_lightning.toy import SHIPPED_DIR


def config_file(tmp_path, **changes) -> str:
    """A valid 2-step config of the shipped toy model, as YAML text (`changes` by section)."""
    train = [{"path": str(SHIPPED_DIR / "train.jsonl"), "limit": 8}]
    return yaml.safe_dump(fit_config(SHIPPED_DIR, train, tmp_path / "run", **changes), sort_keys=False)


# ---------------------------------------------------------------------------- item 9: a tolerance too wide to mean
@pytest.mark.parametrize("tolerance", [1e9, float("inf"), 1.5])
def test_a_query_kl_tolerance_beyond_any_noise_is_refused_by_the_owner(tolerance):
    with pytest.raises(ValueError, match=r"model.query_kl_tolerance must be at most 1 nat per query token") as error:
        resolve_algorithm("erpo", query_kl_tolerance=tolerance)
    assert "switch the Query-KL loss off" in str(error.value) and "query_kl_coef 0" in str(error.value)


@pytest.mark.parametrize("tolerance", [None, 0.0, 1e-3, 0.1, MAX_QUERY_KL_TOLERANCE])
def test_tolerances_up_to_one_nat_are_kept(tolerance):
    assert resolve_algorithm("erpo", query_kl_tolerance=tolerance).query_kl_tolerance == tolerance


def test_erpo_fit_refuses_it_before_anything_loads(tmp_path, capsys):
    path = write_config(tmp_path / "fit.yaml", yaml.safe_load(config_file(tmp_path)))
    line = fails_in_one_line(capsys, "fit", "--config", str(path), "--model.query_kl_tolerance", "1e9")
    assert line.startswith("erpo: error: model.query_kl_tolerance must be at most 1 nat per query token, got 1e+09")
