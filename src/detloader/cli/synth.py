"""``detloader synth OUT``: write the synthetic face dataset."""

from __future__ import annotations

import argparse

from detloader.cli._common import console, progress_bar
from detloader.errors import DetloaderValueError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write the deterministic synthetic VOC dataset")
    p.add_argument("out", help="output folder (created)")
    p.add_argument("--images", type=int, default=200, help="number of images (default: 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", default="320x240", help="WIDTHxHEIGHT (default: 320x240)")
    p.add_argument("--max-objects", type=int, default=4)
    p.add_argument("--no-images", action="store_true", help="write only the XML files")
    p.add_argument("--image-pool", type=int, help="distinct images to draw; the rest are hard links")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detloader.synth import make_synthetic

    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise DetloaderValueError(f"--size={args.size!r} is not WIDTHxHEIGHT") from None
    with progress_bar("synthesising") as progress:
        out = make_synthetic(
            args.out,
            args.images,
            seed=args.seed,
            size=(w, h),
            max_objects=args.max_objects,
            write_images=not args.no_images,
            image_pool=args.image_pool,
            progress=progress,
        )
    console().print(f"wrote {args.images} images to {out}")
    return 0
