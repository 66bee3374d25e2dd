"""One way to get a matplotlib figure: the optional ``plot`` extra, imported only when drawing.

Figures are drawn on the Agg canvas without pyplot, so plotting from a library call never
touches the caller's pyplot state or needs a display.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PlotExtraMissing", "new_figure"]


class PlotExtraMissing(ImportError):
    """matplotlib is not installed; the message names the extra that brings it."""


def new_figure(**kwargs: Any) -> Any:
    """A ``matplotlib.figure.Figure`` (``figsize``, ``dpi``, ``layout``... as matplotlib takes
    them) attached to an Agg canvas; :class:`PlotExtraMissing` when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise PlotExtraMissing("plotting needs matplotlib: pip install 'detloader[plot]'") from err
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig
