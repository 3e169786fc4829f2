"""The on-disk cache (docs/performance.md): compiled SOP files, compiled templates and
expressions, output schemas known valid. A hit gives what compiling gives; any change of
what an entry depends on is a miss; a corrupt, foreign or unsafe entry is ignored and
rewritten; SOPCTL_NO_CACHE turns it off; the sandbox's bounds hold for cached code."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from jsonschema.exceptions import SchemaError

from engine import diskcache
from engine.compile import cache as compile_cache
from engine.compile import compiler
from engine.templates import code
from engine.templates.render import compile_expression, render_template
from engine.templates.sandbox import TemplateFailure
from engine.models import answers

from run_helpers import ROOT


SOP = """\
apiVersion: sop/v1
name: cached
inputs:
  idea: {type: str, required: true}
{include}actions:
  Write:
    prompt: "Write about {{ inputs.idea }}"
    output: text
roles:
  Writer:
    profile: writer
    actions: [Write]
    watch: [UserRequirement]
"""

LIBRARY = """\
apiVersion: sop/v1
name: lib
actions:
  {name}:
    prompt: "Shared {{ inputs.idea }}"
    output: text
"""


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("SOPCTL_CACHE_DIR", str(folder))
    monkeypatch.delenv("SOPCTL_NO_CACHE", raising=False)
    compiler._CHECKED.clear()
    return folder


def _sop(folder: Path, include: str = "") -> Path:
    path = folder / "cached.sop.yaml"
    path.write_text(SOP.replace("{include}", include))
    return path


def _entries(cache: Path, kind: str) -> list[Path]:
    return sorted((cache / kind).glob("*")) if (cache / kind).is_dir() else []


def _fresh_check(path: Path) -> compiler.CheckResult:
    """`check_path` as a new process sees it: nothing remembered in memory."""
    compiler._CHECKED.clear()
    return compiler.check_path(path)


def _same(a: compiler.CompiledSop, b: compiler.CompiledSop) -> bool:
    """Equal SOPs (a graph compares by identity: its nodes and edges with their data here)."""
    graphs = [(sorted(g.nodes(data=True)), sorted(g.edges(data=True))) for g in (a.graph, b.graph)]
    return replace(a, graph=None) == replace(b, graph=None) and graphs[0] == graphs[1]


def test_a_compiled_file_is_read_back_from_disk_as_it_compiled(cache: Path, tmp_path: Path) -> None:
    path = _sop(tmp_path)
    first = _fresh_check(path)
    assert first.ok and len(_entries(cache, "sop")) == 1
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    stored = compile_cache.lookup(path, ())
    assert stored is not None
    assert _same(stored.compiled, first.compiled) and stored.diagnostics == first.diagnostics
    assert dict(stored.compiled.output_schemas) == dict(first.compiled.output_schemas)
    assert stored.compiled.source.text == first.compiled.source.text
    assert _same(_fresh_check(path).compiled, first.compiled)


def test_a_changed_file_is_compiled_again(cache: Path, tmp_path: Path) -> None:
    path = _sop(tmp_path)
    _fresh_check(path)
    path.write_text(path.read_text().replace("Write about", "Write a poem about"))
    again = _fresh_check(path)
    assert "a poem" in again.compiled.spec.actions["Write"].prompt
    assert len(_entries(cache, "sop")) == 2


def test_a_changed_included_file_is_compiled_again(cache: Path, tmp_path: Path) -> None:
    (tmp_path / "lib.sop.yaml").write_text(LIBRARY.replace("{name}", "Shared"))
    path = _sop(tmp_path, include="include: [lib.sop.yaml]\n")
    assert "Shared" in _fresh_check(path).compiled.spec.actions
    (tmp_path / "lib.sop.yaml").write_text(LIBRARY.replace("{name}", "Renamed"))
    assert compile_cache.lookup(path, ()) is None          # same main file, stale library
    again = _fresh_check(path)
    assert "Renamed" in again.compiled.spec.actions and "Shared" not in again.compiled.spec.actions
    assert compile_cache.lookup(path, ()) is not None      # rewritten for the new library


def test_an_include_shadowed_by_a_new_file_is_compiled_again(cache: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "lib.sop.yaml").write_text(LIBRARY.replace("{name}", "FromPath"))
    main = tmp_path / "main"
    main.mkdir()
    path = _sop(main, include="include: [lib.sop.yaml]\n")
    compiler._CHECKED.clear()
    assert "FromPath" in compiler.check_path(path, (shared,)).compiled.spec.actions
    (main / "lib.sop.yaml").write_text(LIBRARY.replace("{name}", "Beside"))  # found first now
    assert compile_cache.lookup(path, (shared,)) is None
    compiler._CHECKED.clear()
    assert "Beside" in compiler.check_path(path, (shared,)).compiled.spec.actions


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "empty"])
def test_a_corrupt_or_foreign_sop_entry_is_ignored_and_rewritten(cache: Path, tmp_path: Path, damage: str) -> None:
    path = _sop(tmp_path)
    first = _fresh_check(path)
    [entry] = _entries(cache, "sop")
    blob = entry.read_bytes()
    entry.write_bytes({"truncated": blob[: len(blob) // 2],
                       "flipped": blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]),
                       "foreign": b"not a sopctl entry" + blob,
                       "empty": b""}[damage])
    assert compile_cache.lookup(path, ()) is None
    assert _same(_fresh_check(path).compiled, first.compiled)
    assert entry.read_bytes() == blob                        # rewritten whole


def test_a_sop_entry_others_can_write_is_not_trusted(cache: Path, tmp_path: Path) -> None:
    path = _sop(tmp_path)
    _fresh_check(path)
    [entry] = _entries(cache, "sop")
    entry.chmod(0o666)
    assert compile_cache.lookup(path, ()) is None


def test_a_file_with_errors_is_never_stored(cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.sop.yaml"
    path.write_text(SOP.replace("{include}", "").replace("[Write]", "[Missing]"))
    assert not _fresh_check(path).ok
    assert _entries(cache, "sop") == []


SHIPPED = sorted([*(ROOT / "sops").glob("*.sop.yaml"), *(ROOT / "examples").glob("*.sop.yaml")])


@pytest.mark.parametrize("sop", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_sop_reads_back_as_it_compiled(cache: Path, sop: Path) -> None:
    first = _fresh_check(sop)
    assert first.ok
    again = _fresh_check(sop)                                # from the disk this time
    assert _same(again.compiled, first.compiled)
    assert again.diagnostics == first.diagnostics and again.lines == first.lines
    assert dict(again.compiled.output_schemas) == dict(first.compiled.output_schemas)


def test_a_changed_file_is_compiled_again_in_the_same_process(tmp_path: Path) -> None:
    compiler._CHECKED.clear()
    path = _sop(tmp_path)
    compiler.check_path(path)
    path.write_text(path.read_text().replace("Write about", "Write a poem about"))
    assert "a poem" in compiler.check_path(path).compiled.spec.actions["Write"].prompt


def test_a_changed_included_file_is_compiled_again_in_the_same_process(tmp_path: Path) -> None:
    compiler._CHECKED.clear()
    (tmp_path / "lib.sop.yaml").write_text(LIBRARY.replace("{name}", "Shared"))
    path = _sop(tmp_path, include="include: [lib.sop.yaml]\n")
    assert "Shared" in compiler.check_path(path).compiled.spec.actions
    (tmp_path / "lib.sop.yaml").write_text(LIBRARY.replace("{name}", "Renamed"))
    again = compiler.check_path(path)
    assert "Renamed" in again.compiled.spec.actions and "Shared" not in again.compiled.spec.actions


def _template_entry(cache: Path, source: str = "T {{ x }}") -> Path:
    """The on-disk entry of one template's code, written by a render in a fresh process."""
    code.template.cache_clear()
    render_template(source, {"x": 1})
    [entry] = _entries(cache, "template")
    return entry


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "empty"])
def test_a_corrupt_or_foreign_entry_is_ignored_and_rewritten(cache: Path, damage: str) -> None:
    entry = _template_entry(cache)
    blob = entry.read_bytes()
    entry.write_bytes({"truncated": blob[: len(blob) // 2],
                       "flipped": blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]),
                       "foreign": b"not a sopctl entry" + blob,
                       "empty": b""}[damage])
    assert diskcache.read("template", entry.name) is None
    code.template.cache_clear()
    assert render_template("T {{ x }}", {"x": 2}) == "T 2"
    assert diskcache.read("template", entry.name) is not None   # rewritten whole (marshal's bytes may differ)


