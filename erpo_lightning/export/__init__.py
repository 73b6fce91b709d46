"""A training checkpoint out of the run: a Hugging Face model folder (`erpo export`) with its model card."""
