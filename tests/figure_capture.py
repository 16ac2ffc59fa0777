"""Records the figures `tft_jax.plots` saves, so that tests can read what was drawn."""

from __future__ import annotations

from tft_jax import plots


def _capture_figures(monkeypatch) -> list:
    """Records each figure `plots` saves (and still writes it)."""
    figures = []
    save = plots._save

    def record(figure, path):
        figures.append(figure)
        return save(figure, path)

    monkeypatch.setattr(plots, "_save", record)
    return figures
