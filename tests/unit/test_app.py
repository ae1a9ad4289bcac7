"""reactor.testing.app: the app's statements keep their placeholders, whatever the mapping's names
hold."""

from __future__ import annotations

import re

import pytest

from reactor.install import mapping, mapping_file
from reactor.testing.app import App

# Names with a % in them, as the mapping accepts: each must reach the server as written.
PERCENT = mapping_file.parse(
    {
        "jobs": {
            "table": "jobs 100%",
            "status": "state%",
            "not_null": ["doc%", "verdicts%(x)s"],
            "not_empty": ["verdicts%(x)s"],
        },
        "runs": {"table": "runs 100%"},
    }
).in_public()
APP = App(PERCENT.typed({"doc%": "text", "verdicts%(x)s": "jsonb", "state%": "text"}))

STATEMENTS = {
    "create": APP.create(["r"], jobs=["j"]),
    "progress": APP.progress("j"),
    "finish": APP.finish("j"),
    "reopen": APP.reopen("j"),
    "touch": APP.touch("j"),
    "redocument": APP.redocument("j", document="<p/>"),
    "delete": APP.delete("j"),
    "tab_save": APP.tab_save("j"),
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_each_statement_binds_exactly_its_parameters(name: str) -> None:
    query, params = STATEMENTS[name]
    # Read as psycopg reads it, left to right: %% is one %, %(name)s a placeholder, and any
    # other % an error. A % the mapping filled in that was not doubled would show up here as an
    # error or as a placeholder of the app's own (the column "verdicts%(x)s").
    tokens = [m.group(0) for m in re.finditer(r"%%|%\((\w+)\)s|%", query)]
    placeholders = {token[2:-2] for token in tokens if token.startswith("%(")}
    assert "%" not in tokens
    assert placeholders == set(params)
    assert '"jobs 100%%"' in query


def test_a_job_is_created_running_finished_or_failed() -> None:
    app = App(mapping.REFERENCE)
    created = {
        (finished, failed): app.create(["r"], finished=finished, failed=failed).params["status"]
        for finished in (False, True)
        for failed in (False, True)
    }
    assert created == {
        (False, False): "running",
        (True, False): "complete",
        (False, True): "failed",
        (True, True): "failed",
    }
