"""`python -m studies.real_model [--model-path ... | --report-only | --quick | ...]`: the real-model study
(studies/real_model/study.py says how)."""

from studies.real_model.study import main

main()
