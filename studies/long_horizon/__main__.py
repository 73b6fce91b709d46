"""`python -m studies.long_horizon [--quick | --report-only | ...]`: the study of studies/long_horizon/run.py."""

from studies.long_horizon.run import main

main()
