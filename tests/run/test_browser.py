"""The `browser` toolset against a local HTTP server this test starts: go to a page, click a
link, type into a form and submit it, scroll, read long text in parts, go back; a host not
allowed refused (a navigation, a sub-request of an allowed page, a redirect), the flags a
run needs, one page per role across activations, and the browser closed with the run.

Chromium is the system's (`apt-get install chromium`, or SOPCTL_CHROMIUM); Playwright's own
browser download is never used. Without either, the tests that drive it are skipped, saying why.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from run_helpers import run_sop, sop_text

from engine.errors import RunError
from engine.run.events import ToolCalled
from engine.run.tools.browser import PAGE_CHARS, browser_problem, host_allowed
from engine.testing import ScriptedModel

NO_BROWSER = browser_problem()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=f"browser test skipped: {NO_BROWSER}")


BROWSE = """
apiVersion: sop/v1
name: browse_test
inputs:
  idea: {required: true}
actions:
  Browse:
    prompt: "Look up {{ inputs.idea }}"
    tools: [browser]
    max_steps: 8
    output:
      Summary: {type: str}
roles:
  Surfer:
    actions: [Browse]
    watch: [UserRequirement]
"""


class _Site(BaseHTTPRequestHandler):
    """A tiny site; every request it serves is kept (path, Host header) in `served`."""

    served: list[tuple[str, str]] = []
    port = 0

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.served.append((self.path, self.headers.get("Host", "")))
        url = urlsplit(self.path)
        other = f"http://localhost:{self.port}"     # the same server, by a host the run does not allow
        if url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"{other}/secret")
            self.end_headers()
            return
        pages = {
            "/": "<title>Home</title><h1>Welcome home</h1><a href='/about'>About us</a>"
                 "<form action='/hello'><label for='q'>Your name</label><input id='q' name='q'>"
                 "<button>Send</button></form>",
            "/about": "<title>About</title><p>We make tiny websites.</p>",
            "/hello": f"<title>Hello</title><p>Hello, {parse_qs(url.query).get('q', ['nobody'])[0]}!</p>",
            "/long": "<title>Long</title>" + "".join(
                f"<div style='height:600px'>Section {i} {'filler ' * 100}</div>" for i in range(1, 31)),
            "/embed": f"<title>Embed</title><p>A picture:</p><img src='{other}/pixel.png'>",
        }
        body = pages.get(url.path, "<title>Missing</title><p>no such page</p>").encode()
        self.send_response(200 if url.path in pages else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    _Site.port = server.server_address[1]
    _Site.served = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{_Site.port}"
    finally:
        server.shutdown()
        server.server_close()


def step(*commands: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"thought": "next", "commands": [{"command_name": n, "args": a} for n, a in commands]}


def end(summary: str = "done") -> dict[str, Any]:
    return step(("end", {"Summary": summary}))


def outputs(result: Any) -> list[str]:
    return [e.output for e in result.events if isinstance(e, ToolCalled)]


def browse(tmp_path: Path, steps: list[dict[str, Any]], **options: Any) -> tuple[Any, list[str]]:
    options.setdefault("allow_hosts", ["127.0.0.1"])
    result = run_sop(sop_text(BROWSE), ScriptedModel([*steps, end()]), tmp_path / "ws", **options)
    assert result.status == "idle", result.error
    return result, outputs(result)


@needs_browser
def test_go_to_a_page_click_a_link_and_go_back(site: str, tmp_path: Path) -> None:
    _, out = browse(tmp_path, [step(("browser.goto", {"url": site + "/"})),
                               step(("browser.click", {"text": "About us"})),
                               step(("browser.back", {})), step(("browser.back", {})),
                               step(("browser.read", {}))])
    assert out[0].startswith(f"[page] Home - {site}/")
    assert "Welcome home" in out[0] and "About us" in out[0]
    assert out[1].startswith(f"[page] About - {site}/about") and "We make tiny websites." in out[1]
    assert out[2].startswith("[page] Home")
    assert out[3] == "there is no earlier page"
    assert out[4].startswith("[page] Home")                   # still where it was


@needs_browser
def test_type_into_a_form_and_submit_it(site: str, tmp_path: Path) -> None:
    _, out = browse(tmp_path, [step(("browser.goto", {"url": site + "/"})),
                               step(("browser.type", {"field": "Your name", "text": "Ada"})),
                               step(("browser.click", {"text": "Send"})),
                               step(("browser.type", {"selector": "#nope", "text": "x"})),
                               step(("browser.goto", {"url": site + "/"}),
                                    ("browser.type", {"selector": "input[name=q]", "text": "Bob", "submit": True}))])
    assert out[1] == "typed 3 characters into 'Your name'"
    assert "Hello, Ada!" in out[2] and "/hello?q=Ada" in out[2]
    assert out[3] == "no element selector '#nope' on the page (browser.read shows its text)"
    assert "Hello, Bob!" in out[5]


@needs_browser
def test_scroll_shows_what_comes_into_view_and_read_pages_through_long_text(site: str, tmp_path: Path) -> None:
    _, out = browse(tmp_path, [step(("browser.goto", {"url": site + "/long"})),
                               step(("browser.scroll", {})), step(("browser.scroll", {})),
                               step(("browser.scroll", {"direction": "up"})),
                               step(("browser.read", {"offset": PAGE_CHARS}))])
    total = int(out[0].split(" of ", 1)[1].split(";")[0].split("]")[0])
    assert total > 2 * PAGE_CHARS
    assert f"[the page text: characters 0-{PAGE_CHARS} of {total}; browser.read with offset {PAGE_CHARS} " \
           "shows more]" in out[0]
    assert "Section 1 " in out[0] and "Section 30" not in out[0]
    first, second, back = out[1], out[2], out[3]
    assert first.startswith("[showing ") and "browser.scroll shows more" in first
    assert "Section 1 " not in second and ("Section 2 " in first or "Section 3 " in first)
    assert int(second.split()[1].split("-")[0]) > int(first.split()[1].split("-")[0])
    assert int(back.split()[1].split("-")[0]) < int(second.split()[1].split("-")[0])
    assert f"characters {PAGE_CHARS}-{2 * PAGE_CHARS} of {total}" in out[4]


@needs_browser
def test_hosts_not_allowed_are_refused_and_the_model_is_told(site: str, tmp_path: Path) -> None:
    other = site.replace("127.0.0.1", "localhost")
    _, out = browse(tmp_path, [step(("browser.goto", {"url": other + "/"})),
                               step(("browser.goto", {"url": site + "/embed"})),
                               step(("browser.goto", {"url": site + "/redirect"})),
                               step(("browser.goto", {"url": "file:///etc/passwd"}))])
    assert out[0].startswith("localhost is not an allowed host; this run allows 127.0.0.1")
    assert "A picture:" in out[1]                                   # the page itself loads
    assert f"[refused: the page asked for hosts not allowed: {other}/pixel.png" in out[1]
    assert out[2].startswith(f"could not open {site}/redirect") and f"{other}/secret" in out[2]
    assert "the arguments do not match" in out[3]                  # the schema wants http(s)
    assert [p for p, host in _Site.served if host.startswith("localhost")] == []   # nothing reached it
    assert ("/redirect", f"127.0.0.1:{_Site.port}") in _Site.served


@needs_browser
def test_allow_network_lets_the_browser_reach_every_host(site: str, tmp_path: Path) -> None:
    other = site.replace("127.0.0.1", "localhost")
    _, out = browse(tmp_path, [step(("browser.goto", {"url": site + "/embed"})),
                               step(("browser.goto", {"url": site + "/redirect"}))],
                    allow_hosts=[], allow_network=True)
    assert "[refused" not in out[0]
    assert ("/pixel.png", f"localhost:{_Site.port}") in _Site.served
    assert out[1].startswith(f"[page] Missing - {other}/secret (HTTP 404)")


@needs_browser
def test_errors_go_back_to_the_model(site: str, tmp_path: Path) -> None:
    _, out = browse(tmp_path, [step(("browser.read", {})),
                               step(("browser.goto", {"url": site + "/"})),
                               step(("browser.click", {"text": "Nowhere to be found"})),
                               step(("browser.click", {})),
                               step(("browser.click", {"selector": "a", "text": "About us"})),
                               step(("browser.click", {"selector": "a[[["}))])
    assert out[0].startswith("no page is open: give browser.goto first")
    assert out[2] == "no element 'Nowhere to be found' on the page (browser.read shows its text)"
    assert out[3] == out[4] == "give one of `text` (the element's visible text) or `selector` (CSS) to click"
    assert out[5].startswith("bad selector 'a[[[': ") and "\n" not in out[5]


TWO_ACTIVATIONS = """
apiVersion: sop/v1
name: browse_twice
inputs:
  idea: {required: true}
