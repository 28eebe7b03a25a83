"""Plot helpers shared by the reports (matplotlib on the Agg backend; imported only when a report draws)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend with the reports' font size and resolution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "figure.dpi": 100, "savefig.dpi": 100})
    return plt


def save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG by its suffix; folders made), close it, and return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
