"""Does a rerun of the toy study confirm its claims? One verdict per claim: held, not held or not checked.

    python -m studies.toy --out runs/rerun --report runs/rerun/toy_study.md
    python -m studies.toy.compare runs/rerun                  # against studies/toy/toy_study_claims.json

The same as `python -m studies.engine.compare toy ...` (studies/engine/compare.py says how claims are
checked). Exit status 1 when a claim is not held or none could be checked.
"""

from studies.engine.compare import main
from studies.toy.study import TOY

if __name__ == "__main__":
    main(TOY)
