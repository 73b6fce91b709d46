"""Every study the engine runs, by the name `studies/engine/compare.py` takes."""

from studies.engine.definition import Study
from studies.overfit.study import OVERFIT
from studies.real_model.study import REAL_MODEL
from studies.toy.study import TOY

STUDIES: dict[str, Study] = {"toy": TOY, "real_model": REAL_MODEL, "overfit": OVERFIT}
