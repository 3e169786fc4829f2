"""A tiny offline search engine over a folder of documents, for examples/search_qa.sop.yaml.

It answers what a file's `search:` endpoint must: `GET /search?q=QUERY&limit=N` gives JSON
`{"results": [{"title", "url", "snippet"}, ...]}`, best first (a document scores the times
the query's words occur in it). Each result's url serves the document itself as HTML, so a
`browser` can open it. The standard library only; it listens on 127.0.0.1.

    python examples/search/search_server.py              # http://127.0.0.1:8765/search
    python examples/search/search_server.py --port 0     # any free port (printed first)
"""

from __future__ import annotations

import argparse
import html
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

DOCS = Path(__file__).resolve().parent / "docs"


def documents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.md"))}


def title_of(text: str, name: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else name
    return first.lstrip("# ").strip() or name


def snippet_of(text: str, words: set[str]) -> str:
    """The first paragraph (after the title) that holds a query word, else the first one."""
    paragraphs = [p.strip() for p in text.split("\n\n")[1:] if p.strip()]
    hit = next((p for p in paragraphs if words & set(re.findall(r"\w+", p.lower()))), None)
    return " ".join((hit or (paragraphs[0] if paragraphs else "")).split())[:300]


def search(folder: Path, query: str, limit: int, base: str) -> list[dict[str, str]]:
    words = {w for w in re.findall(r"\w+", query.lower()) if len(w) > 2}
    scored = []
    for name, text in documents(folder).items():
        score = sum(len(re.findall(rf"\b{re.escape(w)}\b", text.lower())) for w in words)
        if score:
            scored.append((-score, name, text))
    return [{"title": title_of(text, name), "url": f"{base}/docs/{quote(name)}", "snippet": snippet_of(text, words)}
            for _, name, text in sorted(scored)[:limit]]


def handler(folder: Path) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            url = urlsplit(self.path)
            base = f"http://{self.headers.get('Host', '127.0.0.1')}"
            if url.path == "/search":
                query = parse_qs(url.query)
                limit = int((query.get("limit") or ["5"])[0] or 5)
                body = json.dumps({"results": search(folder, (query.get("q") or [""])[0], limit, base)})
                return self._send(200, "application/json", body)
            name = unquote(url.path.removeprefix("/docs/"))
            docs = documents(folder)
            if url.path.startswith("/docs/") and name in docs:
                text = docs[name]
                page = (f"<!doctype html><title>{html.escape(title_of(text, name))}</title>"
                        + "".join(f"<p>{html.escape(p)}</p>" for p in text.split("\n\n")))
                return self._send(200, "text/html; charset=utf-8", page)
            return self._send(404, "application/json", json.dumps({"error": "not found"}))

        def _send(self, status: int, kind: str, body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--docs", type=Path, default=DOCS, help="the folder of .md documents")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.docs.resolve()))
    print(f"serving on http://127.0.0.1:{server.server_address[1]}/search", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
