"""One way to get a matplotlib figure: the optional ``plot`` extra, imported only when drawing.

Figures are drawn on the Agg canvas without pyplot, so plotting from a library call never
touches the caller's pyplot state or needs a display.
"""

from __future__ import annotations

from typing import Any

from detloader.errors import MissingExtraError


def new_figure(**kwargs: Any) -> Any:
    """A ``matplotlib.figure.Figure`` (``figsize``, ``dpi``, ``layout``... as matplotlib takes
    them) attached to an Agg canvas; :class:`MissingExtraError` when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise MissingExtraError("plotting needs matplotlib: pip install 'detloader[plot]'") from err
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig
