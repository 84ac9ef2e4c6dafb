"""`serve`'s limits, light enough for run.py's argument defaults (no http.server): connections
counted per client and in all, bodies in memory, requests in flight (Gate); and connections it
will not answer in full, closed gracefully: a 503 for one over a cap, and the half-close that
lets a client read its answer before the socket goes."""

import time

from .report import to_json

MAX_BODY = 64 * 1024 * 1024
QUEUE_WAIT_S = 2.0   # a request over --max-concurrent waits this long, then gets a 503
BODY_RATE = 1e6      # bytes/s a body must keep up after the first --timeout seconds
# Open connections, in all and per client address: drip-fed connections cannot use up the
# process's file descriptors (1024 is a common limit) or every thread; one more gets a 503.
MAX_CONNECTIONS = 256
MAX_PER_CLIENT = 64
REJECTERS = 64       # threads that answer 503 to connections over a cap; one more waits
REJECT_WAIT_S = 1.0  # that long for one of them, then gets its 503 from the accept loop


def busy_answer(why):
    body = to_json({"error": "busy: %s; retry shortly" % why}).encode("utf-8")
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
            % len(body)) + body


def reject(sock, answer, done):
    """Answer a connection over a cap with *answer* and close it, reading what it sent first
    (closing a socket with unread bytes resets it, and the client would never see the 503)."""

    try:
        answer_and_close(sock, answer, 2.0)
    finally:
        done.release()


def answer_and_close(sock, answer, seconds):
    """Send *answer* on a connection we will not serve, then close it gracefully (what the
    client sent first is read for at most 0.5 s)."""
    import socket

    try:
        sock.settimeout(min(seconds, 0.5))
        try:
            sock.recv(1 << 16)
        except socket.timeout:
            pass
        sock.sendall(answer)
    except OSError:
        pass
    drain(sock, seconds)
    sock.close()


def drain(sock, seconds):
    """Half-close *sock* and read what the client still sends (at most *seconds*, 8 MB):
    closing with unread bytes resets the connection, and the client would lose its answer."""
    import socket

    try:
        sock.shutdown(socket.SHUT_WR)
        deadline, got = time.monotonic() + seconds, 0
        while got < (8 << 20) and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = sock.recv(1 << 16)
            if not data:
                break
            got += len(data)
    except OSError:
        pass


class Gate(object):
    """Open connections counted per client address, and requests in flight (read, running or
    being answered), which a graceful stop waits for."""

    def __init__(self, total, per_client, budget):
        import threading

        self.total, self.per_client, self.budget = total, per_client, budget
        self.open, self.by_client, self.in_flight, self.buffered = 0, {}, 0, 0
        self.changed = threading.Condition()
        self.stopping = None   # the signal's name, once one asks the server to stop

    def admit(self, client, wait=0.0):
        """Count a new connection from *client*; False over a cap. Over --max-connections
        alone it waits up to *wait* seconds for a place (a burst of clients, not one client
        holding many: that one is refused at once, so it cannot hold up everyone's accept)."""
        deadline = time.monotonic() + wait
        with self.changed:
            while (self.open >= self.total and self.by_client.get(client, 0) < self.per_client
                   and time.monotonic() < deadline and not self.stopping):
                self.changed.wait(max(0.01, deadline - time.monotonic()))
            if self.open >= self.total or self.by_client.get(client, 0) >= self.per_client:
                return False
            self.open += 1
            self.by_client[client] = self.by_client.get(client, 0) + 1
            return True

    def crowded(self, client):
        """Half the connections are open, in all or from *client*."""
        with self.changed:
            return (2 * self.open >= self.total
                    or 2 * self.by_client.get(client, 0) >= self.per_client)

    def leave(self, client):
        with self.changed:
            self.open -= 1
            self.by_client[client] -= 1
            if not self.by_client[client]:
                del self.by_client[client]
            self.changed.notify_all()

    def take(self, count):
        """Count *count* more bytes of bodies held in memory; False when over the budget."""
        with self.changed:
            if self.buffered + count > self.budget:
                return False
            self.buffered += count
            return True

    def give(self, count):
        with self.changed:
            self.buffered -= count

    def begin(self):
        with self.changed:
            self.in_flight += 1

    def end(self):
        with self.changed:
            self.in_flight -= 1
            self.changed.notify_all()

    def drain(self, seconds):
        """Wait up to *seconds* for the requests in flight; how many are left."""
        deadline = time.monotonic() + seconds
        with self.changed:
            while self.in_flight and time.monotonic() < deadline:
                self.changed.wait(max(0.01, deadline - time.monotonic()))
            return self.in_flight
