"""`sopctl lsp` on the command line (the server itself: tests/lsp/)."""

from __future__ import annotations

import sys

from engine.cli import main


def test_lsp_without_its_extra_says_how_to_install_it(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "pygls", None)          # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "engine.lsp.server", raising=False)
    assert main(["lsp"]) == 2
    err = capsys.readouterr().err
    assert "needs the lsp extra" in err and "pip install -e '.[lsp]'" in err


def test_lsp_help_names_its_flags(capsys) -> None:
    try:
        main(["lsp", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    assert "--debounce-ms" in out and "--include-path" in out and "stdin/stdout" in out
