"""Pictures of a dataset: a grid of images with boxes, class names, landmarks (visibility
shown, flip pairs in one hue each) and image classes; and predictions beside the truth.

``draw`` draws one tile; ``grid`` picks images, lays tiles out and saves the picture.
``detloader show PATH --out grid.png`` is the command line.
"""

from detloader.show.draw import class_color, landmark_colors
from detloader.show.grid import Grid, grid_size, pick_images, show_dataset, show_predictions

__all__ = ["Grid", "class_color", "grid_size", "landmark_colors", "pick_images", "show_dataset", "show_predictions"]
