"""page_render's result: the command, the report and the page side by side, in a table, a
headline, figures and notes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.page_render.measure import BUDGET_S, PAGE_ROLE, REPORT_ROLE, STATUS_ROLE, TABS, breakdown
from bench.result import Result, Table
from bench.stats import ms, ratio, safe_div, size_text
from reactor.testing import RECENT_OUTCOMES, dashboard


@dataclass(frozen=True)
class Findings:
    """What the turns, the tabs and the render measured, on the data loaded."""

    total: int
    window: int
    hook_rows: int
    failed: int
    pending: int
    turns: int
    load_s: float
    sizes: dict[str, int]
    turns_found: dict[str, Any]
    tabs: dict[str, Any]
    render: float
    html_bytes: int

    @property
    def medians(self) -> dict[str, float]:
        """Each timing's median over the turns."""
        return {key: statistics.median(values) for key, values in self.turns_found["times"].items()}

    @property
    def cost(self) -> dict[str, dict[str, Any]]:
        """What the command, the report alone and the page cost the database, by run."""
        cost: dict[str, dict[str, Any]] = self.turns_found["cost"]
        return cost

    @property
    def fast(self) -> bool:
        """Whether the page's server time kept to the budget."""
        return self.medians["page cold, server"] <= BUDGET_S

    @property
    def cheap(self) -> bool:
        """Whether the page cost the database no more than one `status`."""
        tabs, status_cost, page_cost = self.tabs, self.cost["status"], self.cost["page"]
        return bool(
            page_cost["calls"] <= status_cost["calls"]
            and page_cost["db_s"] <= status_cost["db_s"] * 1.1
            and tabs["collections"] == 1
            and tabs["warm_calls"] == 0
        )

    @property
    def met(self) -> bool:
        """Whether the page was both fast and cheap."""
        return self.fast and self.cheap


def result_of(found: Findings, *, settings: dict[str, Any], conditions: dict[str, Any]) -> Result:
    """The result of the run: ``settings`` and ``conditions`` as it recorded them."""
    notes = [*_load_notes(found), *_cost_notes(found)]
    met, fast, cheap = found.met, found.fast, found.cheap
    if not met:
        notes.append(
            "Missed: "
            + ("" if fast else f"the page's server time is over {ms(BUDGET_S)}; ")
            + ("" if cheap else "the page costs the database more than one `status`; ")
            + "see the figures above."
        )
    turns_found, tabs, cost = found.turns_found, found.tabs, found.cost
    return Result(
        met=met,
        headline=_headline(found),
        table=_table(found),
        figures={
            "median_s": found.medians,
            "times_s": turns_found["times"],
            "status_cost": cost["status"],
            "report_cost": cost["report"],
            "page_cost": cost["page"],
            "collections": turns_found["collections"],
            "tabs": tabs,
            "render_s": found.render,
            "html_bytes": found.html_bytes,
            "load_s": found.load_s,
            "sizes_bytes": found.sizes,
        },
        settings=settings,
        conditions=conditions,
        notes=notes,
    )


def _table(found: Findings) -> Table:
    """The command, the report and the page, each timed and costed."""
    medians, tabs, render = found.medians, found.tabs, found.render
    status_cost, report_cost, page_cost = (
        found.cost["status"],
        found.cost["report"],
        found.cost["page"],
    )
    table = Table(["what", "server time, median", "round trip, median", "statements", "DB time"])
    for label, key, cost_of in (
        ("`reactor status --json` (the command: connect, checks, report, JSON)",
         "status command", status_cost),
        ("  its report alone (status.collect + as_json, one open connection)",
         "status collect", report_cost),
        ("page `/`, report collected in the request", "page cold", page_cost),
        ("`/api/status`, report collected in the request", "api cold", page_cost),
        (f"page `/` from the cached report (within {dashboard.REPORT_TTL_S:g} s)",
         "page warm", None),
        ("`/api/status` from the cached report", "api warm", None),
    ):  # fmt: skip
        server_key = key if key.startswith("status") else f"{key}, server"
        table.add(
            label,
            ms(medians[server_key]),
            ms(medians[f"{key}, client"]) if f"{key}, client" in medians else "",
            f"{tabs['warm_calls']}" if cost_of is None else f"{cost_of['calls']:.0f}",
            "-" if cost_of is None else ms(cost_of["db_s"]),
        )
    table.add("render alone (render_page on the fetched report)", ms(render), "", "0", "-")
    table.add(
        f"{TABS} tabs at once on an expired report",
        "",
        ms(tabs["slowest_s"]) + " (slowest)",
        f"{tabs['calls']} ({tabs['collections']} collection)",
        ms(tabs["db_s"]),
    )
    return table


