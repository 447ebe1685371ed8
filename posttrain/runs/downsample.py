"""Downsampling a metric series for drawing, keeping its shape.

A run can log 100,000 points per metric; a chart is a few hundred pixels wide. The
series is cut into equal runs of consecutive points (buckets) and each bucket keeps its
smallest and its largest value, in step order, so spikes and dips survive (a plain
stride or an average would hide the one step where the loss blew up). The first and
last points are always kept, so the curve starts and ends where the data do.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def min_max_indices(values: Sequence[float], max_points: int) -> list[int]:
    """Indices of at most ``max_points`` points of ``values`` that keep each bucket's min and max.

    A series with at most ``max_points`` points keeps every index. ``max_points`` of 1
    keeps the last point, 2 the first and the last. Indices come back in order.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    count = len(values)
    if count <= max_points:
        return list(range(count))
    if max_points == 1:
        return [count - 1]
    value_array = np.asarray(values, dtype=float)
    buckets = (max_points - 2) // 2
    keep = [0]
    if buckets:
        # the interior points 1 .. count-2, cut into `buckets` nearly equal runs
        edges = np.linspace(1, count - 1, buckets + 1).astype(int)
        for start, stop in itertools.pairwise(edges):
            if stop <= start:
                continue
            chunk = value_array[start:stop]
            low = start + int(np.argmin(chunk))
            high = start + int(np.argmax(chunk))
            keep.extend(sorted({low, high}))
    keep.append(count - 1)
    return keep


def downsample_min_max(
    steps: Sequence[float], values: Sequence[float], max_points: int
) -> tuple[list[float], list[float]]:
    """At most ``max_points`` (step, value) pairs of the series (see ``min_max_indices``).

    ``steps`` and ``values`` are parallel and ordered by step; returns two lists.
    """
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length: {len(steps)} vs {len(values)}")
    keep = min_max_indices(values, max_points)
    return [float(steps[index]) for index in keep], [float(values[index]) for index in keep]
