"""Small PNG plots for asset metadata (Dagster-free; matplotlib's Agg backend, no display)."""

from __future__ import annotations

import base64
import io
from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display on a server or in a worker process)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure():
    plt = pyplot()
    return plt, plt.subplots(figsize=(6, 3.2), dpi=100)


def figure_png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def histogram_png(values: list[float], *, bins: int = 10, title: str, xlabel: str) -> bytes:
    plt, (fig, ax) = _figure()
    ax.hist(values, bins=bins, range=(0.0, 1.0), color="#4c72b0", edgecolor="white")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("turns")
    return figure_png(plt, fig)


def bars_png(labels: list[str], values: list[float], *, title: str, ylabel: str) -> bytes:
    """One bar per label, its value written on top (the pivot funnel)."""
    plt, (fig, ax) = _figure()
    bars = ax.bar(labels, values, color="#4c72b0")
    for bar, value in zip(bars, values):
        ax.annotate(f"{value:g}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    return figure_png(plt, fig)


def lines_png(series: dict[str, list[tuple[float, float]]], *, title: str, xlabel: str = "step") -> bytes:
    """One line per named series of (x, y) points."""
    plt, (fig, ax) = _figure()
    for name, points in series.items():
        pts = [(x, y) for x, y in points if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    return figure_png(plt, fig)


def stacked_bars_png(labels: list[str], stacks: dict[str, list[float]], *, title: str, ylabel: str) -> bytes:
    """One bar per label made of one segment per named stack (the turns per bucket in each refresh round)."""
    plt, (fig, ax) = _figure()
    bottom = [0.0] * len(labels)
    for name, heights in stacks.items():
        ax.bar(labels, heights, bottom=bottom, label=name)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return figure_png(plt, fig)


def save_png(png: bytes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


def markdown_image(png: bytes, alt: str) -> str:
    """Inline the PNG in markdown metadata (the Dagster UI renders data URIs)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"
