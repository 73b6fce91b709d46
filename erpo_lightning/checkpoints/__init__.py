"""A run's files on disk: checkpoints written whole and read with checks, the run config they carry, the resume."""
