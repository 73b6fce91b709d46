"""Seeded task generators beyond the toy (erpo_lightning.toy), for the studies: see `arithmetic`."""
