"""The style of a chapter page's figure: page width, 10-point text.

Every figure a page shows is drawn in this style, by :mod:`servebook.figures` or by a lab's own
``plot_*`` function (Lab 3's :func:`servebook.lab.analyses.lab3_preemption.plot_l3`); both import it
from here, so a lab never imports the figures module (which draws some figures from the labs).
"""
from __future__ import annotations

from contextlib import contextmanager

#: Figure size on a chapter page, inches (width, height): the text column's width.
PAGE_FIGSIZE = (7.0, 3.5)
#: Text size on a chapter page, points: never smaller than the body text's footnotes.
PAGE_FONT_PT = 10

_PAGE_RC = {"font.size": PAGE_FONT_PT, "axes.titlesize": PAGE_FONT_PT, "axes.labelsize": PAGE_FONT_PT,
            "xtick.labelsize": PAGE_FONT_PT, "ytick.labelsize": PAGE_FONT_PT, "legend.fontsize": PAGE_FONT_PT}


@contextmanager
def page_style():
    """Matplotlib settings of a chapter-page figure (10-point text) for the ``with`` block."""
    import matplotlib.pyplot as plt

    with plt.rc_context(_PAGE_RC):
        yield


def page_axes(figsize=PAGE_FIGSIZE):
    """A new figure of page width with one Axes (call inside :func:`page_style`)."""
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)
