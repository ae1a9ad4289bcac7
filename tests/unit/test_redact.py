"""reactor.telemetry.redact: which values are secret, and that nothing shown carries one."""

from __future__ import annotations

import urllib.parse

import psycopg.pq
import pytest

from reactor.telemetry import redact

SECRET = "Qx7vW2kZ9mJ4"


def test_every_option_libpq_marks_secret_is_a_secret() -> None:
    marked = {
        option.keyword.decode()
        for option in psycopg.pq.Conninfo.get_defaults()
        if option.dispchar == b"*"
    }
    assert {"password", "sslpassword"} <= marked
    assert marked <= redact.DSN_SECRET_PARAMS
    # Password equivalents libpq marks as debug options, not as secrets.
    assert {"scram_client_key", "scram_server_key"} <= redact.DSN_SECRET_PARAMS


# -- safe_url ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"user:{SECRET}@host/x",  # the scheme forgotten: all of it is "path" to urlsplit
        f"https:user:{SECRET}@host/x",  # the "//" forgotten
        f"https:{SECRET}",
        f"http://:{SECRET}@/x",
    ],
)
def test_a_url_without_a_host_shows_nothing_of_itself(url: str) -> None:
    assert redact.safe_url(url) == "<URL without a host>"


# -- url_secrets ---------------------------------------------------------------------------------


def test_url_secrets_as_written_and_decoded() -> None:
    found = redact.url_secrets("https://u:p%40ss-w0rd@h/x?key=a%2Bb%2Bc&sig=x+y+z&page=1")
    assert {"p%40ss-w0rd", "p@ss-w0rd", "a%2Bb%2Bc", "a+b+c", "x+y+z", "x y z"} <= found
    assert "1" not in found  # too short to mask without garbling messages


def test_url_secrets_take_a_bare_token_and_a_token_sent_as_the_user() -> None:
    assert SECRET in redact.url_secrets(f"https://h/hook?{SECRET}")
    assert SECRET in redact.url_secrets(f"https://{SECRET}@h/hook")
    assert "app-user" not in redact.url_secrets(f"https://app-user:{SECRET}@h/hook")


@pytest.mark.parametrize(
    "url",
    [f"https://u:{SECRET}@[h/x", f"https://u:{SECRET}@h:port/x", f"https://u:{SECRET}@[::1/x"],
)
def test_url_secrets_of_a_url_urlsplit_refuses(url: str) -> None:
    assert SECRET in redact.url_secrets(url)


# -- dsn_secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=db sslpassword={SECRET}",
        f"host=db password='{SECRET}'",
        f"postgresql://app@db/app?sslpassword={SECRET}&sslmode=require",
        f"postgresql://app:{SECRET}@db/app",
        f"host=db oauth_client_secret={SECRET}",
        # Does not parse (the quote never ends): still masked wherever it is quoted.
        f"host=db password={SECRET} port='oops",
    ],
)
def test_dsn_secrets_take_every_secret_parameter(dsn: str) -> None:
    assert SECRET in redact.dsn_secrets(dsn)


def test_dsn_secrets_as_written_and_decoded() -> None:
    encoded = urllib.parse.quote("p@ss/w0rd", safe="")
    found = redact.dsn_secrets(f"postgresql://app:{encoded}@db/app?password={encoded}")
    assert {encoded, "p@ss/w0rd"} <= found
    assert redact.dsn_secrets("host=db user=app dbname=app sslmode=require") == set()


def test_known_secrets_take_every_webhook_secret() -> None:
    found = redact.known_secrets(
        webhook_secret="shared-secret",
        webhook_secrets=["judge-secret", None, "ops-secret"],
        dsns=[f"host=db sslpassword={SECRET}"],
        urls=[],
    )
    assert found == {"shared-secret", "judge-secret", "ops-secret", SECRET}


# -- scrub ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f"connection to host=db password={SECRET} failed",
        f"connection to host=db sslpassword = {SECRET} failed",
        f"connection to host=db password='{SECRET} with spaces' failed",
        f"connection to host=db password='{SECRET} unterminated",
        f"connection to host=db password=a\\ {SECRET} failed",  # libpq's escaped space
        f"connection to postgresql://app:{SECRET}@db/app failed",
        f"POST https://h/x?token={SECRET} failed",
    ],
)
def test_scrub_masks_secrets_it_was_not_told_about(text: str) -> None:
    shown = redact.scrub(text)
    assert SECRET not in shown
    assert shown.startswith(text.split(" ", 1)[0])  # the rest of the message stays


def test_scrub_leaves_ordinary_words_alone() -> None:
    text = "password authentication failed for user app; passwords=none"
    assert redact.scrub(text) == text
