"""Every leniency of the grader is a named option: each convention changes its example's verdict when switched.

Also: presets, the ``math_verify`` backend, and what ``erpo validate`` records about the grader.
"""

from __future__ import annotations

import json

import pytest

from erpo_lightning.evaluation.report import write_results
from erpo_lightning.evaluation.sweep import SweepConfig
from erpo_lightning.evaluation.validate import grader_settings, grader_summary
from erpo_lightning.rewards import MathReward
from erpo_lightning.rewards.conventions import CONVENTIONS, GraderSettings, make_settings
from erpo_lightning.rewards.math_reward import Verdict

# convention -> (gold, answer) accepted with the convention on and rejected with it off.
EXAMPLES = {
    "approximations": ("\\frac{8}{3}", "2.667"),
    "assignment": ("5", "x = 5"),
    "percent": ("28\\%", "0.28"),
    "degrees": ("90^\\circ", "90"),
    "units": ("10\\text{ cm}", "10"),
    "thousands": ("7425000", "7,425,000"),
    "list_as_set": ("1, 2", "\\{2, 1\\}"),
    "set_as_tuple": ("\\{1, 2\\}", "(2, 1)"),
    "text_case": ("\\text{Evelyn}", "evelyn"),
    "choice_letters": ("C", "\\text{(C)}"),
    "base_subscripts": ("42", "52_8"),
    "clock_times": ("20:34", "8:34 PM"),
    "mixed_numbers": ("3.5", "3 1/2"),
    "plus_minus": ("\\pm 2", "2, -2"),
    "scientific": ("1500", "1.5e3"),
    "matrix_as_tuple": ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "(1, 2)"),
    "font_markup": ("B", "\\mathcal{B}"),
    "doubled_backslashes": ("0.5", "\\\\frac{1}{2}"),
    "symbolic_extras": ("1+2i", "i(2-i)"),
    "unsimplified_values": ("1", "\\frac{3}{3}"),
    "unevaluated_arithmetic": ("70", "\\binom{8}{4}"),  # a sum such as `5 + 9 + 5` is `unsimplified_values` now
    "equation_right_side": ("7", "5 = 7"),
    "invisible_characters": ("12", "1\u200b2"),
}
ALL_OFF = {name: False for name in CONVENTIONS if name != "numeric_tolerance"}


@pytest.fixture(scope="module")
def graders():
    on = MathReward(num_workers=1, conventions={name: True for name in ALL_OFF})
    off = MathReward(num_workers=1, conventions=ALL_OFF)
    yield on, off
    on.close()
    off.close()


def test_every_convention_has_an_example():
    assert set(EXAMPLES) | {"multiple_boxes", "numeric_tolerance"} == set(CONVENTIONS)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_convention_decides_its_example(graders, name):
    on, off = graders
    gold, answer = EXAMPLES[name]
    verdict = on.grade([f"\\boxed{{{answer}}}"], [gold])[0]
    assert verdict.correct and name in verdict.conventions
    assert off([f"\\boxed{{{answer}}}"], [gold]) == [0.0]


def test_multiple_boxes_and_numeric_tolerance():
    response = "The roots are \\boxed{2} and \\boxed{3}."
    with MathReward(num_workers=0) as default, MathReward(num_workers=0, conventions={"multiple_boxes": False}) as one:
        assert default([response], ["2, 3"]) == [1.0]
        assert one([response], ["2, 3"]) == [0.0]
        assert one([response], ["3"]) == [1.0]
    with MathReward(num_workers=0) as default, MathReward(num_workers=0, fallbacks=[], bare_max_chars=0) as boxes:
        long_prose = "We work it out step by step. " * 10
        assert default.grade([long_prose + "Answer: 7", "7"], ["7", "7"]) == [
            Verdict(True, conventions=("answer_markers",)),
            Verdict(True, conventions=("bare_answers",)),
        ]
        assert boxes([long_prose + "Answer: 7", "7", "\\boxed{7}"], ["7"] * 3) == [0.0, 0.0, 1.0]
        assert "bare_answers" not in boxes.enabled_conventions() and "bare_answers" in default.enabled_conventions()
    with MathReward(num_workers=0) as exact, MathReward(num_workers=0, rel_tol=1e-6) as tolerant:
        assert exact(["\\boxed{1000000.4}"], ["1000000"]) == [0.0]
        assert tolerant.grade(["\\boxed{1000000.4}"], ["1000000"])[0].conventions == ("numeric_tolerance",)


def test_decimals_compare_at_float_rounding():
    # |1/3 - 0.333333| < 5e-7: equal at 6 places (Math-Verify's default), not at 7.
    with MathReward(num_workers=0) as six, MathReward(num_workers=0, float_rounding=7) as seven:
        assert six(["\\boxed{0.333333}", "\\boxed{0.33333}"], ["\\frac{1}{3}"] * 2) == [1.0, 0.0]
        assert seven(["\\boxed{0.333333}"], ["\\frac{1}{3}"]) == [0.0]


def test_presets_and_errors():
    assert not GraderSettings().approximations and GraderSettings().rel_tol == 0
    lenient = make_settings("lenient")
    assert lenient.approximations and lenient.rel_tol == 1e-6
    assert make_settings("lenient", {"approximations": False}).approximations is False
    with pytest.raises(ValueError, match="unknown grader conventions \\['percents'\\]"):
        MathReward(conventions={"percents": False})
    with pytest.raises(ValueError, match="unknown grader preset"):
        MathReward(preset="loose")
    with pytest.raises(ValueError, match="backend="):
        MathReward(backend="sympy")
    with pytest.raises(ValueError, match="max_depth=0"):
        MathReward(max_depth=0)


def test_math_verify_backend_is_math_verify_itself():
    responses = ["So \\boxed{\\frac{1}{2}}.", "\\boxed{0.333}", "\\boxed{52_8}", "The answer is 7"]
    golds = ["0.5", "\\frac{1}{3}", "42", "7"]
    with MathReward(num_workers=1, backend="math_verify", timeout_s=5.0) as reward:
        assert reward(responses, golds) == [1.0, 0.0, 0.0, 1.0]
        assert reward.counters()["symbolic"] == 4  # every pair went to a worker


def test_validate_records_the_grader_settings(tmp_path):
    reward = MathReward(num_workers=0, accept_approximations=True)
    settings = grader_settings(reward)
    assert settings["approximations"] is True and settings["preset"] == "strict"
    assert "approximations" in settings["conventions_on"]
    assert "preset=strict" in grader_summary(settings) and "approximations" in grader_summary(settings)
    assert grader_settings(lambda responses, golds: [0.0] * len(responses))["class"].endswith("<lambda>")
    rows = [{"run": "base", "benchmark": "mean", "temperature": "0.6", "avg@k": 0.5}]
    paths = write_results(tmp_path, SweepConfig(temperatures=[0.6]), [], rows, settings)
    document = json.loads(paths["json"].read_text())
    assert document["grader_settings"]["approximations"] is True
    assert document["grader_settings"]["float_rounding"] == 6


@pytest.mark.parametrize("temperatures", [[0.6, 0.0], [-1.0], [0.5, -0.1]])
def test_sweep_refuses_non_positive_temperatures(temperatures):
    with pytest.raises(ValueError, match="sweep.temperatures: every temperature must be > 0"):
        SweepConfig(temperatures=temperatures)
