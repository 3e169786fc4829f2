"""`include:`: SOP library files merged in, confined, located, cycle-free, and covered by the
hash a resume checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_helpers import sopctl_in_process

from engine.compile.compiler import check_path, check_text, compile_path
from engine.errors import LoadError

LIBRARY = """\
apiVersion: sop/v1
description: a shared speaker
actions:
  Speak:
    prompt: "Speak about {{ inputs.idea }}."
    output: text
    artifacts:
      - {path: speech.md, content: "{{ out }}"}
roles:
  Speaker:
    actions: [Speak]
    watch: [UserRequirement]
"""

MAIN = """\
apiVersion: sop/v1
name: uses_a_library
include: [{include}]
inputs:
  idea: {{type: str, required: true}}
actions:
  Listen:
    prompt: "Answer: {{{{ msgs.Speak[-1].content }}}}"
    output: text
    artifacts:
      - {{path: answer.md, content: "{{{{ out }}}}"}}
roles:
  Listener:
    actions: [Listen]
    watch: [Speak]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def project(tmp_path: Path, include: str = "lib/speaker.sop.yaml", library: str = LIBRARY) -> Path:
    write(tmp_path, "lib/speaker.sop.yaml", library)
    return write(tmp_path, "main.sop.yaml", MAIN.format(include=include))


sopctl = sopctl_in_process


def errors(path: Path, *include_dirs: Path) -> list:
    return [d for d in check_path(path, include_dirs).diagnostics if d.is_error]


