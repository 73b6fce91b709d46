"""`python -m studies.brake [--quick | --report-only | ...]`: the brake study (studies/brake/study.py)."""

from studies.brake.study import main

main()
