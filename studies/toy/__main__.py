"""`python -m studies.toy [--quick | --report-only | ...]`: the toy study (studies/toy/study.py says how)."""

from studies.toy.study import main

main()