def test_a_librarys_actions_and_roles_join_the_sop_and_run(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    main_file = project(tmp_path)
    compiled = compile_path(main_file)
    assert list(compiled.spec.roles) == ["Listener", "Speaker"]
    assert compiled.warnings == ()
    code, out, _ = sopctl(capsys, "run", str(main_file), "--model", "fake", "--idea", "tea",
                          "--out", str(tmp_path / "run"), "--format", "json")
    assert code == 0
    assert sorted(json.loads(out)["artifacts"]) == ["answer.md", "speech.md"]


def test_a_problem_in_a_library_is_located_in_the_library(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    main_file = project(tmp_path, library=LIBRARY.replace("inputs.idea", "inputs.topic"))
    code, out, _ = sopctl(capsys, "validate", str(main_file))
    library = tmp_path / "lib" / "speaker.sop.yaml"
    assert code == 1
    assert f"{library}:5:36: error[SOP404]: undeclared input 'topic'" in out
    assert 'prompt: "Speak about {{ inputs.topic }}."' in out  # the library's own line


def test_an_action_a_library_offers_but_nobody_runs_is_no_warning(tmp_path: Path) -> None:
    extra = LIBRARY.replace("roles:", "  Whisper:\n    prompt: psst\nroles:")
    assert compile_path(project(tmp_path, library=extra)).warnings == ()


@pytest.mark.parametrize("include, why", [
    ("../outside.sop.yaml", "leaves the including file's folder"),
    ("/etc/passwd", "must be a relative path"),
    ("https://example.com/lib.sop.yaml", "is a URL"),
    ("lib\\\\speaker.sop.yaml", "must be a relative path"),
])
def test_an_include_outside_the_folder_is_refused_at_its_place(tmp_path: Path, include: str,
                                                               why: str) -> None:
    write(tmp_path, "outside.sop.yaml", LIBRARY)
    main_file = project(tmp_path / "sop", include=f'"{include}"')
    [error] = errors(main_file)
    assert (error.code, error.file, error.line) == ("SOP012", str(main_file), 3)
    assert why in error.message


def test_a_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "elsewhere/lib.sop.yaml", LIBRARY)
    main_file = project(tmp_path / "sop", include="link.sop.yaml")
    os.symlink(tmp_path / "elsewhere" / "lib.sop.yaml", tmp_path / "sop" / "link.sop.yaml")
    [error] = errors(main_file)
    assert error.code == "SOP012" and "symlink" in error.message
    assert errors(main_file, tmp_path / "elsewhere") == []  # unless the user names its folder


def test_a_hard_link_to_a_file_elsewhere_is_refused(tmp_path: Path) -> None:
    """As a symlink out: a second name of a file outside the folder (planted in a shared
    folder) would have the include read it and its diagnostics quote it."""
    write(tmp_path, "elsewhere/lib.sop.yaml", LIBRARY)
    main_file = project(tmp_path / "sop", include="link.sop.yaml")
    os.link(tmp_path / "elsewhere" / "lib.sop.yaml", tmp_path / "sop" / "link.sop.yaml")
    [error] = errors(main_file)
    assert error.code == "SOP012" and "another hard link" in error.message


def test_include_path_names_a_folder_of_libraries(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "shared/speaker.sop.yaml", LIBRARY)
    main_file = write(tmp_path, "sop/main.sop.yaml", MAIN.format(include="speaker.sop.yaml"))
    [missing] = errors(main_file)
    assert missing.code == "SOP001" and missing.line == 3 and "not found" in missing.message
    code, out, _ = sopctl(capsys, "validate", str(main_file), "--include-path", str(tmp_path / "shared"))
    assert code == 0, out


def test_an_include_cycle_is_refused_with_the_chain(tmp_path: Path) -> None:
    write(tmp_path, "a.sop.yaml", "apiVersion: sop/v1\ninclude: [b.sop.yaml]\n")
    write(tmp_path, "b.sop.yaml", "apiVersion: sop/v1\ninclude: [a.sop.yaml]\n")
    main_file = project(tmp_path, include="a.sop.yaml")
    [error] = errors(main_file)
    assert error.code == "SOP013"
    assert error.message == "include cycle: a.sop.yaml -> b.sop.yaml -> a.sop.yaml"
    assert (error.file, error.line) == (str(tmp_path / "b.sop.yaml"), 2)


def test_a_library_reached_twice_is_merged_once(tmp_path: Path) -> None:
    write(tmp_path, "lib/speaker.sop.yaml", LIBRARY)
    write(tmp_path, "a.sop.yaml", "apiVersion: sop/v1\ninclude: [lib/speaker.sop.yaml]\n")
    main_file = write(tmp_path, "main.sop.yaml",
                      MAIN.format(include="a.sop.yaml, lib/speaker.sop.yaml"))
    assert "Speaker" in compile_path(main_file).spec.roles


def test_a_name_defined_in_two_files_is_an_error_at_the_second(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    main_file = project(tmp_path, library=LIBRARY.replace("Speak:", "Listen:\n    prompt: x\n  Speak:", 1))
    code, out, _ = sopctl(capsys, "validate", str(main_file))
    assert code == 1
    assert f"{tmp_path / 'lib' / 'speaker.sop.yaml'}:4:3: error[SOP014]: action 'Listen' is defined in two files" in out
    assert f"note: first defined here ({main_file}:7:3)" in out


@pytest.mark.parametrize("body, code", [
    ("apiVersion: sop/v1\nactions: !!python/object:os.system {}\n", "SOP006"),
    ("apiVersion: sop/v1\nteam: {max_rounds: 99}\n", "SOP101"),
    ("name: lib\nactions: {}\n", "SOP102"),
    ("apiVersion: sop/v1\na: &a [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}" + f", *{'a' if i == 0 else f'b{i - 1}'}" * 9 + "]\n"
               for i in range(12)), "SOP008"),
])
def test_a_library_is_loaded_as_safely_as_the_main_file(tmp_path: Path, body: str, code: str) -> None:
    main_file = project(tmp_path, library=body)
    found = errors(main_file)
    assert found and found[0].code == code
    assert found[0].file == str(tmp_path / "lib" / "speaker.sop.yaml")


def test_resume_refuses_a_changed_library(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main_file = project(tmp_path)
    run_dir = tmp_path / "run"
    code, _, _ = sopctl(capsys, "run", str(main_file), "--model", "fake", "--idea", "tea",
                        "--out", str(run_dir), "--rounds", "1")
    unchanged = compile_path(main_file).source_hash
    library = tmp_path / "lib" / "speaker.sop.yaml"
    library.write_text(LIBRARY.replace("Speak about", "Talk about"), encoding="utf-8")
    assert compile_path(main_file).source_hash != unchanged
    code, _, err = sopctl(capsys, "resume", str(run_dir))
    assert code == 2 and "(or a file it includes) changed since the run started" in err
    library.write_text(LIBRARY, encoding="utf-8")
    code, _, err = sopctl(capsys, "resume", str(run_dir))
    assert code == 0, err


def test_resume_uses_the_runs_include_path_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "shared/speaker.sop.yaml", LIBRARY)
    main_file = write(tmp_path, "sop/main.sop.yaml", MAIN.format(include="speaker.sop.yaml"))
    run_dir = tmp_path / "run"
    code, _, err = sopctl(capsys, "run", str(main_file), "--model", "fake", "--idea", "tea",
                          "--out", str(run_dir), "--rounds", "1", "--include-path", str(tmp_path / "shared"))
    assert code == 0, err
    code, _, err = sopctl(capsys, "resume", str(run_dir))
    assert code == 0, err


def test_a_file_without_include_keeps_its_plain_hash(tmp_path: Path) -> None:
    import hashlib

    path = write(tmp_path, "plain.sop.yaml", LIBRARY.replace("description:", "name: plain\ninputs: {idea: {type: str}}\ndescription:"))
    assert compile_path(path).source_hash == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_that_fails_in_a_library_names_the_librarys_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    library = LIBRARY.replace("{path: speech.md,", "{path: \"{{ inputs.idea }}/speech.md\",")
    main_file = project(tmp_path, library=library)
    code, _, err = sopctl(capsys, "run", str(main_file), "--model", "fake", "--idea", "../../up",
                          "--out", str(tmp_path / "run"))
    assert code == 1
    assert f"{tmp_path / 'lib' / 'speaker.sop.yaml'}:8:16: error[SOP502]" in err


def test_graph_and_json_reports_name_the_library(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "shared/speaker.sop.yaml", LIBRARY)
    main_file = write(tmp_path, "sop/main.sop.yaml", MAIN.format(include="speaker.sop.yaml"))
    code, out, _ = sopctl(capsys, "graph", str(main_file), "--include-path", str(tmp_path / "shared"))
    assert code == 0 and "Speaker" in out
    write(tmp_path, "shared/speaker.sop.yaml", LIBRARY.replace("Speak:", "Listen:\n    prompt: x\n  Speak:", 1))
    code, out, _ = sopctl(capsys, "validate", str(main_file), "--include-path", str(tmp_path / "shared"),
                          "--format", "json")
    [found] = json.loads(out)["diagnostics"]
    assert (found["code"], found["file"]) == ("SOP014", str((tmp_path / "shared/speaker.sop.yaml").resolve()))
    assert found["related"][0]["file"] == str(main_file)


def test_compiled_once_per_process_until_a_file_changes(tmp_path: Path) -> None:
    """A second compile of unchanged files is the same CompiledSop; a changed library (or
    main file) is compiled again, and its hash follows."""
    main_file = project(tmp_path)
    first = compile_path(main_file)
    assert compile_path(main_file) is first
    write(tmp_path, "lib/speaker.sop.yaml", LIBRARY.replace("a shared speaker", "a speaker"))
    second = compile_path(main_file)
    assert second is not first and second.source_hash != first.source_hash
    main_file.write_text(MAIN.format(include="lib/speaker.sop.yaml") + "# changed\n", encoding="utf-8")
    third = compile_path(main_file)
    assert third is not second and third.source_hash != second.source_hash
    main_file.write_text(MAIN.format(include="lib/nowhere.sop.yaml"), encoding="utf-8")
    with pytest.raises(LoadError, match="nowhere"):
        compile_path(main_file)


def test_an_overlay_text_is_read_in_place_of_the_library_file(tmp_path: Path) -> None:
    """An editor's unsaved library (`sopctl lsp`): its text stands in for the file, and its
    problems are located in that text."""
    main = project(tmp_path)
    library = (tmp_path / "lib/speaker.sop.yaml").resolve()
    edited = "# unsaved\n" + LIBRARY.replace("  Speak:", "  Talk:").replace("actions: [Speak]", "actions: [Talk]")
    result = check_text(main.read_text(encoding="utf-8"), str(main), overlay={library: edited})
    assert [(d.code, "'Speak'" in d.message) for d in result.diagnostics] == [("SOP202", True)]
    typo = "# unsaved\n" + LIBRARY.replace("output: text", "outptu: text")
    (found,) = check_text(main.read_text(encoding="utf-8"), str(main), overlay={library: typo}).diagnostics
    assert found.code == "SOP101" and os.path.realpath(found.file) == str(library) and found.line == 7
    assert check_text(main.read_text(encoding="utf-8"), str(main)).ok      # the file itself is unchanged
