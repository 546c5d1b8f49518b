"""A web handler that serves thumbnails, each made once and kept with `@vrange.cached`: when
memory gets tight (its container's limit lowered, a neighbour growing) the cache gives
thumbnails back to the system and makes them again when asked, so the service keeps serving.
With `functools.lru_cache(maxsize=None)` instead, the same service grows until the
container's OOM killer ends it; with a bounded cache someone has to guess the bound.

    python3 examples/thumbnails.py [--port 8000] [--cache vrange|lru|cachetools [--maxsize N]]

GET /thumb/N returns thumbnail N (64 KiB, the same bytes every time); GET /stats returns the
cache's counters as JSON.
"""

import argparse
import functools
import hashlib
import http.server
import json

import vrange

SIZE = 64 << 10


def render(n: int) -> bytes:
    """Stands in for decoding and scaling an image: 64 KiB that depend on `n` only."""
    seed = hashlib.sha256(b"thumbnail %d" % n).digest()
    return seed * (SIZE // len(seed))


def make_handler(thumbnail, stats):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/thumb/") and self.path[7:].isdigit():
                body, kind = thumbnail(int(self.path[7:])), "application/octet-stream"
            elif self.path == "/stats":
                body, kind = json.dumps(stats()).encode(), "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000, help="0: any free port")
    ap.add_argument("--cache", choices=["vrange", "lru", "cachetools"], default="vrange")
    ap.add_argument("--maxsize", type=int, default=1000, help="cachetools: thumbnails kept")
    args = ap.parse_args()
    if args.cache == "vrange":
        thumbnail = vrange.cached(priority="low")(render)
    elif args.cache == "lru":
        thumbnail = functools.lru_cache(maxsize=None)(render)
    else:
        import cachetools

        counts = {"hits": 0, "misses": 0}
        store = cachetools.LRUCache(maxsize=args.maxsize)

        def thumbnail(n):
            try:
                body = store[n]
                counts["hits"] += 1
                return body
            except KeyError:
                counts["misses"] += 1
                store[n] = body = render(n)
                return body

    def stats():
        if args.cache == "cachetools":
            return {"cache": args.cache, **counts, "held": len(store), "purged": 0}
        info = thumbnail.cache_info()
        return {"cache": args.cache, "hits": info.hits, "misses": info.misses,
                "held": info.currsize, "purged": getattr(info, "purged", 0)}

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(thumbnail, stats))
    print(f"serving on port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
