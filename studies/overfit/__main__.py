"""`python -m studies.overfit [--quick | --report-only | ...]`: the overfitting study (studies/overfit/study.py)."""

from studies.overfit.study import main

main()
