"""Scoring a causal LM's forward: token log-probs and entropy, the fused output layer, how queries are laid out."""
