"""``fedlightning-dashboard PROJECT``: a saved W&B report of accuracy against bits, one line per setting.

The report holds one panel grid over the project's runs, grouped by the ``setting`` config key
that :func:`fedlightning.tracking.flat_config` records (the overrides that change a run, the
seed aside: :func:`fedlightning.tracking.setting`): validation and test accuracy against
cumulative uplink bits and total bits (log x-axis), and against rounds; each setting of a grid
(method × compressor × sampler × partition ...) a line, its mean over its seeds with a
standard-deviation band. Grouping by one axis alone (``method``) would average a method's
compressors into one line.

Saving a report needs the network, a W&B login (``wandb login``) and W&B's report API, the
``wandb-workspaces`` package (``pip install 'fedlightning[dashboard]'`` or
``pip install wandb-workspaces``). Without any of them, or with ``--offline``, the command
writes the report's specification, ``<out>.json`` and a ``<out>.md`` with the same panels
spelled out, to apply later: ``fedlightning-dashboard PROJECT --from-spec <out>.json`` once online.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The x-axes of the panels: (metric, log scale, label).
X_AXES = (
    ("comm/uplink_bits_total", True, "cumulative uplink bits"),
    ("comm/bits_total", True, "cumulative uplink + downlink bits"),
    ("round", False, "round"),
)
GROUP_KEY = "setting"


def report_spec(
    project: str,
    *,
    entity: str | None = None,
    metrics: Sequence[str] = ("val/acc", "test/acc"),
    title: str | None = None,
) -> dict[str, Any]:
    """The report as plain data: one panel per (metric, x-axis), runs grouped by ``setting``.

    >>> spec = report_spec("fl")
    >>> [p["x"] for p in spec["panels"]][:3], spec["panels"][0]["groupby"]
    (['comm/uplink_bits_total', 'comm/bits_total', 'round'], 'config.setting')
    """
    panels = [
        {
            "title": f"{metric} vs {label}",
            "x": x,
            "y": [metric],
            "log_x": log_x,
            "groupby": f"config.{GROUP_KEY}",
            "groupby_aggfunc": "mean",
            "groupby_rangefunc": "stddev",
        }
        for metric in metrics
        for x, log_x, label in X_AXES
    ]
    return {
        "project": project,
        "entity": entity,
        "title": title or f"{project}: accuracy at equal bits",
        "description": "Accuracy against the bits that crossed the wire, one line per setting "
        "(mean over its seeds, standard-deviation band); written by fedlightning-dashboard.",
        "runset_groupby": [f"config.{GROUP_KEY}"],
        "panels": panels,
    }


def spec_markdown(spec: dict[str, Any]) -> str:
    """The specification as a Markdown page: what to build by hand in the W&B UI, or apply later."""
    lines = [
        f"# {spec['title']}",
        "",
        spec["description"],
        "",
        f"Project `{spec['project']}`" + (f", entity `{spec['entity']}`" if spec["entity"] else "") + ".",
        f"Group the run set by `{', '.join(spec['runset_groupby'])}`.",
        "",
        "| panel | y | x | log x | group by | line | band |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in spec["panels"]:
        lines.append(
            f"| {p['title']} | {', '.join(p['y'])} | {p['x']} | {'yes' if p['log_x'] else 'no'} | "
            f"{p['groupby']} | {p['groupby_aggfunc']} | {p['groupby_rangefunc']} |"
        )
    return "\n".join(lines) + "\n"


def save_report(spec: dict[str, Any]) -> str:
    """Save ``spec`` as a W&B report with ``wandb_workspaces``; returns its URL.

    Raises:
        ImportError: ``wandb_workspaces`` is not installed.
    """
    import wandb_workspaces.reports.v2 as wr

    def group(key: str) -> Any:
        name = key.removeprefix("config.")
        return wr.Config(name) if hasattr(wr, "Config") else key

    runset = wr.Runset(
        entity=spec["entity"] or "", project=spec["project"], groupby=[group(k) for k in spec["runset_groupby"]]
    )
    panels = [
        wr.LinePlot(
            title=p["title"],
            x=p["x"],
            y=p["y"],
            log_x=p["log_x"],
            groupby=group(p["groupby"]),
            groupby_aggfunc=p["groupby_aggfunc"],
            groupby_rangefunc=p["groupby_rangefunc"],
        )
        for p in spec["panels"]
    ]
    report = wr.Report(
        entity=spec["entity"] or "",
        project=spec["project"],
        title=spec["title"],
        description=spec["description"],
        blocks=[wr.PanelGrid(runsets=[runset], panels=panels)],
    )
    report.save()
    return str(report.url)


def write_spec(spec: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``<out>.json`` and ``<out>.md``; returns their paths."""
    out.parent.mkdir(parents=True, exist_ok=True)
    as_json, as_md = out.with_suffix(".json"), out.with_suffix(".md")
    as_json.write_text(json.dumps(spec, indent=2) + "\n")
    as_md.write_text(spec_markdown(spec))
    return as_json, as_md


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fedlightning-dashboard`` command."""
    parser = argparse.ArgumentParser(
        prog="fedlightning-dashboard",
        description="Create a saved W&B report of accuracy against bits, one line per setting (its seeds averaged).",
    )
    parser.add_argument("project", help="the W&B project the runs were logged to (logger.wandb.project)")
    parser.add_argument("--entity", default=None, help="the W&B user or team (default: yours)")
    parser.add_argument("--title", default=None, help="the report's title")
    parser.add_argument("--metric", action="append", default=None, help="a y metric (repeatable; val/acc, test/acc)")
    parser.add_argument("--offline", action="store_true", help="only write the specification files")
    parser.add_argument("--out", type=Path, default=None, help="specification files <out>.json/.md")
    parser.add_argument("--from-spec", type=Path, default=None, help="save the report of a written <out>.json")
    args = parser.parse_args(argv)

    if args.from_spec is not None:
        spec = json.loads(args.from_spec.read_text())
    else:
        spec = report_spec(
            args.project, entity=args.entity, metrics=args.metric or ("val/acc", "test/acc"), title=args.title
        )
    out = args.out or Path(f"dashboard-{args.project}")
    if not args.offline:
        try:
            url = save_report(spec)
        except ImportError:
            reason = "W&B's report API is not installed (pip install wandb-workspaces)"
        except Exception as exc:  # no network, no login, no such project: keep the spec
            reason = (
                f"W&B refused the report ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
            )
        else:
            print(f"fedlightning-dashboard: saved the report {url}")
            return 0
        print(f"fedlightning-dashboard: {reason}; writing the report's specification instead.", file=sys.stderr)
    as_json, as_md = write_spec(spec, out)
    print(
        f"fedlightning-dashboard: wrote {as_json} and {as_md}; once online with wandb-workspaces installed, "
        f"run `fedlightning-dashboard {args.project} --from-spec {as_json}` to save it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
