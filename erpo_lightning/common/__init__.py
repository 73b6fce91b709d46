"""Small leaves any layer may use: the user's one-line errors, file hashes, holder locks, freed heap, setting rules."""
