"""``[runs] app_saves``: the key as the file gives it, what `reactor migrate` renders for it, and
what `reactor init`'s draft says of it. Pure: no database."""

from __future__ import annotations

import hashlib
import tomllib

import pytest

from reactor.db import drift, indexes
from reactor.db.indexes import Index
from reactor.db.saves import Reference
from reactor.draft.facts import ColumnFacts, TableFacts
from reactor.draft.saves import note, with_note
from reactor.errors import ConfigError
from reactor.install import Install, sql
from reactor.install.mapping import REFERENCE
from reactor.install.mapping_file import parse


def test_the_default_is_the_upsert_that_marks_itself() -> None:
    assert parse({}).runs.app_saves == "upsert"
    assert parse({"runs": {"app_saves": "plain"}}).runs.app_saves == "plain"


@pytest.mark.parametrize("value", ["PLAIN", "insert", True, 1, ""])
def test_another_value_is_refused_naming_both(value: object) -> None:
    with pytest.raises(ConfigError, match=r'runs.app_saves must be "upsert" .* or "plain"'):
        parse({"runs": {"app_saves": value}})


def test_the_reference_tables_saved_plainly_are_still_the_reference() -> None:
    # How the app saves names nothing: the channel and the reference's checks stay.
    mapping = parse({"runs": {"app_saves": "plain"}})
    assert mapping.is_reference
    assert mapping.default_channel == "analysis_jobs_terminal"


def _plain() -> Install:
    return Install.of(parse({"runs": {"app_saves": "plain"}}).in_public())


def test_migrate_renders_the_triggers_only_for_plain() -> None:
    plain = _plain().render(sql.repeatable(_plain().mapping).text, channel="c")
    trigger = 'TRIGGER reactor_app_save\n    BEFORE INSERT ON "public"."analysis_runs"'
    assert trigger in plain
    assert """WHEN (NEW."saved_by" IS DISTINCT FROM 'worker')""" in plain
    assert "SECURITY DEFINER SET search_path = pg_catalog, pg_temp" in plain
    assert "REVOKE ALL ON FUNCTION reactor.app_save_v1() FROM PUBLIC;" in plain
    upsert = Install.of(REFERENCE).render(sql.repeatable(REFERENCE).text, channel="c")
    assert "TRIGGER reactor_app_save" not in upsert
    assert upsert.rstrip().endswith("DROP FUNCTION IF EXISTS reactor.worker_save_v1() CASCADE;")


def test_the_digest_changes_with_plain_and_stays_for_the_default() -> None:
    install = Install.of(REFERENCE)
    # The default's digest is what it was before the key: the triggers file alone.
    triggers = install.render(sql.read("notify_triggers.sql"), channel="", spread=False)
    statements = "\n".join(
        line for line in triggers.splitlines() if not line.lstrip().startswith("--")
    )
    steps = [
        step.create() if isinstance(step, Index) else step.drop()
        for step in indexes.repeatable(install)
    ]
    before = hashlib.sha256("\n".join([statements, *steps]).encode()).hexdigest()
    assert drift.mapping_digest(install) == before
    assert drift.mapping_digest(_plain()) != before


RUNS = TableFacts(
    "public", "app_exportreport", (ColumnFacts("export_id", "bigint", not_null=True),)
)
DRAFT = """[jobs]
id = "id"

[runs]
table = "app_exportreport"

[runs.columns]
result = "j.result"
"""


def test_the_draft_offers_plain_commented_in_the_runs_section() -> None:
    text = with_note(DRAFT, note(RUNS, []))
    assert '# app_saves = "plain"\n\n[runs.columns]' in text
    assert "app_saves" not in tomllib.loads(text)["runs"]
    # Uncommented, it is the key of [runs].
    chosen = tomllib.loads(text.replace('# app_saves = "plain"', 'app_saves = "plain"'))
    assert chosen["runs"]["app_saves"] == "plain"


def test_the_draft_says_why_plain_cannot_be_where_a_key_references_the_artifact() -> None:
    referenced = [Reference(("public", "report_notes"), "report_notes_export_id_fkey", "c")]
    lines = note(RUNS, referenced)
    text = " ".join(line.removeprefix("# ") for line in lines)
    assert all(line.startswith("# ") for line in lines)
    assert 'app_saves stays "upsert"' in text
    assert "report_notes_export_id_fkey of public.report_notes" in text
    assert "ON DELETE CASCADE" in text
    assert 'app_saves = "plain"' not in "\n".join(lines)
