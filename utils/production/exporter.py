"""A Prometheus exporter of NVML metrics under dcgm-exporter's names, units and labels.

``python -m utils.production.exporter --port 9400 [--host 0.0.0.0] [--interval-s 1]`` serves
``/metrics`` (Prometheus text format 0.0.4) and ``/health``; ``--dump-json FILE`` takes two
readings, writes them as JSON and exits (a one-off check on a GPU machine). Dashboards
and alerts written for NVIDIA's dcgm-exporter (Grafana dashboard 12239) read it
unchanged, on machines where DCGM is not installed (Colab, Kaggle, a workstation) but
NVML is.

The metrics and their names are ``utils/production/dcgm_metrics.py``; reading NVML into them, and what
each failure means, is ``utils/production/nvml_collector.py`` (:class:`NvmlExporter`). This module serves
them over HTTP (:class:`MetricsServer`) and holds the command line.
"""
from __future__ import annotations

import argparse
import errno
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry

from utils.device import nvml
from utils.production.dcgm_metrics import CONTENT_TYPE, render
from utils.production.nvml_collector import NvmlExporter


class MetricsServer:
    """``/metrics`` and ``/health`` over HTTP in a daemon thread. Binding errors raise
    ``OSError`` from the constructor, before any thread starts."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    status, ctype, body = 200, CONTENT_TYPE, render(registry)
                elif path == "/health":
                    status, ctype, body = 200, "text/plain; charset=utf-8", b"OK\n"
                else:
                    status, ctype, body = 404, "text/plain; charset=utf-8", b"try /metrics or /health\n"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # one line per scrape would drown the log
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_cls = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        self._httpd = server_cls((host, port), Handler)
        self.host, self.port = host, self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def bind_error(exc: OSError, host: str, port: int) -> str:
    """One line saying why the server could not listen, and what to do."""
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve --host {host!r} ({exc.strerror}); use an address such as 127.0.0.1 or 0.0.0.0"
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use (another exporter or dcgm-exporter?); choose another --port"
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port} (ports below 1024 need root); choose a port >= 1024"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; use 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def snapshot(interval_s: float = 1.0) -> dict:
    """Two refreshes ``interval_s`` apart (GPM needs two samples), as served, parsed back:
    ``{"metrics": {name: [{"labels": {...}, "value": v}, ...]}, "text": exposition}``.
    For a one-off check on a GPU machine (``--dump-json``) and for tests."""
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    exp = NvmlExporter(registry=registry, interval_s=interval_s)
    exp.refresh()
    time.sleep(interval_s)
    exp.refresh()
    text = render(registry).decode()
    exp.stop()
    metrics = {f.name: [{"labels": s.labels, "value": s.value} for s in f.samples]
               for f in text_string_to_metric_families(text)}
    return {"nvml": nvml.status().__dict__, "interval_s": interval_s, "metrics": metrics, "text": text}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + error
        self.exit(2, f"exporter: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = _Parser(prog="python -m utils.production.exporter", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=9400, help="TCP port (dcgm-exporter's is 9400; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    p.add_argument("--interval-s", type=float, default=1.0, help="seconds between NVML reads (>= 0.1)")
    p.add_argument("--dump-json", metavar="FILE",
                   help="take two readings --interval-s apart, write them as JSON to FILE, and exit")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be 0..65535, got {args.port}")
    if not args.interval_s >= 0.1:
        p.error(f"--interval-s must be >= 0.1 (NVML refreshes every 1/6 to 1 s), got {args.interval_s}")

    if args.dump_json:
        try:
            out = open(args.dump_json, "w")  # noqa: SIM115 (fail before the readings, not after)
        except OSError as exc:
            print(f"exporter: error: cannot write --dump-json {args.dump_json}: {exc.strerror}", file=sys.stderr)
            return 2
        with out:
            snap = snapshot(args.interval_s)
            json.dump(snap, out, indent=1)
        got = {k: len(v) for k, v in snap["metrics"].items() if k.startswith("DCGM") and v}
        print(f"exporter: wrote {args.dump_json}; series per DCGM metric: {got}")
        return 0

    registry = CollectorRegistry()
    exporter = NvmlExporter(registry=registry, interval_s=args.interval_s)
    try:
        server = MetricsServer(args.host, args.port, registry)
    except OSError as exc:
        print(f"exporter: error: {bind_error(exc, args.host, args.port)}", file=sys.stderr)
        return 2
    exporter.start()
    print(f"exporter: serving {server.url} (NVML read every {args.interval_s:g} s)", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(3600):
            pass
    except KeyboardInterrupt:
        pass
    server.close()
    exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