team: {max_rounds: 3}
actions:
  Open:
    prompt: "Open the page"
    tools: [browser]
    max_steps: 3
    output: {Summary: {type: str}}
  Continue:
    prompt: "Go on"
    tools: [browser]
    max_steps: 3
    output: {Summary: {type: str}}
roles:
  Surfer:
    actions: [Open, Continue]
    react_mode: by_order
    watch: [UserRequirement]
"""


@needs_browser
def test_a_role_keeps_its_page_from_one_action_to_the_next(site: str, tmp_path: Path) -> None:
    model = ScriptedModel([step(("browser.goto", {"url": site + "/about"})), end(),
                           step(("browser.read", {})), end()])
    result = run_sop(sop_text(TWO_ACTIVATIONS), model, tmp_path / "ws", allow_hosts=["127.0.0.1"])
    assert result.status == "idle", result.error
    out = outputs(result)
    assert out[1].startswith(f"[page] About - {site}/about")   # the second action's read
    assert "We make tiny websites." in out[1]


def test_a_run_with_the_browser_needs_a_network_flag(tmp_path: Path) -> None:
    with pytest.raises(RunError, match=r"browser reaches the web; it needs --allow-network .* browser \(Browse\)"):
        run_sop(sop_text(BROWSE), ScriptedModel([end()]), tmp_path / "ws")
    assert not (tmp_path / "ws").exists()


def test_validate_names_the_browser_flag() -> None:
    assert dict(sop_text(BROWSE).plan.flags) == {"--allow-network or --allow-host": ("browser (Browse)",)}


def test_without_playwright_the_run_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "playwright" else real(name, *a))
    with pytest.raises(RunError) as caught:
        run_sop(sop_text(BROWSE), ScriptedModel([end()]), tmp_path / "ws", allow_hosts=["127.0.0.1"])
    assert "the browser tool needs Playwright for Python, which is not installed" in str(caught.value)
    assert ".[browser]'" in (caught.value.hint or "")


def test_without_chromium_the_run_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("SOPCTL_CHROMIUM", raising=False)
    if browser_problem() is not None and "Playwright" in browser_problem()[0]:   # type: ignore[index]
        pytest.skip("Playwright is not installed: the run names that first")
    with pytest.raises(RunError, match="the browser tool needs Chromium") as caught:
        run_sop(sop_text(BROWSE), ScriptedModel([end()]), tmp_path / "ws", allow_hosts=["127.0.0.1"])
    assert "apt-get install chromium" in (caught.value.hint or "")


def test_allow_network_without_isolate_or_a_browser_is_still_refused(tmp_path: Path) -> None:
    plain = BROWSE.replace("tools: [browser]", "tools: [plan]")
    with pytest.raises(RunError, match="--allow-network only applies with --isolate or to the browser tool"):
        run_sop(sop_text(plain), ScriptedModel([end()]), tmp_path / "ws", allow_network=True)


def test_only_http_to_a_named_host_is_allowed() -> None:
    assert host_allowed("http://127.0.0.1:8080/x", ("127.0.0.1",))
    assert host_allowed("https://Example.org/", ("example.org",))
    assert not host_allowed("http://localhost/", ("127.0.0.1",))
    assert not host_allowed("file:///etc/passwd", None)
    assert not host_allowed("ftp://example.org/", None)
    assert host_allowed("https://anything.example/", None)



def test_validate_never_imports_playwright(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "browse.sop.yaml"
    path.write_text(BROWSE, encoding="utf-8")
    probe = ("import sys\nfrom engine.cli import main\n"
             f"code = main(['validate', {str(path)!r}])\n"
             "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in ('playwright', 'asyncio')), code)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip().endswith("LOADED [] 0"), done.stdout + done.stderr
    assert "needs --allow-network or --allow-host: browser (Browse)" in done.stdout


def _browser_descendants() -> list[str]:
    """Command lines of this process's descendants that are Chromium or Playwright's driver."""
    import os

    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found = []
    for pid, line in lines.items():
        up = parents.get(pid, 0)
        while up > 1 and up != os.getpid():
            up = parents.get(up, 0)
        if up == os.getpid() and ("chrom" in line or "playwright" in line):
            found.append(line)
    return found


@needs_browser
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_browser_is_closed_with_the_run(site: str, tmp_path: Path) -> None:
    seen: list[list[str]] = []

    class Watch:
        def on_event(self, event: Any) -> None:
            if isinstance(event, ToolCalled):
                seen.append(_browser_descendants())

    browse(tmp_path, [step(("browser.goto", {"url": site + "/"}))], observers=[Watch()])
    assert seen and seen[0], "Chromium ran during the run"
    assert _browser_descendants() == []


@needs_browser
def test_a_resumed_run_reuses_journaled_pages_and_tells_the_model_the_browser_restarted(
        site: str, tmp_path: Path) -> None:
    from engine import api
    from engine.testing import use_model

    path = tmp_path / "browse.sop.yaml"
    path.write_text(BROWSE, encoding="utf-8")
    hosts = api.ResumeOptions(allow_hosts=["127.0.0.1"])
    with use_model(ScriptedModel([step(("browser.goto", {"url": site + "/about"}))])):   # then it fails
        first = api.run(api.load(path), {"idea": "x"}, api.RunOptions(workspace=tmp_path / "ws",
                                                                      allow_hosts=["127.0.0.1"]))
    assert first.status == "failed"
    served = len(_Site.served)
    again = ScriptedModel([step(("browser.read", {})), step(("browser.goto", {"url": site + "/about"})), end()])
    with use_model(again):
        resumed = api.resume(tmp_path / "ws", hosts)
    assert resumed.status == "idle", resumed.error
    prompts = again.prompts()
    assert "We make tiny websites." in prompts[0]                    # the journaled goto, not run again
    assert "no page is open: give browser.goto first (a resumed run starts a new browser" in prompts[1]
    assert "We make tiny websites." in prompts[2].split("no page is open")[1]
    assert len([p for p, _ in _Site.served[served:] if p == "/about"]) == 1   # the model's own second goto