def _headline(found: Findings) -> str:
    """The page against the command, in one line."""
    medians, status_cost, page_cost = found.medians, found.cost["status"], found.cost["page"]
    return (
        f"the page takes {ms(medians['page cold, server'])} server time with its report "
        f"collected in the request, {ms(medians['page warm, server'])} from the cached one "
        f"(goal <= 50 ms); it costs the database {page_cost['calls']:.0f} statements, "
        f"{ms(page_cost['db_s'])}, against `status`'s {status_cost['calls']:.0f}, "
        f"{ms(status_cost['db_s'])} ({ratio(safe_div(page_cost['db_s'], status_cost['db_s']))})"
    )


def _load_notes(found: Findings) -> list[str]:
    """What was loaded, and how each turn ran."""
    total, window, hook_rows, failed, pending, turns = (
        found.total,
        found.window,
        found.hook_rows,
        found.failed,
        found.pending,
        found.turns,
    )
    load_s, sizes, html_bytes = found.load_s, found.sizes, found.html_bytes
    return [
        f"{total:,} finished jobs ({window:,} with doc_html), each with its run, loaded without "
        f"the triggers; {hook_rows:,} hook rows: {failed:,} failed, {pending:,} pending, "
        f"{hook_rows - failed - pending:,} done. Loading took {load_s:.0f} s. Sizes: "
        + ", ".join(f"{k} {size_text(v)}" for k, v in sizes.items())
        + ". Before measuring, one replica (grace 1 s) recorded "
        f"{RECENT_OUTCOMES * 2} jobs that had just finished, so its chart and its "
        f"{RECENT_OUTCOMES} recent outcomes are on the page; nothing is due while it is timed.",
        f"{turns} turns, each: `reactor status --json` (cli.cmd_status with DATABASE_URL set "
        "for it, its output discarded), status.collect + as_json on an open connection, then "
        "`/` and `/api/status` each with the cache emptied first (the report is collected "
        "inside the request) and again at once (served from the cached report). Server time: "
        "the aiohttp handler of the reactor's page, end to end (report, this replica's view, "
        "render, response); round trip: the client's GET on loopback, body read. Render alone: "
        "render_page on the report already fetched, median of "
        f"{turns}. The page signed in (a session cookie), so every action button is drawn; "
        f"it is {html_bytes:,} bytes of HTML.",
    ]


def _cost_notes(found: Findings) -> list[str]:
    """What each side cost the database, and how the goal is judged."""
    turns, turns_found, tabs = found.turns, found.turns_found, found.tabs
    status_cost, page_cost = found.cost["status"], found.cost["page"]
    return [
        "Database cost from pg_stat_statements (planning tracked): the command connects as "
        f"{STATUS_ROLE}, the report alone as {REPORT_ROLE}, the page's pool as {PAGE_ROLE}, so "
        "none counts another's nor the replica's statements; the sums are divided by the runs "
        f"and by the page's collections ({turns_found['collections']} for {2 * turns} requests "
        "that emptied the cache). The command's statements per run (a new session: its first "
        "catalog reads are in its buffers): "
        + breakdown(status_cost)
        + ". The page's, per collection (the report's own statements, on a pooled session): "
        + breakdown(page_cost)
        + ". The page's pool also checks its connection before each use (an empty query, "
        "which pg_stat_statements does not see); the command instead opens a connection.",
        f"{TABS} tabs opened at once on an expired report cost {tabs['collections']} "
        f"collection ({tabs['calls']} statements, {ms(tabs['db_s'])}); "
        f"{tabs['warm_requests']} requests inside the report's {dashboard.REPORT_TTL_S:g} s cost "
        f"{tabs['warm_calls']} statements.",
        "The goal's second half is judged on the page's collection against the command: no "
        "more statements, and no more database time than the command's plus 10% (this shared "
        "machine's noise); and on many tabs costing one collection, cached requests none.",
    ]
