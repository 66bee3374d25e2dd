"""Pictures of a dataset: a grid of images with boxes, class names, landmarks (visibility
shown, flip pairs in one hue each) and image classes; and predictions beside the truth
(``draw``). ``detloader show PATH --out grid.png`` is the command line.
"""

from detloader.show.draw import (
    Grid,
    class_color,
    grid_size,
    landmark_colors,
    pick_images,
    show_dataset,
    show_predictions,
)

__all__ = ["Grid", "class_color", "grid_size", "landmark_colors", "pick_images", "show_dataset", "show_predictions"]
