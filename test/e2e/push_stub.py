#!/usr/bin/env python3
"""A stub push gateway (Matrix push gateway API, /_matrix/push/v1/notify) for
the push tests, `make run` and the push benchmark.  It records every request
and answers by the pushkey's prefix, so one run exercises every class:

  ok…     200 {"rejected": []}            (anything else, too)
  rej…    200 {"rejected": [pushkey]}      (Sygnal's answer for a dead token)
  r429…   429 with Retry-After: 7, except
    r429huge…  Retry-After: 18446744073709552 (seconds: times 1000 wraps a 64-bit long)
    r429neg…   Retry-After: -5           r429junk…  Retry-After: 12abc
    r429date…  Retry-After: an HTTP-date 40 s ahead
    r429past…  Retry-After: an HTTP-date an hour ago
  redir…  302 to file:///etc/passwd (a relay follows no redirect)
  r500…   500, r502… 502 (Sygnal's error answers), r400… 400, r410… 410
  slow…   waits --slow seconds, then 200 (the relay's timeout fires first)
  close…  closes the connection without an answer

GET /_stub/requests lists what was received (JSON), GET / shows it as a
page; POST /_stub/reset forgets it.  --log FILE appends one JSON line per
request.  Prints "listening on PORT" once it is ready (--port 0: any port).
"""
import argparse
import email.utils
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWERS = [("rej", 200), ("r429", 429), ("r500", 500), ("r502", 502), ("r400", 400), ("r410", 410),
           ("redir", 302)]
# Retry-After by pushkey prefix (longest first), else "7"
RETRY_AFTER = [("r429huge", lambda: "18446744073709552"), ("r429neg", lambda: "-5"),
               ("r429junk", lambda: "12abc"),
               ("r429date", lambda: email.utils.formatdate(time.time() + 40, usegmt=True)),
               ("r429past", lambda: email.utils.formatdate(time.time() - 3600, usegmt=True))]


class Stub:
    def __init__(self, log_path, slow):
        self.lock = threading.Lock()
        self.requests = []
        self.log_path = log_path
        self.slow = slow

    def record(self, entry):
        with self.lock:
            self.requests.append(entry)
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(entry) + "\n")


def make_handler(stub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, status, body, headers=()):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            try:
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass            # the relay gave up (its timeout): expected for slow…

        def do_GET(self):
            with stub.lock:
                reqs = list(stub.requests)
            if self.path == "/_stub/requests":
                self.send(200, reqs)
            elif self.path == "/":
                rows = "".join("<tr><td>%s</td><td>%s</td><td><pre>%s</pre></td></tr>" % (
                    time.strftime("%H:%M:%S", time.gmtime(r["t"])), r["status"],
                    json.dumps(r["body"], indent=1).replace("<", "&lt;")) for r in reversed(reqs))
                page = ("<html><head><title>stub push gateway</title></head><body><h1>stub push gateway: %d "
                        "requests</h1><table border=1>%s</table></body></html>" % (len(reqs), rows)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
            else:
                self.send(404, {"errcode": "M_NOT_FOUND"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path == "/_stub/reset":
                with stub.lock:
                    stub.requests.clear()
                self.send(200, {})
                return
            if self.path != "/_matrix/push/v1/notify":
                self.send(404, {"errcode": "M_NOT_FOUND"})
                return
            try:
                body = json.loads(raw)
                pushkey = body["notification"]["devices"][0]["pushkey"]
            except (ValueError, KeyError, IndexError, TypeError):
                stub.record({"t": time.time(), "status": 400, "body": None, "bad": raw.decode("utf-8", "replace")})
                self.send(400, {"errcode": "M_BAD_JSON"})
                return
            entry = {"t": time.time(), "pushkey": pushkey, "body": body, "http_version": self.request_version}
            if pushkey.startswith("close"):
                entry["status"] = 0
                stub.record(entry)
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if pushkey.startswith("slow"):
                time.sleep(stub.slow)
            status = 200
            for prefix, code in ANSWERS:
                if pushkey.startswith(prefix):
                    status = code
            entry["status"] = status
            stub.record(entry)
            if status == 200:
                self.send(200, {"rejected": [pushkey] if pushkey.startswith("rej") else []})
            elif status == 429:
                after = next((v() for prefix, v in RETRY_AFTER if pushkey.startswith(prefix)), "7")
                self.send(429, {"errcode": "M_LIMIT_EXCEEDED"}, [("Retry-After", after)])
            elif status == 302:
                self.send(302, {}, [("Location", "file:///etc/passwd")])
            else:
                self.send(status, {"errcode": "M_UNKNOWN"})

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log")
    ap.add_argument("--slow", type=float, default=5.0)
    args = ap.parse_args()
    stub = Stub(args.log, args.slow)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(stub))
    server.daemon_threads = True
    print("listening on %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
