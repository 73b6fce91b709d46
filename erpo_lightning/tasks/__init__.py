"""Seeded task generators beyond the toy (erpo_lightning.toy): see `arithmetic`."""
