"""Connections `serve` will not answer in full, closed gracefully: a 503 for one over a cap,
and the half-close that lets a client read its answer before the socket goes."""

import time

from .report import to_json


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
