"""The good-learning-rate study (issue 68): studies/good_lr/good_lr_plan.md."""
