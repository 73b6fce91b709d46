"""`python -m studies.good_lr [--quick | --report-only | ...]`: the study of studies/good_lr/run.py."""

from studies.good_lr.run import main

main()
