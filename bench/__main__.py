"""``python -m bench [NAME ...] [--quick] [--results DIR]``: run benchmarks, write the report.

Each benchmark writes ``DIR/NAME.json``; the report is then rendered from every JSON file in
``DIR``. With the default results directory the report is ``bench/REPORT.md``; with another one
it is ``DIR/REPORT.md``, so a quick run never touches the committed figures. The exit status is
non-zero only when a benchmark crashed: a missed goal is a finding, not a failure.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from functools import cache, partial
from importlib.resources import files
from pathlib import Path
from typing import cast

import anyio

from bench.report import (
    REPORT_PATH,
    RESULTS_DIR,
    load_results,
    print_table,
    render_report,
    write_result,
)
from bench.result import Benchmark, Context, product_version
from reactor.install import sql

# Name -> module, in report order. The chosen ones are imported when the run starts.
BENCHMARKS: dict[str, str] = {
    "lateness": "bench.lateness",
    "replicas": "bench.replicas",
    "handoffs": "bench.handoffs",
    "event_latency": "bench.event_latency",
    "catchup": "bench.catchup",
    "set_aside": "bench.set_aside",
    "writes": "bench.writes",
    "trigger_overhead": "bench.trigger_overhead",
    "app_cost": "bench.app_cost",
    "doorbell": "bench.doorbell",
    "scan_scale": "bench.scan_scale",
    "reconcile": "bench.reconcile",
    "migrate_online": "bench.migrate_online",
    "hook_outbox": "bench.hook_outbox",
    "page_render": "bench.page_render",
    "deadlines": "bench.deadlines",
    "idle": "bench.idle",
    "pairs": "bench.pairs",
    "pinning": "bench.pinning",
    "outage": "bench.outage",
    "held_rows": "bench.held_rows",
    "cold_start": "bench.cold_start",
}


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--quick", action="store_true", help="toy scale: everything in < 2 min")
    parser.add_argument(
        "--results", type=Path, default=None, help=f"results directory (default: {RESULTS_DIR})"
    )
    return parser


def freeze_product(names: Sequence[str]) -> dict[str, Benchmark]:
    """Load the benchmarks, the reactor's code and its SQL files now, once.

    A full run takes half an hour while others keep editing reactor/ and triggers/; reading
    everything up front makes the whole run measure one version (recorded in each result).
    """
    modules = {name: cast(Benchmark, importlib.import_module(BENCHMARKS[name])) for name in names}
    read = cache(sql.read)
    for entry in files("triggers").iterdir():
        if entry.name.endswith(".sql"):
            read(entry.name)
    setattr(sql, "read", read)  # noqa: B010 - replace the module's reader for this process
    sql.migrations()
    for name in ("queries.sql", "status.sql", "hooks.sql", "dashboard.sql", "app.sql"):
        sql.templates(name)
    product_version()
    return modules


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen benchmarks; returns the exit status."""
    args = build_parser().parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
        return 2
    names = args.names or list(BENCHMARKS)
    results_dir = (args.results or RESULTS_DIR).resolve()
    report_path = REPORT_PATH if args.results is None else results_dir / "REPORT.md"
    words = ["uv", "run", "python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)]
    ctx = Context(
        quick=args.quick,
        results_dir=results_dir,
        report_path=report_path,
        command=shlex.join(words),
    )
    # The reactor logs every run it records; at benchmark rates that is noise (and cost).
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    modules = freeze_product(names)
    crashed = []
    for name in names:
        module = modules[name]
        print(f"=== {name}: {module.TITLE}", flush=True)
        started = time.monotonic()
        try:
            result = anyio.run(partial(module.run, ctx), backend="asyncio")
        except Exception:
            traceback.print_exc()
            crashed.append(name)
            continue
        result.name, result.title, result.goal = name, module.TITLE, module.GOAL
        result.command = ctx.command
        result.seconds = time.monotonic() - started
        result.conditions["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        path = write_result(ctx, result)
        print_table(result)
        print(f"wrote {path} ({result.seconds:.0f} s)", flush=True)
    report = render_report(load_results(results_dir, list(BENCHMARKS)), results_dir, report_path)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(report)
    print(f"wrote {report_path}")
    if crashed:
        print(f"crashed: {', '.join(crashed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
