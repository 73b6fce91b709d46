"""Every study the engine runs, by the name `experiments/study_compare.py` takes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_model_study import REAL_MODEL  # noqa: E402
from study_definition import Study  # noqa: E402
from toy_study import TOY  # noqa: E402

STUDIES: dict[str, Study] = {"toy": TOY, "real_model": REAL_MODEL}
