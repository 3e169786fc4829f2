"""The `search` toolset: `search.query` against the file's `search:` endpoint (MetaGPT's
SearchEnhancedQA asks a search engine the same way).

The endpoint is an HTTP GET of `url` with the query in `query_param` (plus the file's fixed
`params` and its `headers`, whose values come from the environment variables the file names)
and `limit`; it answers JSON: a list of results, or an object holding one under `results`,
`items` or `organic` (SearxNG, most search APIs). A result's title is `title`, its address
`url` (or `link`, `href`), its text `snippet` (or `content`, `description`, `body`). The model
sees at most `max_results`, each cut short, in the order given. Redirects are not followed:
the run reaches only the host `--allow-host` names.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlsplit

from engine.load.spec import SearchSpec
from engine.run.tools.base import ToolError

__all__ = ["Search", "MAX_RESPONSE_BYTES", "format_results"]


MAX_RESPONSE_BYTES = 2_000_000
"""A bigger answer is refused unread (results are a few kilobytes)."""


_TITLE_CHARS = 200
_SNIPPET_CHARS = 400
_LISTS = ("results", "items", "organic")
_URLS = ("url", "link", "href")
_SNIPPETS = ("snippet", "content", "description", "body")


class Search:
    """`search.*` of one role: the run's endpoint and its allowed hosts."""

    def __init__(self, spec: SearchSpec | None, allow_hosts: tuple[str, ...]) -> None:
        self.spec = spec
        self.allow_hosts = allow_hosts

    async def do_query(self, query: str, limit: int | None = None) -> str:
        spec = self.spec
        if spec is None:      # validate refuses the file first; a second lock
            raise ToolError("this SOP declares no search endpoint (`search:`)")
        host = urlsplit(spec.url).hostname or ""
        if host not in self.allow_hosts:      # the run refuses to start first; a second lock
            raise ToolError(f"the search endpoint's host {host} needs --allow-host {host}")
        wanted = min(limit or spec.max_results, spec.max_results)
        data = await _get(spec, {**spec.params, spec.query_param: query, "limit": str(wanted)})
        return format_results(query, _results(data), wanted)


async def _get(spec: SearchSpec, params: dict[str, str]) -> Any:
    import httpx  # not at the top: every run imports the toolsets, few of them search

    headers = {}
    for header, var in spec.headers.items():
        if var not in os.environ:
            raise ToolError(f"the search endpoint's header {header} needs the environment variable {var}, "
                            "which is not set")
        headers[header] = os.environ[var]
    try:
        async with httpx.AsyncClient(timeout=spec.timeout_s, follow_redirects=False) as client:
            async with client.stream("GET", spec.url, params=params, headers=headers) as response:
                body = await _body(response)
    except httpx.HTTPError as exc:
        raise ToolError(f"the search endpoint did not answer: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ToolError(f"the search endpoint answered HTTP {response.status_code}: {body[:200]!r}")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):   # nested past the decoder's depth: not JSON to us
        raise ToolError(f"the search endpoint's answer is not JSON: {body[:200]!r}") from None


async def _body(response: Any) -> str:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ToolError(f"the search endpoint's answer is larger than {MAX_RESPONSE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _results(data: Any) -> list[dict[str, str]]:
    """The results of any of the answer shapes the module's doc names, as title, url, snippet."""
    if isinstance(data, dict):
        data = next((data[key] for key in _LISTS if isinstance(data.get(key), list)), None)
    if not isinstance(data, list):
        raise ToolError("the search endpoint's answer holds no list of results "
                        f"(a JSON list, or one under {', '.join(_LISTS)})")
    found = []
    for item in data:
        if isinstance(item, dict):
            found.append({"title": _text(item, ("title",)), "url": _text(item, _URLS),
                          "snippet": _text(item, _SNIPPETS)})
    return found


def _text(item: dict[str, Any], keys: tuple[str, ...]) -> str:
    value = next((item[k] for k in keys if isinstance(item.get(k), str)), "")
    return " ".join(value.split())


def format_results(query: str, results: list[dict[str, str]], limit: int) -> str:
    """What the model reads: numbered results, each title, url and snippet, cut short."""
    if not results:
        return f"no results for {query!r}"
    shown = results[:limit]
    more = f" (of {len(results)} given)" if len(results) > limit else ""
    lines = [f"{len(shown)} results for {query!r}{more}:"]
    for n, result in enumerate(shown, 1):
        lines.append(f"{n}. {_cut(result['title'], _TITLE_CHARS) or '(no title)'}")
        if result["url"]:
            lines.append(f"   {result['url'][:500]}")
        if result["snippet"]:
            lines.append(f"   {_cut(result['snippet'], _SNIPPET_CHARS)}")
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
