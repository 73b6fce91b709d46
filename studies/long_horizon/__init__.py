"""The long-horizon study (issue 51): does GRPO degrade after learning over 1,000 steps, and does ERPO degrade less?"""
