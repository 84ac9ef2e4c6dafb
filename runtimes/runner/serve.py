"""`run.py serve`: a small HTTP inference endpoint, standard library only. This module opens and
warms the sessions, listens, and stops on a signal; serve_http.py answers the requests."""

import errno
import os
import signal
import sys
import threading
import time

try:  # checked in cli.run_command, which says how to install it (its import error alone does not)
    import numpy as np
except ImportError:
    np = None

from .closing import MAX_BODY, MAX_CONNECTIONS, MAX_PER_CLIENT, QUEUE_WAIT_S, REJECTERS, Gate
from .contents import optional_module, wants_pipeline
from .errors import BundleError, one_line
from .manifest import load_golden, require_intact, select_parts
from .sessions import open_session


class Serving(object):
    """What one `run.py serve` holds for its requests: the parts' warmed sessions, the pipeline
    (when /infer runs the parts as one cascade), the metadata it answers and the limits."""

    def __init__(self, manifest, args, sessions, cascade):
        parts = [part for part, _, _ in sessions.values()]
        self.manifest, self.args, self.sessions, self.cascade = manifest, args, sessions, cascade
        self.default = parts[0]["name"] if len(parts) == 1 else None
        self.metadata = {
            "bundle": manifest.get("name"), "target": manifest.get("target", {}),
            "pipeline": manifest.get("pipeline"),
            "parts": [{"name": p["name"], "inputs": p["inputs"], "outputs": p["outputs"],
                       "preprocess": p.get("preprocess"), "labels": p.get("labels"),
                       "task": p.get("task") or {"kind": "raw"},
                       "precision": p.get("precision", {}).get("description")}
                      for p in parts]}
        self.slots = threading.BoundedSemaphore(args.max_concurrent)
        self.rejecters = threading.BoundedSemaphore(REJECTERS)
        self.max_pixels = args.max_megapixels * 1e6
        # bodies are read before a slot is taken: the bytes held at once keep the bound that
        # taking the slot first gave (--max-concurrent bodies of MAX_BODY)
        self.gate = Gate(args.max_connections, args.max_per_client,
                         args.max_concurrent * MAX_BODY)


def warm_sessions(bundle, manifest, args):
    """{part name: (part, session, output names)} for the parts served, each run twice on its
    golden inputs before listening: the first run allocates and picks kernels (454 ms on an
    H100, measured for issue 12)."""
    sessions = {}
    for part in select_parts(manifest, args.part):
        session, _ = open_session(bundle, manifest, part, args)
        names = [o.name for o in session.get_outputs()]
        inputs, _ = load_golden(bundle, part)
        start = time.perf_counter()
        for _ in range(2):
            session.run(names, {k: np.asarray(v[0]) for k, v in inputs.items()})
        sys.stderr.write("edgepack: %s warmed up (%.0f ms for its first 2 runs)\n" % (
            part["name"], (time.perf_counter() - start) * 1000.0))
        sessions[part["name"]] = (part, session, names)
    return sessions


def listen(serving):
    """The Server on --host:--port, or a BundleError saying why it cannot listen there."""
    from .serve_http import Handler, Server  # http.server: only when serving

    args = serving.args
    try:
        server = Server((args.host, args.port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise BundleError("%s:%d is in use (%s); pass another --port, or --port 0 for a free "
                              "one" % (args.host, args.port, exc.strerror)) from None
        raise BundleError("cannot listen on %s:%d (%s); check --host and --port"
                          % (args.host, args.port, exc.strerror or one_line(exc))) from None
    server.serving = serving
    return server


def cmd_serve(bundle, manifest, args):
    """A small HTTP endpoint (stdlib only). Bad requests get a 4xx; the server keeps running."""
    require_intact(bundle, manifest)
    sessions = warm_sessions(bundle, manifest, args)
    # POST /infer of a pipeline bundle runs its parts as one cascade (?raw=1, /infer/<part>: one)
    cascade = optional_module("cascade").served_cascade(manifest, sessions) \
        if wants_pipeline(manifest, args) else None
    serving = Serving(manifest, args, sessions, cascade)
    server = listen(serving)
    gate = serving.gate
    host, port = server.server_address[:2]

    def stop(signum, frame):
        if gate.stopping is None:   # serve_forever returns once shutdown() is called elsewhere
            gate.stopping = {signal.SIGTERM: "SIGTERM"}.get(signum, "SIGHUP")
            threading.Thread(target=server.shutdown, daemon=True).start()

    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), stop)
    sys.stderr.write("edgepack: serving %s on http://%s:%d (POST /infer, GET /health, "
                     "GET /metadata)\n" % (manifest.get("name"), host, port))
    sys.stderr.flush()
    try:
        server.serve_forever()
    finally:   # Ctrl-C: stop listening, then exit 130 (run_command)
        server.server_close()
    # SIGTERM or SIGHUP: no new connections; the requests in flight are answered
    left = gate.drain(args.timeout)
    sys.stderr.write("edgepack: %s: stopped serving %s; %s\n" % (
        gate.stopping, manifest.get("name"), "every request in flight was answered" if not left
        else "%d request(s) still unanswered after --timeout %g s" % (left, args.timeout)))
    return None


def add_options(p):
    """`run.py serve`'s own options on its parser *p*."""
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0 for the network)")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--quiet", action="store_true", help="do not log requests")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a client may stay silent while sending its request "
                        "(then 408 and the connection closes; default 30)")
    p.add_argument("--max-concurrent", type=int, default=max(4, 2 * (os.cpu_count() or 1)),
                   help="requests run at once, once read whole; one more waits %g s, "
                        "then gets 503 with Retry-After (default 2 x cores, at least 4: "
                        "%%(default)d here)" % QUEUE_WAIT_S)
    p.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                   help="open connections in all; one more gets 503 at once "
                        "(default %(default)d)")
    p.add_argument("--max-per-client", type=int, default=MAX_PER_CLIENT,
                   help="open connections from one client address; one more gets 503 "
                        "at once (default %(default)d)")


def options_problem(args):
    """What is wrong with serve's own options (argparse's error line), or ''."""
    if not 0 <= args.port <= 65535:
        return "--port must be from 0 to 65535 (0 picks a free one), got %d" % args.port
    if not 0 < args.timeout <= 3600:
        return "--timeout must be > 0 and at most 3600 seconds"
    if not (1 <= args.max_concurrent <= 1024 and 1 <= args.max_per_client <= 100000 and
            1 <= args.max_connections <= 100000):
        return ("--max-concurrent must be from 1 to 1024, --max-connections and "
                "--max-per-client from 1 to 100000")
    return ""
