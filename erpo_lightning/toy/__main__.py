"""`python -m erpo_lightning.toy [--root DIR] [--force]`: build the quickstart's toy model and splits."""

from __future__ import annotations

import argparse

from erpo_lightning.toy.assets import default_root, ensure_toy_assets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m erpo_lightning.toy", description=__doc__)
    parser.add_argument("--root", default=None, help=f"where to build (default {default_root()})")
    parser.add_argument("--force", action="store_true", help="rebuild even when a completed build exists")
    args = parser.parse_args(argv)
    assets = ensure_toy_assets(args.root, force=args.force)
    print(f"model: {assets.model_dir}\ntrain: {assets.train_file}\ntest:  {assets.test_file}")


if __name__ == "__main__":
    main()
