"""Every study the engine runs, by the name `studies/engine/compare.py` takes."""

from studies.brake.run import BRAKE
from studies.engine.definition import Study
from studies.long_horizon.run import LONG_HORIZON
from studies.overfit.study import OVERFIT
from studies.real_model.study import REAL_MODEL
from studies.toy.study import TOY

STUDIES: dict[str, Study] = {"toy": TOY, "real_model": REAL_MODEL, "overfit": OVERFIT, "brake": BRAKE,
                             "long_horizon": LONG_HORIZON}  # fmt: skip