def test_an_entry_others_can_write_is_not_trusted(cache: Path) -> None:
    entry = _template_entry(cache)
    entry.chmod(0o666)
    assert diskcache.read("template", entry.name) is None


def test_a_cache_folder_others_can_write_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "shared-cache"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv("SOPCTL_CACHE_DIR", str(folder))
    assert diskcache.cache_dir() is None


def test_the_cache_can_be_turned_off(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOPCTL_NO_CACHE", "1")
    path = _sop(tmp_path)
    assert _fresh_check(path).ok
    code.template.cache_clear()
    assert render_template("off {{ x }}", {"x": 1}) == "off 1"
    assert not cache.exists()


def test_the_cache_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOPCTL_CACHE_DIR", raising=False)
    monkeypatch.delenv("SOPCTL_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert diskcache.cache_dir() == tmp_path / "xdg" / "sopctl"


def test_a_template_is_compiled_once_and_read_back(cache: Path) -> None:
    source = "Hello {{ name }}{% for i in range(2) %}!{% endfor %}"
    code.template.cache_clear()
    assert render_template(source, {"name": "a"}) == "Hello a!!"
    [entry] = _entries(cache, "template")
    code.template.cache_clear()
    assert render_template(source, {"name": "b"}) == "Hello b!!"
    assert _entries(cache, "template") == [entry]


BOUNDED_BY_GENERATED_CODE = {
    "nested displays": "{% set a = ['x' * 1000] * 900 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}"
                       "{{ [b, b, b, b, b, b, b, b, b, b] }}",
    "concat doubling": "{% set a = 'x' * 600000 %}{% set a = a ~ a %}{{ a|length }}",
    "repeat": "{{ 'x' * 10**9 }}",
}


@pytest.mark.parametrize("template", BOUNDED_BY_GENERATED_CODE.values(), ids=BOUNDED_BY_GENERATED_CODE.keys())
def test_a_template_bomb_loaded_from_the_cache_is_still_refused(cache: Path, template: str) -> None:
    code.template.cache_clear()
    with pytest.raises(TemplateFailure, match="refused by the sandbox"):
        render_template(template, {})
    assert len(_entries(cache, "template")) == 1
    code.template.cache_clear()                          # a new process: code from disk
    with pytest.raises(TemplateFailure, match="refused by the sandbox"):
        render_template(template, {})


def test_a_damaged_template_entry_is_compiled_again(cache: Path) -> None:
    code.template.cache_clear()
    render_template("T {{ x }}", {"x": 1})
    [entry] = _entries(cache, "template")
    entry.write_bytes(entry.read_bytes()[:-5])
    code.template.cache_clear()
    assert render_template("T {{ x }}", {"x": 2}) == "T 2"


@pytest.mark.parametrize("expression, value", [("items|length > 1", True), ("items[1:]", [2, 3]),
                                               ("(items|sum) * 2", 12)])
def test_an_expression_from_the_cache_evaluates_as_compiled(cache: Path, expression: str, value: object) -> None:
    compile_expression.cache_clear()
    code.expression.cache_clear()
    assert compile_expression(expression)(items=[1, 2, 3]) == value
    assert len(_entries(cache, "expression")) == 1
    compile_expression.cache_clear()
    code.expression.cache_clear()
    assert compile_expression(expression)(items=[1, 2, 3]) == value


def test_an_expression_that_does_not_parse_still_fails_and_is_not_stored(cache: Path) -> None:
    compile_expression.cache_clear()
    code.expression.cache_clear()
    with pytest.raises(Exception, match="chunk after expression|unexpected"):
        compile_expression("items items")
    assert _entries(cache, "expression") == []


def test_a_schema_checked_once_still_validates_every_answer(cache: Path) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "pattern": "^a"}},
              "required": ["n"], "additionalProperties": False}
    answers._validator.cache_clear()
    assert answers.schema_errors({"n": 1}, schema) == []
    assert len(_entries(cache, "schema")) == 1
    answers._validator.cache_clear()
    answers._SCHEMA_CACHE.clear()
    assert answers.schema_errors({"n": "x"}, schema)
    assert answers.schema_errors({"n": 1, "extra": 2}, schema)


