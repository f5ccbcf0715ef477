"""matplotlib for `--plots` and the figure scripts, which is an optional extra (`tessera[plots]`).

The simulator itself never needs it; only drawing does, so a missing install is reported in one line
naming the extra, before any simulation runs, instead of an ImportError traceback after it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'tessera[plots]'"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise PlotsUnavailable, naming the extra to install, when matplotlib cannot be imported."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotsUnavailable(f"plots need matplotlib, which is not installed: {INSTALL_HINT}")


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (files only, no display needed)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, path: Path, dpi: int = 120) -> Path:
    """Lay out, write and close `fig`; returns `path`."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
