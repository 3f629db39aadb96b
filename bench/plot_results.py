"""Draw results JSON files (DESIGN.md format) as grouped bars: one panel per bench and
stage, one group per shape, one bar per implementation (and per GPU when several files
are given), the floor as a black tick on each bar; log time axis. Reads the rows only.

    python3 bench/plot_results.py bench/results/sampling-h100-*.json [--out plot.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Keys that are measurements or labels, not part of a row's shape.
# Fields that are not a shape key besides the times (us, us_*: shape_of drops every one) and
# the float fields (a shape key is an integer or a string).
NOT_SHAPE = {"bench", "stage", "impl", "note", "label", "sm_clock_mhz", "git"}


def load_rows(paths: list[Path]) -> list[dict]:
    """Every row, labelled by its impl, and by its file's name less the bench ("h100-20261121")
    when several files are drawn together."""
    rows = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        run = Path(path).stem.split("-", 1)[-1]
        for row in data["rows"]:
            rows.append(row | {"label": f"{row['impl']} ({run})" if len(paths) > 1 else row["impl"]})
    return rows


def plot(paths: list[Path], out: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = load_rows(paths)
    panels: dict[tuple, list[dict]] = {}
    # Rows without a stage that carry graph replays (verify's specops rows) get a second panel
    # of those replays' GPU time (us_graph_queued), the figure an engine's step sees.
    graphs = [row for row in rows if "stage" not in row and "us_graph_queued" in row]
    for row in rows:
        panels.setdefault((row["bench"], row.get("stage", "eager" if graphs else "")), []).append(row)
    for row in graphs:
        panels.setdefault((row["bench"], "graph replay (queued)"), []).append(row | {"us": row["us_graph_queued"]})
    labels = list(dict.fromkeys(row["label"] for row in rows))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    most_groups = max(len({shape_of(row) for row in panel}) for panel in panels.values())
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 1.3 * most_groups), 4.6 * len(panels)), squeeze=False)
    fig.subplots_adjust(hspace=0.65)  # room for the shape labels (up to six lines) under each panel
    for ax, ((bench, stage), panel) in zip(axes[:, 0], panels.items()):
        shapes = list(dict.fromkeys(shape_of(row) for row in panel))
        present = [label for label in labels if any(row["label"] == label for row in panel)]
        width = 0.8 / len(present)
        for row in panel:
            x = shapes.index(shape_of(row)) - 0.4 + width * (present.index(row["label"]) + 0.5)
            ax.bar(x, row["us"], width, color=colors[row["label"]])
            if "floor_us" in row:  # rows with no floor (the engine's scoring step) get no tick
                ax.hlines(row["floor_us"], x - width / 2, x + width / 2, colors="black", linewidth=2)
        handles = [Patch(color=colors[label], label=label) for label in present]
        if any("floor_us" in row for row in panel):
            handles.append(Line2D([], [], color="black", linewidth=2, label="floor (bytes / copy bw)"))
        ax.set_yscale("log")
        ax.set_ylabel("µs (median)")
        ax.set_title(f"{bench} {stage}".strip())
        # one field a line, a filtered mode broken after each "+"
        ticks = ["\n".join(f"{k}={v}".replace("+", "+\n") for k, v in shape) for shape in shapes]
        ax.set_xticks(range(len(shapes)), ticks, fontsize=7)
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    out = Path(out) if out else Path(paths[0]).with_suffix(".png")
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def shape_of(row: dict) -> tuple:
    """The row's shape keys (B, k, V, mode; B, L, q_len, ...): its integer and string fields
    less the measurements (a specops row's us_graph, us_rounds or clock would otherwise make
    its own group, apart from the peers of its shape)."""
    return tuple((key, value) for key, value in row.items()
                 if key not in NOT_SHAPE and not key.startswith("us")
                 and isinstance(value, (str, int)))


def main() -> None:
    parser = argparse.ArgumentParser(description="Plot benchmark results JSON files.")
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="PNG path (default: beside the first file)")
    args = parser.parse_args()
    print(f"wrote {plot(args.paths, args.out)}")


if __name__ == "__main__":
    main()
