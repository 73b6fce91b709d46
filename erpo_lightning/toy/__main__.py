"""`python -m erpo_lightning.toy [--root DIR] [--force] [--ship]`: rebuild the toy model, compare it with the shipped.

The quickstart and the toy study use the shipped model (`erpo_lightning/toy/shipped`), not a rebuild: pre-training
stops at a step that floating-point rounding can move between CPUs. A rebuild says whether its weights and splits
equal the shipped ones; `--ship` (maintainers) makes the rebuild the shipped model.
"""

from __future__ import annotations

import argparse

from erpo_lightning.toy.assets import default_root, ensure_toy_assets
from erpo_lightning.toy.ship import SHIPPED_DIR, SHIPPED_MANIFEST, compare_with_shipped, ship


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m erpo_lightning.toy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=None, help=f"where to build (default {default_root()})")
    parser.add_argument("--force", action="store_true", help="rebuild even when a completed build exists")
    parser.add_argument("--ship", action="store_true", help=f"replace the shipped model in {SHIPPED_DIR} by this build")
    args = parser.parse_args(argv)
    assets = ensure_toy_assets(args.root, force=args.force)
    print(f"model: {assets.model_dir}\ntrain: {assets.train_file}\ntest:  {assets.test_file}")
    if (SHIPPED_DIR / SHIPPED_MANIFEST).is_file():
        same, lines = compare_with_shipped(assets)
        print("\n".join(lines))
        verdict = "equals" if same else "differs from"
        print(f"this build {verdict} the shipped toy model ({SHIPPED_DIR}), which the quickstart and the study use")
    if args.ship:
        manifest = ship(assets)
        print(f"shipped: {SHIPPED_DIR} (sha256 {manifest['sha256']})")


if __name__ == "__main__":
    main()
