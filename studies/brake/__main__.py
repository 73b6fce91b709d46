"""`python -m studies.brake [--quick | --report-only | ...]`: the brake study (studies/brake/run.py)."""

from studies.brake.run import main

main()
