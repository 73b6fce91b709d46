"""Does a rerun of the toy study confirm its claims? One verdict per claim: held, not held or not checked.

    python experiments/toy_study.py --out runs/rerun --report runs/rerun/toy_study.md
    python experiments/toy_study_compare.py runs/rerun                  # against docs/toy_study_claims.json

The same as `python experiments/study_compare.py toy ...` (experiments/study_compare.py says how claims are
checked). Exit status 1 when a claim is not held or none could be checked.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_compare import main  # noqa: E402
from toy_study import TOY  # noqa: E402

if __name__ == "__main__":
    main(TOY)
