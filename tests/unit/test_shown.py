"""Catalog text made safe to show (reactor.shown): escaped control characters, shell words."""

from __future__ import annotations

import subprocess
from pathlib import Path

from reactor.shown import has_hidden, printable, shell_word


def test_control_characters_are_escaped_and_the_rest_is_kept() -> None:
    assert printable("done") == "done"
    assert printable("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert printable("\x1b[2Jred\x07") == "\\x1b[2Jred\\x07"
    assert printable("\x7f\x00") == "\\x7f\\x00"
    # What reorders or breaks a line on the screen, though not ASCII.
    assert printable("a\u202eb\u2028c\x85") == "a\\u202eb\\u2028c\\x85"
    # Backslashes stay as written: a CHECK's regular expression reads as it is.
    assert printable("^\\d+$ é ü 名前") == "^\\d+$ é ü 名前"
    assert has_hidden("x\ny")
    assert not has_hidden("x y")


def test_a_shell_word_is_one_argument_whatever_it_holds(tmp_path: Path) -> None:
    for word in ("plain", "x'$(touch marker)'y", 'a"b', "`id`", "a b", "*", "-", "$HOME"):
        echoed = subprocess.run(
            ["bash", "-c", f"printf '%s' {shell_word(word)}"],
            capture_output=True,
            text=True,
            check=True,
            cwd=str(tmp_path),
        )
        assert echoed.stdout == word
