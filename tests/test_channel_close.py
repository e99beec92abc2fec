"""Only the thread that reads a socket closes it (caller/channel.py, server/main.py Dispatcher).

The failure this pins: an evaluator's reader thread took its socket's descriptor number, another
thread closed the socket (the evaluator closed), the next evaluator's socketpair took the same
number, and the old reader then read the new server's bytes: the new channel's frames came
apart ('the harness server died' half a second into a job; CI, tests/test_daemon.py) or a reply
was lost (a job abandoned for want of its nonce, the caller waiting out its whole deadline). A
warm evaluation followed by a private one, in a loop beside two busy loops on the 2-core machine,
went wrong 9 times in 55 before the fix (8 harness errors, one reply never heard) and 0 in 100
after."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection

import pytest

from kernelagent.harness import Evaluator, protocol
from kernelagent.harness.caller import channel


def _stalled_reader(monkeypatch) -> tuple[threading.Event, threading.Event, list]:
    """protocol.recv as Connection._recv does it, stopped between taking the descriptor's number
    and reading it (where the interpreter may switch threads for as long as it likes)."""
    taken, go, read = threading.Event(), threading.Event(), []

    def recv(conn, accept, **_kwargs):
        handle = conn.fileno()
        taken.set()
        go.wait(10)
        try:
            data = os.read(handle, 4)
        except OSError as exc:
            read.append(exc)
            raise
        read.append(data)
        if not data:
            raise EOFError
        raise protocol.ProtocolError("not a frame")

    monkeypatch.setattr(protocol, "recv", recv)
    return taken, go, read


def _end_warm(ev: Evaluator) -> None:
    ev._daemon = object()  # a warm harness's client: close() ends the connection only
    ev.close()


# Every way an evaluator ends its connection: a hang-up, a warm harness's client closing, a
# private server killed (hung, or broke the protocol).
ENDINGS = {
    "hang_up": lambda ev: ev.hang_up(ev._conn),
    "close_warm_client": _end_warm,
    "kill_private_server": lambda ev: ev._kill_server(),
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_connection_is_closed_by_its_reader_never_under_it(monkeypatch, ending):
    taken, go, read = _stalled_reader(monkeypatch)
    ev = Evaluator(device="cpu")
    ours, server = socket.socketpair()
    conn = Connection(ours.detach())
    number = conn.fileno()
    ev._conn = conn
    ev.start_reader(conn)
    assert taken.wait(10)
    hanging_up = threading.Thread(target=ENDINGS[ending], args=(ev,))
    hanging_up.start()
    time.sleep(0.3)  # the hang-up has shut the socket down by now (and, before the fix, closed it)
    # the next evaluator's channel, opened now: it must not get the old reader's number
    new_ours, new_server = socket.socketpair()
    try:
        assert number not in (new_ours.fileno(), new_server.fileno())
        frame = b'{"v": 2, "type": "hello", "job": "-"}'
        new_server.sendall(struct.pack("!i", len(frame)) + frame)
        go.set()
        hanging_up.join(10)
        ev._reader.join(10)
        assert not ev._reader.is_alive() and not hanging_up.is_alive()
        assert read == [b""]  # the old socket's end, nothing of the new one's
        assert conn.closed  # closed, and by its reader
        new_ours.settimeout(5)
        got = b""
        while len(got) < 4 + len(frame):
            got += new_ours.recv(4096)
        assert got == struct.pack("!i", len(frame)) + frame  # every byte reached its own reader
    finally:
        go.set()
        for s in (new_ours, new_server, server):
            s.close()


def test_a_connection_no_reader_reads_is_closed_by_the_hang_up():
    ev = Evaluator(device="cpu")
    ours, server = socket.socketpair()
    conn = Connection(ours.detach())
    try:
        ev.hang_up(conn)  # its greeting failed: no reader was started for it
        assert conn.closed
        server.settimeout(5)
        assert server.recv(10) == b""  # the server hears the end
    finally:
        server.close()


def test_shut_down_wakes_a_blocked_reader_and_leaves_the_descriptor_open():
    ours, server = socket.socketpair()
    conn = Connection(ours.detach())
    heard = []
    reader = threading.Thread(target=lambda: heard.append(os.read(conn.fileno(), 4)))
    reader.start()
    time.sleep(0.1)
    channel.shut_down(conn)
    reader.join(5)
    try:
        assert heard == [b""] and not conn.closed
        os.fstat(conn.fileno())  # still this process's descriptor, until its reader closes it
    finally:
        conn.close()
        server.close()


def test_a_warm_harness_client_is_closed_only_between_two_sends(tmp_path):
    """Server side: a job thread still answering a client that left holds the send lock for its
    whole frame, and the close waits for it; a send after the close raises, writing nothing."""
    from kernelagent.harness.server.main import Dispatcher

    ours, client = socket.socketpair()
    dispatcher = Dispatcher(Connection(ours.detach()), tmp_path, {}, {}, 1)
    closed = threading.Event()
    with dispatcher._send_lock:  # a send in progress
        closer = threading.Thread(target=lambda: (dispatcher.close(), closed.set()))
        closer.start()
        assert not closed.wait(0.3)
    assert closed.wait(5)
    with pytest.raises(OSError):
        dispatcher.send("result", "job", "-", result={})
    client.settimeout(5)
    assert client.recv(10) == b""
    client.close()


def test_a_trace_channel_s_read_end_is_closed_by_its_reader(monkeypatch):
    """The same rule for the kernel trace's pipe (trace/channel.py): a job that ends (collect) or
    never forked (close) with its reader running leaves the read end to the reader, so a later
    job's pipe never gets the number while the old reader still reads it."""
    from kernelagent.harness.trace import channel as trace_channel

    real, closed_by = trace_channel._close, {}

    def close(fd):
        closed_by.setdefault(fd, threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(trace_channel, "_close", close)
    for end in ("close", "collect"):
        closed_by.clear()
        pipe = trace_channel.open_channel()
        read_end, write_end = pipe.read_fd, pipe.write_fd
        pipe.start()
        if end == "close":
            pipe.close()
        else:
            os.write(write_end, b"x" * 10)
            assert pipe.collect(drain_s=0.2).data == b"x" * 10
        pipe._thread.join(5)
        assert closed_by.get(read_end) == "kernelagent-trace-reader", (end, closed_by)
        assert closed_by.get(write_end) == threading.current_thread().name
        assert pipe.read_fd == -1 and pipe.write_fd == -1


@pytest.mark.parametrize("server_does, says", [
    ("garbage", "a message of the harness server could not be read (ProtocolError"),
    ("hangs_up", "the harness server died"),
])
def test_a_reply_that_cannot_be_read_is_told_from_a_server_that_died(server_does, says):
    """The reader tells the waiting job why the channel ended: a frame that came apart is not a
    server that died (the reason said 'died' for both, and the server's log had no last words)."""
    ev = Evaluator(device="cpu")
    ours, server = socket.socketpair()
    ev._conn = Connection(ours.detach())
    ev.start_reader(ev._conn)
    theirs = Connection(server.detach())
    replies = []
    sender = threading.Thread(target=lambda: replies.append(ev._round_trip({"problem_source": "x"}, 30.0)))
    sender.start()
    request = json.loads(theirs.recv_bytes())  # the job's request, as sent
    if server_does == "garbage":
        theirs.send_bytes(b'{"v": 2, "type": "started", "job": "' + request["job"].encode())  # cut short
    theirs.close()
    sender.join(30)
    ev._reader.join(5)
    assert len(replies) == 1 and replies[0]["error"].startswith(says), replies
    assert ev._conn is None or ev._conn.closed
