"""`sopctl init`: a commented starter SOP per template that validates strictly, runs on `fake`
to its end, points editors at the schema, and never overwrites a file by surprise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import api
from engine.cli.commands import main as sopctl
from engine.cli.scaffold import TEMPLATES
from engine.run.people import PersonAnswer
from engine.testing import ScriptedPerson


@pytest.fixture(autouse=True)
def _here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("template", TEMPLATES)
def test_each_template_validates_strictly_and_runs_on_fake(template: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert sopctl(["init", f"starter_{template}", "--template", template]) == 0
    out = capsys.readouterr().out
    path = tmp_path / f"starter_{template}.sop.yaml"
    assert f"wrote starter_{template}.sop.yaml (template {template})" in out and "--model fake" in out
    assert sopctl(["validate", "--strict", str(path)]) == 0
    person = ScriptedPerson(lambda question: PersonAnswer("approve"))
    result = api.run(api.load(path), {"idea": "a tiny thing"},
                     api.RunOptions(model="fake", workspace=tmp_path / "ws", person=person))
    assert result.status == "idle", result.error
    assert result.artifacts                         # every starter writes something


def test_the_modeline_points_at_the_schema(tmp_path: Path) -> None:
    assert sopctl(["init", "s"]) == 0
    first = (tmp_path / "s.sop.yaml").read_text().splitlines()[0]
    found = re.fullmatch(r"# yaml-language-server: \$schema=(.+)", first)
    assert found and (tmp_path / found.group(1)).resolve().is_file()


def test_the_sop_name_comes_from_the_file_name(tmp_path: Path) -> None:
    assert sopctl(["init", "My Team 2"]) == 0
    assert "\nname: my_team_2\n" in (tmp_path / "My Team 2.sop.yaml").read_text()


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.sop.yaml").write_text("keep me\n")
    assert sopctl(["init", "mine"]) == 2
    err = capsys.readouterr().err
    assert "mine.sop.yaml exists; not overwritten" in err and "--force" in err
    assert (tmp_path / "mine.sop.yaml").read_text() == "keep me\n"
    assert sopctl(["init", "mine.sop.yaml", "--force"]) == 0
    assert (tmp_path / "mine.sop.yaml").read_text().startswith("# yaml-language-server")


def test_an_unknown_template_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        sopctl(["init", "x", "--template", "chian"])
    assert exited.value.code == 2 and "invalid choice: 'chian'" in capsys.readouterr().err
