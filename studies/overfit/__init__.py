"""The overfitting study (issue 39): ERPO's stability claims in a regime where GRPO memorises its training queries."""
