"""`run.py serve`'s HTTP side, standard library only: the request handler, its deadline for a
whole request, and the threaded server (the limits they keep are closing.py's). Both read what
`serve.cmd_serve` opened from the server's `serving` (a Serving). Imported only by serve."""

import io
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .closing import (
    BODY_RATE,
    MAX_BODY,
    QUEUE_WAIT_S,
    REJECT_WAIT_S,
    answer_and_close,
    busy_answer,
    drain,
    reject,
)
from .contents import optional_module
from .errors import BundleError, one_line
from .infer import answer
from .inputs import image_batch, image_row, stack_images
from .report import to_json
from .serve_body import decode_body, is_image_body, json_limit

GET_PATHS = ("/health", "/metadata")
USAGE = "use POST /infer, GET /health, GET /metadata"


def allowed_method(path):
    """The one method *path* answers to (its Allow header), or None: no such path."""
    if path in GET_PATHS:
        return "GET"
    if path == "/infer" or path.startswith("/infer/"):
        return "POST"
    return None


class DeadlineReader(io.RawIOBase):
    """A socket read against the handler's deadline for the whole request: a client that
    drips its headers or body a byte at a time still runs out of time (a per-recv timeout
    alone never would)."""

    def __init__(self, sock, handler):
        io.RawIOBase.__init__(self)
        self.sock, self.handler = sock, handler

    def readable(self):
        return True

    def readinto(self, buffer):
        import socket

        left = self.handler.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class Handler(BaseHTTPRequestHandler):
    server_version = "edgepack-run"
    deadline = 0.0           # for the request being read: its headers, then its body

    def setup(self):
        self.serving = self.server.serving   # what cmd_serve opened and the limits
        self.timeout = self.serving.args.timeout   # on the socket: a stalled client lets go
        BaseHTTPRequestHandler.setup(self)
        self.rfile.close()   # its socket stays open: the reader below takes its place
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self))

    def handle_one_request(self):
        # the request line and headers within --timeout of the connection going idle
        # (an idle keep-alive connection is closed then too)
        self.started = time.monotonic()
        self.deadline = self.started + self.serving.args.timeout
        if self.serving.gate.stopping:
            self.close_connection = True
            return
        BaseHTTPRequestHandler.handle_one_request(self)

    def log_message(self, fmt, *values):
        if not self.serving.args.quiet:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % values))

    def reply(self, code, obj, headers=()):
        kind = "application/json"
        if isinstance(obj, bytes):   # speech: a WAV file, its type among *headers*
            kind = dict(headers).get("Content-Type", "application/octet-stream")
            body, headers = obj, [h for h in headers if h[0] != "Content-Type"]
        else:
            body = to_json(obj).encode("utf-8")   # NaN, infinity: null, and said
        self.connection.settimeout(self.serving.args.timeout)   # a client that does not read: bounded
        if self.serving.gate.stopping or self.serving.gate.crowded(self.client_address[0]):
            # stopping, or half the connections (in all or this client's) are open: no
            # keep-alive, so idle connections do not hold the places a burst needs
            self.close_connection = True
            if ("Connection", "close") not in headers:
                headers = list(headers) + [("Connection", "close")]
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def parse_request(self):
        try:
            return BaseHTTPRequestHandler.parse_request(self)
        except socket.timeout:   # headers begun, never finished (http.server just hangs up)
            self.close_connection = True
            self.reply(408, {"error": "the headers did not arrive in time (--timeout %g s)"
                                      % self.serving.args.timeout})
            return False

    def __getattr__(self, name):   # PUT, DELETE, BREW...: 405 where http.server says 501
        if name.startswith("do_"):
            return self.not_allowed
        raise AttributeError(name)

    def not_allowed(self):
        url = self.target()
        if url is not None:
            self.no_such(url[0])

    def no_such(self, path):
        """404 for a path serve does not have; 405 with its Allow header for one it has,
        asked with another method. A body sent with it is not read: the connection closes
        after the answer (the server reads what the client still sends, then closes)."""
        headers = []
        if self.headers.get("Transfer-Encoding") or \
                self.headers.get("Content-Length", "0").strip() not in ("", "0"):
            headers.append(("Connection", "close"))
        allow = allowed_method(path)
        if allow is None:
            return self.reply(404, {"error": "no such path %s: %s" % (path[:200], USAGE)},
                              headers)
        return self.reply(405, {"error": "method %s not allowed on %s: use %s %s" % (
            self.command[:20], path[:200], allow, path[:200])}, headers + [("Allow", allow)])

    def target(self):
        """(path, query) of the request, or None after a 400."""
        try:
            url = urlsplit(self.path)
        except ValueError:
            self.reply(400, {"error": "cannot parse the request target %r" % self.path[:100]})
            return None
        return url.path, url.query

    def do_GET(self):
        url = self.target()
        if url is None:
            return
        path = url[0]
        if path == "/health":
            self.reply(200, {"status": "ok", "bundle": self.serving.manifest.get("name"),
                             "providers": dict((n, s.get_providers())
                                               for n, (_, s, _) in self.serving.sessions.items())})
        elif path == "/metadata":
            self.reply(200, self.serving.metadata)
        else:
            self.no_such(path)

    def do_POST(self):
        try:
            self.infer()
        except (ConnectionError, socket.timeout):   # the client left or stalled mid-reply
            self.close_connection = True

    def infer(self):
        url = self.target()
        if url is None:
            return
        path, query = url
        if allowed_method(path) != "POST":
            return self.no_such(path)
        name = path[len("/infer/"):] or parse_qs(query).get("part", [self.serving.default])[0]
        self.raw = self.serving.args.raw or parse_qs(query).get("raw", [""])[0] in ("1", "true")  # tensors
        # ?stream=1 on a tts pipeline: the WAV leaves in chunks as the vocoder makes them
        self.streamed = parse_qs(query).get("stream", [""])[0] in ("1", "true")
        cascade, sessions = self.serving.cascade, self.serving.sessions
        piped = name is None and cascade is not None and not self.raw
        if name is None and not piped:
            return self.reply(400, {"error": "this bundle holds several models (%s); "
                                             "POST /infer/<part>" % ", ".join(sessions)})
        if not piped and name not in sessions:
            return self.reply(404, {"error": "no part named %s (parts: %s)"
                                             % (name[:200], ", ".join(sessions))})
        length = self.content_length()
        if length is None:
            return None
        entry = cascade if piped else sessions[name]
        part = entry[0]
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype == "application/json" and length > json_limit(part):
            self.close_connection = True   # its body is not read
            return self.reply(413, {"error": "the JSON body is %d bytes, over the %d this "
                                             "model's inputs can take; send its inputs "
                                             "only, or send them as .npy/.npz"
                                             % (length, json_limit(part))})
        # the whole request by --timeout plus a second per MB of body
        self.deadline = self.started + self.serving.args.timeout + length / BODY_RATE
        self.serving.gate.begin()
        try:
            self.answer(entry, length)
        finally:
            self.serving.gate.end()

    def answer(self, entry, length):
        """Read the body, then run it in one of --max-concurrent slots: a slow client
        holds its connection only, never a slot."""
        held = []
        try:
            body = self.read_body(length, held)
        except MemoryError:   # the budget of bodies in memory: the client may retry
            self.close_connection = True
            self.serving.gate.give(sum(held))
            return self.reply(503, {"error": "busy: %d MB of request bodies are being read; "
                                             "retry shortly" % (self.serving.gate.budget // 2 ** 20)},
                              [("Retry-After", "1")])
        except socket.timeout:
            self.serving.gate.give(sum(held))
            self.close_connection = True
            return self.reply(408, {"error": "the body did not arrive in time (--timeout "
                                             "%g s for the request, plus 1 s a MB of body); "
                                             "send it whole" % self.serving.args.timeout})
        try:
            if len(body) < length:
                self.close_connection = True
                return self.reply(400, {"error": "the body ended after %d of the %d bytes "
                                                 "its Content-Length declares"
                                                 % (len(body), length)})
            if not self.serving.slots.acquire(timeout=QUEUE_WAIT_S):
                return self.reply(503, {"error": "busy: %d requests are running "
                                                 "(--max-concurrent); retry shortly"
                                                 % self.serving.args.max_concurrent},
                                  [("Retry-After", "1")])
            try:
                if self.streamed and entry[2] is None and \
                        getattr(entry[1], "speech", None) is not None:
                    return self.stream_speech(entry[1], body)
                code, answer = self.run_part(entry, body)
            finally:
                self.serving.slots.release()
            del body
        finally:
            self.serving.gate.give(sum(held))
        if isinstance(answer, dict) and "_wav" in answer:   # speech, as audio/wav
            return self.reply(code, answer["_wav"], [
                ("Content-Type", "audio/wav"), ("X-Edgepack-Summary", answer["summary"]),
                ("X-Edgepack-Stages-Ms", to_json(answer["stages_ms"]).strip())])
        self.reply(code, answer)

    def stream_speech(self, served, body):
        """A tts pipeline's answer as a streamed audio/wav: the header (lengths unknown,
        0xFFFFFFFF) at once, then each piece of 16-bit PCM as the vocoder makes it, the
        connection closed at its end (HTTP/1.0: no length, no chunks). The first piece is made
        before the status is sent, so a bad sentence is still a JSON error."""
        tts = optional_module("task_tts")
        try:
            pieces, rate = served.stream(body)
            piece = next(pieces, None)
        except BundleError as exc:
            return self.reply(exc.status, {"error": str(exc)})
        self.close_connection = True
        self.connection.settimeout(self.serving.args.timeout)
        self.send_response(200)
        for key, value in (("Content-Type", "audio/wav"), ("X-Edgepack-Stream", "1"),
                           ("Connection", "close")):
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return None
        self.wfile.write(tts.wav_stream_header(rate))
        while piece is not None:
            self.wfile.write(tts.pcm16(piece))
            self.wfile.flush()
            try:
                piece = next(pieces, None)
            except BundleError:   # the status is sent: the stream ends short
                piece = None
        return None

    def content_length(self):
        """The declared body length, or None after a 4xx."""
        values = self.headers.get_all("Content-Length") or []
        if not values:
            if self.headers.get("Transfer-Encoding"):
                self.reply(411, {"error": "send a Content-Length (chunked bodies are not "
                                          "read)"})
                return None
            return 0
        value = values[0].strip()
        if len(set(v.strip() for v in values)) > 1 or not re.match(r"[0-9]+\Z", value):
            self.reply(400, {"error": "Content-Length %r is not one byte count; send the "
                                      "body's length in bytes" % ", ".join(values)[:60]})
            return None
        if len(value) > 12 or int(value) > MAX_BODY:
            self.reply(413, {"error": "body of %s bytes is over the %d MB limit"
                                      % (value[:20], MAX_BODY // 2 ** 20)})
            return None
        return int(value)

    def read_body(self, length, held):
        """The body, by the request's deadline (the reader raises socket.timeout), its
        bytes counted in *held* against the budget of bodies in memory (MemoryError)."""
        chunks, got = [], 0
        while got < length:
            chunk = self.rfile.read1(min(length - got, 1 << 20))
            if not chunk:
                break
            if not self.serving.gate.take(len(chunk)):
                raise MemoryError("bodies over the budget")
            held.append(len(chunk))
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def run_part(self, entry, body):
        """(status, answer) for one request's *body* to the part in *entry*."""
        part, session, names = entry
        if names is None:   # the pipeline: (its pseudo part, the Cascade, None)
            code, result = session.serve(body, self.serving.max_pixels)
            audio = result.pop("_audio", None)   # a tts pipeline's speech: audio/wav
            if audio is not None and not wants_json(self.headers.get("Accept", "")):
                result["_wav"] = optional_module("task_tts").wav_bytes(audio, result["rate"])
            return code, result
        stages = {}

        def clock(stage, call, *args):
            start = time.perf_counter()
            value = call(*args)
            stages[stage] = stages.get(stage, 0.0) + (time.perf_counter() - start) * 1000.0
            return value

        try:
            ctype = self.headers.get("Content-Type", "")
            start = time.perf_counter()
            feed = decode_body(body, ctype, part, self.serving.max_pixels, clock)
            # an image's preprocess is timed apart (clock); the rest of reading it is decode
            stages.setdefault("preprocess", 0.0)
            stages["decode"] = max(0.0, (time.perf_counter() - start) * 1000.0
                                   - stages["preprocess"])
            # one image to a part with a static batch of N: N copies run, the first answered
            rows = image_batch(part) if is_image_body(body, ctype) else 1
            if rows > 1:
                outputs = image_row(clock("model", session.run, names,
                                          stack_images([feed], rows)), 0, rows)
            else:
                outputs = clock("model", session.run, names, feed)
            arrays = {}
            result = clock("post", lambda: answer(part, names, outputs, feed, self.raw,
                                                  self.serving.args.top, arrays, "r", body))
            result = dict(result, part=part["name"], latency_ms=stages["model"],
                          stages_ms=stages)
            if "r/task.audio" in arrays and not wants_json(self.headers.get("Accept", "")):
                rate = optional_module("task_spec").settings(part["task"])["rate"]
                result["_wav"] = optional_module("task_tts").wav_bytes(arrays["r/task.audio"],
                                                                      rate)
            return 200, result
        except BundleError as exc:
            return exc.status, {"error": str(exc)}
        except Exception as exc:
            # names, shapes and dtypes are checked: what onnxruntime still calls an invalid
            # argument (a token id past the vocabulary) is the input's fault, the rest ours
            code = 400 if type(exc).__name__ == "InvalidArgument" else 500
            return code, {"error": "%s: %s" % (type(exc).__name__, str(exc)[:500])}


def wants_json(accept):
    """Whether an Accept header prefers JSON to the WAV of speech: media types compared without
    case, each by its q weight (a type not named weighs 0; */* and audio/* name the WAV)."""
    weights = {}
    for item in accept.split(","):
        fields = [f.strip().lower() for f in item.split(";")]
        q = 1.0
        for field in fields[1:]:
            if field.startswith("q="):
                try:
                    q = float(field[2:])
                except ValueError:
                    q = 0.0
        weights[fields[0]] = max(q, weights.get(fields[0], 0.0))
    wav = max(weights.get(k, 0.0) for k in ("audio/wav", "audio/x-wav", "audio/*", "*/*"))
    return weights.get("application/json", 0.0) > max(wav, 0.0)


class Server(ThreadingHTTPServer):
    request_queue_size = 1024  # a burst of clients waits in the kernel, not reset (was 5)
    daemon_threads = True

    def process_request(self, request, client_address):
        if self.serving.gate.admit(client_address[0], wait=QUEUE_WAIT_S):
            try:
                ThreadingHTTPServer.process_request(self, request, client_address)
            except BaseException:
                self.serving.gate.leave(client_address[0])
                raise
            return
        why = ("%d connections are open (--max-connections)" % self.serving.gate.total
               if self.serving.gate.open >= self.serving.gate.total else "%d connections from %s are open "
               "(--max-per-client)" % (self.serving.gate.per_client, client_address[0]))
        if not self.serving.rejecters.acquire(timeout=REJECT_WAIT_S):   # a flood: answered here,
            answer_and_close(request, busy_answer(why), 0.2)   # briefly, one at a time
            return
        threading.Thread(target=reject, args=(request, busy_answer(why), self.serving.rejecters),
                         daemon=True).start()

    def shutdown_request(self, request):
        """Close after reading what the client still sends (at most 1 s)."""
        drain(request, 1.0)
        self.close_request(request)

    def process_request_thread(self, request, client_address):
        try:
            ThreadingHTTPServer.process_request_thread(self, request, client_address)
        finally:
            self.serving.gate.leave(client_address[0])

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, socket.timeout)):   # a client that left
            sys.stderr.write("edgepack: a request from %s failed: %s: %s\n"
                             % (client_address[0], type(exc).__name__, one_line(exc)))
