"""The brake study (issue 50): controls, trajectories and a memorisation measure in the overfitting regime."""
