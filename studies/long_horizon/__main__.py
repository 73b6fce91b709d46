"""`python -m studies.long_horizon [--quick | --report-only | ...]`: the study of studies/long_horizon/study.py."""

from studies.long_horizon.study import main

main()
