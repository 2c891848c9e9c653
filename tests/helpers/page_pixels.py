"""The page read from screenshots in a real Chromium: an element's pixels, the median's blue among
them, where a step lies across a chart, and how much of a stretch a colour covers."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np


def shot(element: Any) -> np.ndarray:
    """The element as the browser painted it: height x width x RGB."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(element.screenshot_as_png)).convert("RGB")).astype(int)


def median_blue(pixels: np.ndarray) -> np.ndarray:
    """The median's dark blue (#08519c), also half-covering a pixel (a 1 px line antialiased over the
    quartile band); not the band's pale blue nor the quartiles' light blue (#9ecae1)."""
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return (r < 140) & (b - r > 60) & (b > g)


def plot_x(driver: Any, series: str, step: float) -> float:
    """Where `step` lies across the chart's plot area, in CSS pixels from its left edge."""
    return driver.execute_script("return MRL_CHARTS[arguments[0]].valToPos(arguments[1], 'x')", series, step)


def covered(colour_at: np.ndarray, x0: float, x1: float) -> float:
    """The share of pixel columns from x0 to x1 holding a pixel of the colour."""
    columns = colour_at.any(axis=0)[int(math.ceil(x0)) : int(x1) + 1]
    return float(columns.mean()) if len(columns) else 0.0
