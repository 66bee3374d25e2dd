"""``detloader show PATH``: a grid of images with their annotations drawn, as a PNG."""

from __future__ import annotations

import argparse

from detloader.cli._common import (
    add_cache_arguments,
    add_read_arguments,
    console,
    read_index,
    require_images,
)
from detloader.errors import DetloaderValueError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="draw a grid of images with boxes, class names, landmarks and image classes",
    )
    add_read_arguments(p)
    p.add_argument("--out", default="grid.png", help="picture to write (default: grid.png)")
    p.add_argument("--n", type=int, default=16, help="images in the grid (default: 16)")
    p.add_argument("--split", help="only images of this split (ImageSets/Main/SPLIT.txt or a split file)")
    p.add_argument("--class", dest="class_name", metavar="C", help="only images with an object (or image class) C")
    p.add_argument(
        "--after-transform",
        action="store_true",
        help="show augmented samples (random horizontal flip, then letterbox to --size) instead of the stored images",
    )
    p.add_argument("--size", type=int, default=320, help="letterbox side with --after-transform (default: 320)")
    p.add_argument("--flip", type=float, default=0.5, help="flip probability with --after-transform (default: 0.5)")
    p.add_argument(
        "--affine", action="store_true",
        help="with --after-transform: a random affine first (10 degrees, scale 0.75-1.25, shear 2)",
    )
    p.add_argument(
        "--mosaic", type=float, default=0.0, metavar="P",
        help="with --after-transform: share of mosaics of each image and the next 3 (default: 0)",
    )
    p.add_argument("--tile", type=int, default=256, help="pixels per tile (default: 256)")
    p.add_argument("--seed", type=int, default=0, help="which images, and the augmentation (default: 0)")
    add_cache_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detloader.dataset import DetectionDataset
    from detloader.show import show_dataset

    index = read_index(args, reports_problems=False, bar=True)
    require_images(index, "show")
    if args.split is not None:
        index = index.split(args.split)
    data = index
    if args.cache and not args.after_transform:
        raise DetloaderValueError(
            "--cache applies with --after-transform (the grid otherwise shows the files as they are)"
        )
    if args.after_transform:
        from detloader.transforms import Compose, Mosaic, RandomAffine, RandomHorizontalFlip, Resize

        if args.size < 1:
            raise DetloaderValueError(f"--size={args.size} must be >= 1")
        affine = [RandomAffine(10, scale=(0.75, 1.25), shear=2)] if args.affine else []
        transform = Compose([*affine, RandomHorizontalFlip(p=args.flip), Resize(args.size, mode="letterbox")])
        data = DetectionDataset(index, transform, seed=args.seed, cache=args.cache, cache_size=args.cache_size)
        if args.mosaic:
            data = data.with_mix(Mosaic(args.mosaic))
    grid = show_dataset(
        data, args.out, n=args.n, class_name=args.class_name, after_transform=args.after_transform,
        seed=args.seed, tile=args.tile,
    )
    w, h = grid.image.size
    console().print(f"{grid.path}: {len(grid.image_ids)} images, {w}x{h} pixels")
    return 0