def test_a_schema_the_meta_schema_refuses_is_never_marked_valid(cache: Path) -> None:
    answers._validator.cache_clear()
    with pytest.raises(SchemaError):
        answers._validator('{"type": "no-such-type"}')
    assert _entries(cache, "schema") == []


def test_entries_are_written_whole_and_private(cache: Path) -> None:
    entry = _template_entry(cache)
    assert entry.stat().st_mode & 0o077 == 0
    assert not [p for p in (cache / "template").iterdir() if p.name.startswith(".tmp-")]
    assert os.stat(cache / "template").st_mode & 0o077 == 0
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)


def test_a_link_or_a_fifo_in_place_of_an_entry_is_a_miss(cache: Path, tmp_path: Path) -> None:
    entry = _template_entry(cache)
    elsewhere = tmp_path / "planted"
    elsewhere.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(elsewhere)
    assert diskcache.read("template", entry.name) is None
    entry.unlink()
    os.mkfifo(entry)
    assert diskcache.read("template", entry.name) is None   # not waited on
    entry.unlink()
    code.template.cache_clear()
    assert render_template("T {{ x }}", {"x": 3}) == "T 3"


def test_a_full_folder_drops_its_oldest_entries(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of generated SOPs cannot fill the disk: past the bound the oldest go first."""
    monkeypatch.setattr(diskcache, "MAX_ENTRIES", 5)
    monkeypatch.setattr(diskcache, "KEEP_ENTRIES", 3)
    for number in range(5):
        diskcache.write("template", f"key{number}", b"payload")
        os.utime(cache / "template" / f"key{number}", ns=(number * 10**9, number * 10**9))
    assert len(_entries(cache, "template")) == 5
    diskcache.write("template", "newest", b"payload")
    assert [p.name for p in _entries(cache, "template")] == ["key3", "key4", "newest"]
    assert diskcache.read("template", "newest") == b"payload"


# --------------------------------------------------------------------------- bundles
# A run's warm-up reads all its SOP's template and expression code from one entry.

BUNDLED_TEMPLATES = ["Hello {{ name }}", "{% for i in items %}{{ i }},{% endfor %}", "{{ 'x' * 10**9 }}"]
BUNDLED_EXPRESSIONS = ["items | length > 1", "items[1:]"]


def _new_process() -> None:
    """What a new process has in memory: no template or expression compiled yet."""
    code.template.cache_clear()
    compile_expression.cache_clear()
    code.expression.cache_clear()
    code._COMPILED.clear()


def _no_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, code can only come from the cache."""
    def refuse(source: str) -> object:
        raise AssertionError(f"compiled {source!r}")
    monkeypatch.setitem(code._COMPILERS, "template", refuse)
    monkeypatch.setitem(code._COMPILERS, "expression", refuse)
    monkeypatch.setattr(code, "_compile_template", refuse)
    monkeypatch.setattr(code, "_expression_code", refuse)


def _bundle(cache: Path) -> Path:
    _new_process()
    code.precompile_all(BUNDLED_TEMPLATES, BUNDLED_EXPRESSIONS)
    [entry] = _entries(cache, "bundle")
    return entry


def test_a_bundle_holds_the_code_of_a_whole_sop_and_is_read_in_one_go(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _bundle(cache)
    for kind in ("template", "expression"):                  # its own entries are not needed
        for entry in _entries(cache, kind):
            entry.unlink()
    _new_process()
    _no_compiling(monkeypatch)
    reads: list[str] = []
    read = diskcache.read
    monkeypatch.setattr(diskcache, "read", lambda kind, key: reads.append(kind) or read(kind, key))
    code.precompile_all(BUNDLED_TEMPLATES, BUNDLED_EXPRESSIONS)
    assert reads == ["bundle"]
    assert render_template(BUNDLED_TEMPLATES[0], {"name": "a"}) == "Hello a"
    assert render_template(BUNDLED_TEMPLATES[1], {"items": [1, 2]}) == "1,2,"
    assert compile_expression(BUNDLED_EXPRESSIONS[0])(items=[1, 2, 3]) is True
    assert compile_expression(BUNDLED_EXPRESSIONS[1])(items=[1, 2, 3]) == [2, 3]
    assert code._BUNDLED == {}                            # nothing kept beyond the warm-up


def test_a_template_bomb_whose_code_comes_from_a_bundle_is_still_refused(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _bundle(cache)
    for entry in _entries(cache, "template"):
        entry.unlink()
    _new_process()
    _no_compiling(monkeypatch)
    code.precompile_all(BUNDLED_TEMPLATES, BUNDLED_EXPRESSIONS)
    with pytest.raises(TemplateFailure, match="refused by the sandbox"):
        render_template(BUNDLED_TEMPLATES[2], {})


def _foreign_records() -> bytes:
    import marshal

    compiled = code._compile_template("{{ 1 }}")
    return marshal.dumps((("template", "not one of this SOP's templates", compiled),))


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "not code", "other texts"])
def test_a_corrupt_or_foreign_bundle_is_a_miss_and_rewritten(cache: Path, damage: str) -> None:
    import marshal

    entry = _bundle(cache)
    blob = entry.read_bytes()
    if damage in ("not code", "other texts"):                # checksummed, but not what was asked
        payload = marshal.dumps((("template", BUNDLED_TEMPLATES[0], "print('x')"),)) \
            if damage == "not code" else _foreign_records()
        diskcache.write("bundle", entry.name, payload)
    else:
        entry.write_bytes({"truncated": blob[: len(blob) // 2],
                           "flipped": blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]),
                           "empty": b""}[damage])
    items = sorted({("template", s) for s in BUNDLED_TEMPLATES} | {("expression", e) for e in BUNDLED_EXPRESSIONS})
    assert code._read_bundle(entry.name, items) is None
    _new_process()
    code.precompile_all(BUNDLED_TEMPLATES, BUNDLED_EXPRESSIONS)
    assert render_template(BUNDLED_TEMPLATES[0], {"name": "b"}) == "Hello b"
    assert set(code._read_bundle(entry.name, items) or ()) == set(items)   # rewritten whole
    with pytest.raises(TemplateFailure, match="refused by the sandbox"):
        render_template(BUNDLED_TEMPLATES[2], {})


