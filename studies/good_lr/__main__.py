"""`python -m studies.good_lr [--quick | --report-only | ...]`: the study of studies/good_lr/study.py."""

from studies.good_lr.study import main

main()
