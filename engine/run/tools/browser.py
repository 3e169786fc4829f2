"""The `browser` toolset: a web page the model drives (MetaGPT's Browser), through Playwright
for Python and the system's Chromium (never a browser Playwright downloads).

One Chromium for the run, started at the first browser command; each role has its own page
(its own cookies), kept from one activation to the next and closed with the run
(`Browsers`, on the RunContext). Only with `--allow-network` (every host) or `--allow-host
HOST` (those hosts): a navigation to another host is refused before it starts, every request
the page makes is checked (route interception) and one to a host not allowed is aborted, and
Chromium's own resolver knows no other host (`--host-resolver-rules`), which also stops
redirects, workers and sockets that no route sees. The model is told what was refused.

Playwright is imported only when a run's first browser command runs: `sopctl validate`
never imports it. Its results are journaled like every command with effects outside the
loop, so a resume reuses them; a resumed run's browser starts on no page, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from engine.errors import install_hint
from engine.run.tools.base import ToolError

__all__ = ["Browser", "Browsers", "PAGE_CHARS", "browser_problem", "chromium_path", "host_allowed"]


PAGE_CHARS = 4000
"""The most page text one command shows; `browser.read` with an offset shows the rest."""


NAVIGATION_TIMEOUT_MS = 30_000
ACTION_TIMEOUT_MS = 10_000
"""How long a click or a field may take to be found and used (Playwright waits for it)."""


_EXTRA = f"{install_hint('browser')} (Playwright for Python; its browser download is not needed)"


def chromium_path() -> str | None:
    """The Chromium the browser drives: $SOPCTL_CHROMIUM, else the system's."""
    return os.environ.get("SOPCTL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def browser_problem() -> tuple[str, str] | None:
    """Why the browser cannot start here (message, hint), or None; imports nothing."""
    if importlib.util.find_spec("playwright") is None:
        return "the browser tool needs Playwright for Python, which is not installed", _EXTRA
    if chromium_path() is None:
        return ("the browser tool needs Chromium, which is not installed",
                "apt-get install chromium (or set SOPCTL_CHROMIUM to a Chromium binary)")
    return None


def host_allowed(url: str, hosts: tuple[str, ...] | None) -> bool:
    """Whether the browser may reach `url`: http(s) only, to a host named (None: every host)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    return hosts is None or parts.hostname.lower() in hosts


def _resolver_rules(hosts: tuple[str, ...]) -> str:
    # Every name (and IP literal) but the allowed ones fails to resolve inside Chromium.
    return ", ".join(["MAP * ~NOTFOUND", *(f"EXCLUDE {h}" for h in hosts)])


@dataclass
class _Page:
    """One role's page and what it refused since the last command."""

    page: Any
    opened: bool = False
    refused: list[str] = field(default_factory=list)


class Browsers:
    """The run's Chromium and each role's page; `close` ends them (the run's end calls it)."""

    def __init__(self, hosts: tuple[str, ...] | None) -> None:
        self.hosts = None if hosts is None else tuple(h.lower() for h in hosts)
        self._lock = asyncio.Lock()
        self._playwright: Any = None
        self._browser: Any = None
        self._pages: dict[str, _Page] = {}

    async def page(self, role_id: str) -> _Page:
        async with self._lock:     # two roles' first commands start one Chromium
            if role_id not in self._pages:
                if self._browser is None:
                    await self._start()
                self._pages[role_id] = await self._new_page()
            return self._pages[role_id]

    async def _start(self) -> None:
        problem = browser_problem()
        if problem is not None:
            raise ToolError(f"{problem[0]}; {problem[1]}")
        from playwright.async_api import async_playwright  # the optional extra, only when a browser runs

        args = [] if self.hosts is None else [f"--host-resolver-rules={_resolver_rules(self.hosts)}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--no-sandbox")   # Chromium refuses to run its sandbox as root
        self._playwright = await async_playwright().start()
        try:
            self._browser = await self._playwright.chromium.launch(executable_path=chromium_path(), args=args)
        except Exception as exc:  # noqa: BLE001 - Playwright's own error: the model and the log read it
            await self._playwright.stop()
            self._playwright = None
            raise ToolError(f"Chromium could not start: {_first_line(exc)}") from None

    async def _new_page(self) -> _Page:
        context = await self._browser.new_context(service_workers="block", accept_downloads=False)
        page = await context.new_page()
        page.set_default_timeout(ACTION_TIMEOUT_MS)
        page.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
        state = _Page(page)

        async def check(route: Any) -> None:
            url = route.request.url
            if host_allowed(url, self.hosts):
                await route.continue_()
            else:
                state.refused.append(url)
                await route.abort("blockedbyclient")

        def failed(request: Any) -> None:   # a redirect to a host not allowed fails in the resolver
            if not host_allowed(request.url, self.hosts) and request.url not in state.refused:
                state.refused.append(request.url)

        await context.route("**/*", check)
        page.on("requestfailed", failed)
        return state

    async def close(self) -> None:
        """End Chromium and Playwright's driver; one that died already is no error of the run's."""
        browser, playwright, self._browser, self._playwright = self._browser, self._playwright, None, None
        self._pages.clear()
        for end in (browser.close if browser is not None else None, playwright.stop if playwright else None):
            if end is not None:
                with contextlib.suppress(Exception):
                    await end()


_TEXT_IN_VIEW = """() => {
  const h = window.innerHeight, out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const t = n.textContent.trim();
    if (!t) continue;
    const r = document.createRange();
    r.selectNodeContents(n);
    if ([...r.getClientRects()].some(b => b.width > 0 && b.bottom > 0 && b.top < h)) out.push(t);
  }
  const d = document.documentElement;
  return {text: out.join("\\n"), y: Math.round(window.scrollY), height: d.scrollHeight, view: h};
}"""
"""The text of what the viewport shows (scroll's output), and where it is on the page."""


class Browser:
    """`browser.*` for one role: its page lives in the run's `Browsers`."""

    def __init__(self, ctx: Any, role_id: str) -> None:
        self.ctx = ctx
        self.role_id = role_id

    async def _state(self, *, navigating: bool = False) -> _Page:
        if self.ctx.browsers is None:
            if not (self.ctx.allow_network or self.ctx.allow_hosts):   # the run refuses to start first
                raise ToolError("the browser needs --allow-network or --allow-host HOST")
            self.ctx.browsers = Browsers(None if self.ctx.allow_network else tuple(self.ctx.allow_hosts))
        state: _Page = await self.ctx.browsers.page(self.role_id)
        if not (navigating or state.opened):
            raise ToolError("no page is open: give browser.goto first (a resumed run starts a new "
                            "browser, on no page: go to the page again)")
        return state

    async def do_goto(self, url: str) -> str:
        if not re.match(r"^https?://", url):
            raise ToolError(f"only http:// and https:// pages can be opened, not {url!r}")
        state = await self._state(navigating=True)
        hosts = self.ctx.browsers.hosts
        if not host_allowed(url, hosts):
            raise ToolError(f"{_host(url)} is not an allowed host; this run allows {', '.join(hosts)} "
                            "(--allow-host HOST adds one)")
        response = await _attempt(state, f"could not open {url}", state.page.goto(url))
        state.opened = True
        status = f" (HTTP {response.status})" if response is not None and response.status >= 400 else ""
        return await self._view(state, status)

    async def do_click(self, text: str = "", selector: str = "") -> str:
        state = await self._state()
        target = await _found(_one_target(state.page, text, selector, "click"), text, selector)
        await _attempt(state, f"could not click {_describe(text, selector)}", target.click())
        await _attempt(state, "the page did not load", state.page.wait_for_load_state())
        return await self._view(state)

    async def do_type(self, text: str, field: str = "", selector: str = "", submit: bool = False) -> str:
        state = await self._state()
        page = state.page
        if bool(field) == bool(selector):
            raise ToolError("give one of `field` (its label, placeholder or name) or `selector` (CSS)")
        target = await _found((page.locator(selector) if selector else page.get_by_label(field).or_(
            page.get_by_placeholder(field)).or_(page.locator(f"[name={_css_string(field)}]"))).first, field, selector)
        await _attempt(state, f"could not type into {_describe(field, selector)}", target.fill(text))
        if not submit:
            return f"typed {len(text)} characters into {_describe(field, selector)}" + _refusals(state)
        await _attempt(state, "could not submit", target.press("Enter"))
        await _attempt(state, "the page did not load", page.wait_for_load_state())
        return await self._view(state)

    async def do_scroll(self, direction: str = "down") -> str:
        state = await self._state()
        sign = -1 if direction == "up" else 1
        await state.page.evaluate(f"() => window.scrollBy(0, {sign} * window.innerHeight * 0.9)")
        seen = await state.page.evaluate(_TEXT_IN_VIEW)
        bottom = seen["y"] + seen["view"] >= seen["height"]
        where = (f"[showing {seen['y']}-{seen['y'] + seen['view']} px of {seen['height']} px"
                 + ("; the bottom of the page]" if bottom else "; browser.scroll shows more]"))
        return f"{where}\n{_window(seen['text'], 0, 'the visible text')}" + _refusals(state)

    async def do_read(self, offset: int = 0) -> str:
        state = await self._state()
        return await self._view(state, offset=offset)

    async def do_back(self) -> str:
        state = await self._state()
        before = state.page.url
        response = await _attempt(state, "could not go back", state.page.go_back())
        if state.page.url == "about:blank" != before:   # the empty page the browser started on
            await _attempt(state, "could not come back", state.page.go_forward())
            raise ToolError("there is no earlier page")
        if response is None and state.page.url == before:   # None too for a move within the page
            raise ToolError("there is no earlier page")
        return await self._view(state)

    async def _view(self, state: _Page, status: str = "", offset: int = 0) -> str:
        page = state.page
        title = await page.title()
        text = _tidy(await page.inner_text("body") if await page.locator("body").count() else "")
        head = f"[page] {title or '(no title)'} - {page.url}{status}"
        return f"{head}\n{_window(text, offset, 'the page text')}" + _refusals(state)


def _window(text: str, offset: int, what: str) -> str:
    """PAGE_CHARS of `text` from `offset`, saying which characters they are and how to see more."""
    offset = max(0, min(offset, len(text)))
    end = min(len(text), offset + PAGE_CHARS)
    more = f"; browser.read with offset {end} shows more" if end < len(text) else ""
    if not text:
        return f"[{what} is empty]"
    return f"[{what}: characters {offset}-{end} of {len(text)}{more}]\n{text[offset:end]}"


def _tidy(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r", "").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _refusals(state: _Page) -> str:
    """What the page asked for and was refused since the last command (then forgotten)."""
    if not state.refused:
        return ""
    shown = state.refused[:5]
    more = f" and {len(state.refused) - 5} more" if len(state.refused) > 5 else ""
    state.refused = []
    return ("\n[refused: the page asked for hosts not allowed: " + ", ".join(shown) + more
            + "; --allow-host HOST lets the run reach a host]")


async def _attempt(state: _Page, what: str, awaitable: Any) -> Any:
    """Playwright's error as the model's to read: its first line, with what was refused."""
    try:
        return await awaitable
    except ToolError:
        raise
    except Exception as exc:  # noqa: BLE001 - Playwright's TimeoutError and Error, and nothing else here
        raise ToolError(f"{what}: {_first_line(exc)}" + _refusals(state)) from None


def _one_target(page: Any, text: str, selector: str, verb: str) -> Any:
    if bool(text) == bool(selector):
        raise ToolError(f"give one of `text` (the element's visible text) or `selector` (CSS) to {verb}")
    if selector:
        return page.locator(selector).first
    exact = page.get_by_role("link", name=text).or_(page.get_by_role("button", name=text))
    return exact.or_(page.get_by_text(text)).first


async def _found(target: Any, text: str, selector: str) -> Any:
    """The element, or a ToolError now (rather than Playwright's wait for one that never comes)."""
    try:
        count = await target.count()
    except Exception as exc:  # noqa: BLE001 - a selector Playwright cannot parse
        raise ToolError(f"bad selector {selector!r}: {_first_line(exc)}") from None
    if not count:
        raise ToolError(f"no element {_describe(text, selector)} on the page (browser.read shows its text)")
    return target


def _describe(text: str, selector: str) -> str:
    return f"selector {selector!r}" if selector else repr(text)


def _css_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _host(url: str) -> str:
    return urlsplit(url).hostname or url


def _first_line(exc: BaseException) -> str:
    message = str(getattr(exc, "message", None) or exc).strip()
    return message.splitlines()[0] if message else type(exc).__name__