def test_a_template_that_does_not_compile_is_left_out_of_the_bundle_and_still_reported(cache: Path) -> None:
    _new_process()
    code.precompile_all(["fine {{ x }}", "broken {{ x "], ["items items"])
    [entry] = _entries(cache, "bundle")
    assert b"broken" not in entry.read_bytes() and b"items items" not in entry.read_bytes()
    _new_process()
    code.precompile_all(["fine {{ x }}", "broken {{ x "], ["items items"])
    assert render_template("fine {{ x }}", {"x": 1}) == "fine 1"
    with pytest.raises(Exception, match="unexpected end of template"):
        render_template("broken {{ x ", {"x": 1})
    with pytest.raises(Exception, match="chunk after expression|unexpected"):
        compile_expression("items items")


def test_a_run_warm_up_stores_its_sop_as_one_bundle(cache: Path, tmp_path: Path) -> None:
    from engine.run import actions

    compiled = _fresh_check(_sop(tmp_path)).compiled
    _new_process()
    actions._warm(compiled)
    [entry] = _entries(cache, "bundle")
    assert b"Write about {{ inputs.idea }}" in entry.read_bytes()


def test_plain_text_renders_as_itself_within_the_limit(cache: Path) -> None:
    assert render_template("docs/prd.md", {}) == "docs/prd.md"
    assert render_template("a\r\nb", {}) == "a\nb"              # jinja's newlines, as before
    with pytest.raises(TemplateFailure, match="exceeds the limit of 4 characters"):
        render_template("plain", {}, limit=4)


def test_the_engine_s_fingerprint_reads_the_engine_s_own_files_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key holds the engine's code: its modules' sizes and time stamps, not those of the
    folder it is installed in (a checkout's .venv, site-packages: tens of thousands of files
    stat'ed by every `sopctl validate`)."""
    import engine

    walked: list[str] = []
    real_walk = os.walk
    monkeypatch.setattr(os, "walk", lambda top, *a, **k: walked.append(str(top)) or real_walk(top, *a, **k))
    diskcache.code_fingerprint.cache_clear()
    try:
        diskcache.code_fingerprint()
    finally:
        diskcache.code_fingerprint.cache_clear()
    assert walked == [str(Path(engine.__file__).resolve().parent)]
