"""The reactor's Prometheus metrics, in a registry of its own per service instance.

A registry per instance lets tests and the demo run several reactors in one process. Every
labelled counter is touched at start, so dashboards show 0 rather than nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Lateness is milliseconds when things work and up to a scan interval when they don't.
_LATENESS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)


# What reactor_job_trigger{state} distinguishes; see reactor.runtime.vitals.trigger_state.
TRIGGER_STATES = ("notifies", "quiet", "elsewhere", "missing")
# The label values of reactor_http_connections_dropped_total; see reactor.ops.http.
HTTP_SERVERS = ("probes", "page")
# Why an HTTP server closed a connection (reactor.ops.admission): the places open to its peer
# were taken (limit), its peer held its most already (peer_limit), no request head came in time
# (head_timeout), a body did not (body_timeout), its answers waited unread (write_stall), it
# pipelined too many requests ahead of their answers (pipelined), or a peer that held none took
# its place (made_room): the label values of reactor_http_connections_dropped_total.
DropReason = Literal[
    "limit",
    "peer_limit",
    "head_timeout",
    "body_timeout",
    "write_stall",
    "pipelined",
    "made_room",
]

HTTP_DROP_REASONS: tuple[str, ...] = get_args(DropReason)


class Metrics:
    """Counters, gauges and histograms of one reactor."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.notifications = Counter(
            "reactor_notifications",
            "Notifications received, by result: accepted (named a job), rejected (named nothing: "
            "garbage, or a job id its column's type cannot hold), unverified (named no queued "
            "job, or a replica joining or leaving that its heartbeat contradicts), dropped (a "
            "job hint over the buffer of hints waiting to be verified), probe, left, joined.",
            ["result"],
            registry=r,
        )
        self.deadlines_pending = Gauge(
            "reactor_deadlines_pending", "Jobs with an armed deadline timer.", registry=r
        )
        self.deadlines_dropped = Counter(
            "reactor_deadlines_dropped",
            "Deadlines not armed because REACTOR_MAX_PENDING was reached; the scan covers them.",
            registry=r,
        )
        self.recorded = Counter(
            "reactor_runs_recorded",
            "Runs the reactor wrote, by what found them.",
            ["source"],
            registry=r,
        )
        self.lateness = Histogram(
            "reactor_lateness_seconds",
            "How long after updated_at + grace a run was recorded, by the database clock.",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.claims_skipped = Counter(
            "reactor_claims_skipped",
            "Due jobs another transaction (usually another replica) held locked.",
            registry=r,
        )
        self.record_errors = Counter(
            "reactor_record_errors", "Record statements that failed and were retried.", registry=r
        )
        self.writes_failing = Gauge(
            "reactor_writes_failing",
            "1 while this pair's record statements fail on its own objects (a column, a table "
            "or a privilege gone): nothing is written, and /readyz says so.",
            registry=r,
        )
        self.record_timeouts = Counter(
            "reactor_record_timeouts",
            "Record statements that hit a lock or statement timeout; batches are then split.",
            registry=r,
        )
        self.stuck_jobs = Gauge(
            "reactor_stuck_jobs",
            "Jobs isolated behind another transaction's row lock, recorded on their own.",
            registry=r,
        )
        self.set_aside_jobs = Gauge(
            "reactor_set_aside_jobs",
            "Queued jobs set aside because their write failed on their own data (the app's "
            "constraint or trigger rejected the row); from the health check, all replicas.",
            registry=r,
        )
        self.jobs_set_aside = Counter(
            "reactor_jobs_set_aside",
            "Times this replica set a job aside after its write failed on its own data.",
            registry=r,
        )
        self.scan_duration = Histogram(
            "reactor_scan_duration_seconds", "Duration of one full fallback scan.", registry=r
        )
        self.scan_rows = Counter(
            "reactor_scan_rows", "Jobs claimed by the fallback scan.", registry=r
        )
        self.reconnects = Counter(
            "reactor_reconnects", "Times the listener connection was re-established.", registry=r
        )
        self.listener_failures = Counter(
            "reactor_listener_failures",
            "LISTEN connection attempts that failed, or sessions that ended in an error.",
            registry=r,
        )
        self.listener_up = Gauge(
            "reactor_listener_up",
            "1 while LISTEN is established and its last delivery probe arrived.",
            registry=r,
        )
        self.queue_usage = Gauge(
            "reactor_notification_queue_usage",
            "pg_notification_queue_usage(): the fraction of the NOTIFY queue in use.",
            registry=r,
        )
        self.oldest_age = Gauge(
            "reactor_oldest_needing_run_age_seconds",
            "Age of the oldest job that needs a run, past its grace (0 when none).",
            registry=r,
        )
        # What the alert rules compare with: the horizon past which a due job's run is lost, and
        # the mode (a replica that polls has no LISTEN to be down).
        self.trim_horizon = Gauge(
            "reactor_trim_horizon_seconds",
            "REACTOR_TRIM_HORIZON_SECONDS: when the app trims a job's document, losing a due job's "
            "run.",
            registry=r,
        )
        self.mode = Gauge(
            "reactor_mode",
            "1 for the REACTOR_MODE this replica runs in (listen or poll), 0 for the other.",
            ["mode"],
            registry=r,
        )
        self.hook_outcomes = Counter(
            "reactor_hook_outcomes",
            "Hook attempts by hook and outcome (done, retry, failed, released), and rows "
            "found superseded by a later job of their run (superseded).",
            ["hook", "outcome"],
            registry=r,
        )
        self.hook_backlog = Gauge(
            "reactor_hook_backlog", "Hook rows pending or running, across replicas.", registry=r
        )
        self.hook_failed = Gauge(
            "reactor_hook_failed",
            "Hook rows parked as failed after their last attempt.",
            registry=r,
        )
        self.reconcile_found = Counter(
            "reactor_reconcile_found",
            "Jobs the reconcile found needing a run but missing from the pending queue: each "
            "went around the triggers.",
            registry=r,
        )
        self.reconcile_last_pass = Gauge(
            "reactor_reconcile_last_pass_timestamp_seconds",
            "Unix time the last full reconcile pass ended, by any replica (0 before the first).",
            registry=r,
        )
        self.reconcile_interval = Gauge(
            "reactor_reconcile_interval_seconds",
            "REACTOR_RECONCILE_INTERVAL_SECONDS: a full pass ends at least this often (0: off).",
            registry=r,
        )
        self.replicas_live = Gauge(
            "reactor_replicas_live",
            "Replicas whose heartbeat this one saw in its last health check, itself included.",
            registry=r,
        )
        self.job_trigger = Gauge(
            "reactor_job_trigger",
            "1 for the job trigger's state as the last health check read it from the catalog: "
            "notifies (this replica's channel), quiet (installed not to notify), elsewhere "
            "(another channel), missing (missing or disabled); 0 for the others.",
            ["state"],
            registry=r,
        )
        self.doorbell_awake = Gauge(
            "reactor_doorbell_awake",
            "1 while the channel's doorbell is awake as this replica last read it: the app's "
            "finishing commits skip their NOTIFY and the replicas poll the queue instead.",
            registry=r,
        )
        self.left_to_owner = Counter(
            "reactor_deadlines_left_to_owner",
            "Deadlines that fired here for a job another live replica owns; it claims them.",
            registry=r,
        )
        self.http_dropped = _http_dropped(r)
        # The children the hot path counts into, bound once: a labels() lookup per
        # notification or per recorded run costs a lock and a dict probe for nothing.
        self.notified = {
            result: self.notifications.labels(result)
            for result in (
                "accepted",
                "rejected",
                "unverified",
                "dropped",
                "probe",
                "left",
                "joined",
            )
        }
        self.recorded_by = {source: self.recorded.labels(source) for source in ("timer", "scan")}
        for mode in ("listen", "poll"):
            self.mode.labels(mode)
        for state in TRIGGER_STATES:
            self.job_trigger.labels(state)


class PairMetrics:
    """The metrics of a replica that serves several pairs: each pair's reactor keeps its own
    :class:`Metrics`, and one exposition shows them all, every sample labelled with its pair.
    What belongs to the process, not to a pair (its HTTP servers), is counted once, here."""

    def __init__(self, pairs: Mapping[str, Metrics]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Labelled({name: m.registry for name, m in pairs.items()}))
        self.http_dropped = _http_dropped(self.registry)


class _Labelled(Collector):
    # A collector over the pairs' registries: one family per metric name, its samples from
    # every pair with a pair label added.
    def __init__(self, registries: Mapping[str, CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for pair, registry in self.registries.items():
            for family in registry.collect():
                if family.name == _HTTP_DROPPED:
                    continue
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(
                    sample._replace(labels={**sample.labels, "pair": pair})
                    for sample in family.samples
                )
        yield from families.values()


_HTTP_DROPPED = "reactor_http_connections_dropped"


def _http_dropped(registry: CollectorRegistry) -> Counter:
    counter = Counter(
        _HTTP_DROPPED,
        "HTTP connections the servers closed: limit, the places open to its peer were taken; "
        "peer_limit, its peer address held as many as one may; head_timeout, no complete "
        "request head in time; body_timeout, no complete body in time; write_stall, what was "
        "written to it waited unread too long; pipelined, too many requests ahead of their "
        "answers; made_room, its place went to a peer that held none.",
        ["server", "reason"],
        registry=registry,
    )
    for server in HTTP_SERVERS:
        for reason in HTTP_DROP_REASONS:
            counter.labels(server, reason)
    return counter
