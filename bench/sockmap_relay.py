"""An eBPF sockmap relay for the egress proxy's tunnels, checked and measured (issue 13, item 5).

Not part of corral: it was measured and not adopted (docs/egress.md, "A
kernel redirect instead of a relay"). This script keeps the experiment
reproducible. Root only (it loads a BPF program)::

    .venv/bin/python bench/sockmap_relay.py check          # bytes, order, half-close, reset, counters
    .venv/bin/python bench/sockmap_relay.py measure -n 9   # direct / Python relay / sockmap, per size

How it works. Once a tunnel is decided, both sockets go into a
``BPF_MAP_TYPE_SOCKHASH`` keyed by socket cookie, whose ``BPF_SK_SKB_VERDICT``
program (18 instructions, assembled below, loaded with raw ``bpf(2)``
through ctypes) looks up the peer's cookie in a ``BPF_MAP_TYPE_HASH`` and
calls ``bpf_sk_redirect_hash`` to the peer's egress. A miss, or a peer not
in the map, returns ``SK_PASS`` without a redirect: the bytes stay in their
own socket, never dropped.

The hand-over: user space has read each socket until ``EAGAIN`` (a partly
read skb would be redirected whole, its read bytes sent twice) and
forwarded it; both sockets get a receive low-water mark as high as the
kernel allows (arriving bytes stay queued and run no verdict while the
entries go in), then the entries go in, then the mark goes back to 1, which
signals "data ready" and runs the verdict over everything queued, in order.
A FIN does not cross a redirect (the kernel's try leaves EPIPE on the
destination, ignored): user space watches both sockets (EPOLLRDHUP), and
when a side has ended and every byte it received is queued on the other
socket (``tcpi_bytes_received`` against ``tcpi_bytes_acked`` +
``SIOCOUTQ``), it half-closes the other socket itself; any other error on
either ends both. The same counters give the bytes moved.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import os
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time

from corral.egress._relay import Counter, relay

_SYS_BPF = 321  # x86-64
_MAP_CREATE, _MAP_UPDATE, _MAP_DELETE, _MAP_GET_NEXT_KEY, _PROG_LOAD, _PROG_ATTACH = (
    0,
    2,
    3,
    4,
    5,
    8,
)
_MAP_HASH, _MAP_SOCKHASH, _PROG_SK_SKB, _ATTACH_SK_SKB_VERDICT = 1, 18, 14, 38
_FN_LOOKUP, _FN_SOCKET_COOKIE, _FN_SK_REDIRECT_HASH = 1, 46, 72
_SO_COOKIE, _SIOCINQ, _SIOCOUTQ = 57, 0x541B, 0x5411
_LOWAT_MAX = 1 << 30
_SNDBUF = 8 << 20  # the kernel caps it (tcp_rmem[2] / 2)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, *fields: tuple[str, int]) -> int:
    attr = ctypes.create_string_buffer(b"".join(struct.pack("<" + f, v) for f, v in fields), 128)
    ret = int(_libc.syscall(_SYS_BPF, cmd, attr, len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _ld_map(reg: int, fd: int) -> bytes:  # BPF_LD_IMM64 with BPF_PSEUDO_MAP_FD: two slots
    return _insn(0x18, reg, 1, 0, fd) + _insn(0)


def _program(peers: int, sockets: int) -> bytes:
    mov, mov_k, add_k, stx, ldx, jeq_k, call, exit_ = 0xBF, 0xB7, 0x07, 0x7B, 0x79, 0x15, 0x85, 0x95
    return b"".join(
        [
            _insn(mov, 6, 1),  # r6 = skb
            _insn(call, imm=_FN_SOCKET_COOKIE),  # r0 = the receiving socket's cookie
            _insn(stx, 10, 0, -8),
            _ld_map(1, peers),
            _insn(mov, 2, 10),
            _insn(add_k, 2, imm=-8),
            _insn(call, imm=_FN_LOOKUP),  # r0 = &peers[cookie]
            _insn(jeq_k, 0, off=9, imm=0),  # no peer: pass
            _insn(ldx, 1, 0, 0),
            _insn(stx, 10, 1, -16),  # the peer's cookie
            _insn(mov, 1, 6),
            _ld_map(2, sockets),
            _insn(mov, 3, 10),
            _insn(add_k, 3, imm=-16),
            _insn(mov_k, 4),  # flags 0: the peer's egress
            _insn(call, imm=_FN_SK_REDIRECT_HASH),
            # SK_PASS: a redirect if one was set, else the bytes stay in their own socket
            _insn(mov_k, 0, imm=1),
            _insn(exit_),
        ]
    )


def _key(value: int) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(struct.pack("<Q", value), 8)


class Sockmap:
    """The two maps and the attached verdict program (one per process)."""

    def __init__(self) -> None:
        entries = 1 << 16
        self.peers = _bpf(_MAP_CREATE, ("I", _MAP_HASH), ("I", 8), ("I", 8), ("I", entries))
        self.sockets = _bpf(_MAP_CREATE, ("I", _MAP_SOCKHASH), ("I", 8), ("I", 4), ("I", entries))
        code = _program(self.peers, self.sockets)
        insns, lic = (
            ctypes.create_string_buffer(code, len(code)),
            ctypes.create_string_buffer(b"GPL"),
        )
        prog = _bpf(
            _PROG_LOAD,
            ("I", _PROG_SK_SKB),
            ("I", len(code) // 8),
            ("Q", ctypes.addressof(insns)),
            ("Q", ctypes.addressof(lic)),
        )
        _bpf(_PROG_ATTACH, ("I", self.sockets), ("I", prog), ("I", _ATTACH_SK_SKB_VERDICT))
        os.close(prog)  # the map holds it

    def _update(self, fd: int, key: int, value: bytes) -> None:
        k, v = _key(key), ctypes.create_string_buffer(value, len(value))
        _bpf(_MAP_UPDATE, ("I", fd), ("I", 0), ("Q", ctypes.addressof(k)),
             ("Q", ctypes.addressof(v)), ("Q", 0))  # fmt: skip

    def _delete(self, fd: int, key: int) -> None:
        k = _key(key)
        try:
            _bpf(_MAP_DELETE, ("I", fd), ("I", 0), ("Q", ctypes.addressof(k)))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def join(self, a: socket.socket, b: socket.socket) -> tuple[int, int]:
        """Redirect each socket's received bytes to the other's egress (see the module docstring).

        Raises OSError (EOPNOTSUPP) when a socket is not ESTABLISHED any more
        (its peer already sent FIN): then nothing changed, relay in user space.
        """
        ca, cb = cookie(a), cookie(b)
        for sock in (a, b):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, _LOWAT_MAX)
        try:
            self._update(self.peers, ca, struct.pack("<Q", cb))
            self._update(self.peers, cb, struct.pack("<Q", ca))
            self._update(self.sockets, ca, struct.pack("<I", a.fileno()))
            self._update(self.sockets, cb, struct.pack("<I", b.fileno()))
        except OSError:
            self.part(ca, cb)
            raise
        finally:
            for sock in (a, b):  # back to 1: runs the verdict over what is queued
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        return ca, cb

    def part(self, ca: int, cb: int) -> None:
        for key in (ca, cb):
            self._delete(self.sockets, key)
        for key in (ca, cb):
            self._delete(self.peers, key)

    def entries(self) -> int:
        """How many sockets the map holds (for the leak check)."""
        count, key, nxt = 0, None, _key(0)
        while True:
            k = ctypes.addressof(key) if key is not None else 0
            try:
                _bpf(
                    _MAP_GET_NEXT_KEY,
                    ("I", self.sockets),
                    ("I", 0),
                    ("Q", k),
                    ("Q", ctypes.addressof(nxt)),
                )
            except OSError:
                return count
            count += 1
            key = _key(struct.unpack("<Q", nxt.raw)[0])


def cookie(sock: socket.socket) -> int:
    return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, _SO_COOKIE, 8), "little")


def _ioctl(sock: socket.socket, request: int) -> int:
    out = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), request, out)
    return out[0]


def _tcp_info(sock: socket.socket) -> tuple[int, int]:
    """(tcpi_bytes_acked, tcpi_bytes_received)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    acked, received = struct.unpack_from("<QQ", raw, 120)
    return acked, received


def _consumed(sock: socket.socket) -> int:
    """Bytes user space has read from *sock* (received minus queued, read consistently)."""
    while True:
        before = _tcp_info(sock)[1]
        queued = _ioctl(sock, _SIOCINQ)
        if _tcp_info(sock)[1] == before:
            return before - queued


def _data_received(sock: socket.socket) -> int:
    """``tcpi_bytes_received`` without the FIN's one (FIN seen the same before and after)."""
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLRDHUP)
    while True:
        before = bool(poll.poll(0))
        received = _tcp_info(sock)[1]
        if bool(poll.poll(0)) == before:
            return received - before


def _queued(sock: socket.socket) -> int:
    """Bytes ever queued for sending on *sock*: acknowledged + still in the send queue (a lower bound)."""
    return _tcp_info(sock)[0] + _ioctl(sock, _SIOCOUTQ)


def _failed(sock: socket.socket, peer_ended: bool) -> bool:
    """An error on *sock*, except the EPIPE the kernel leaves on it when its peer's FIN was redirected.

    (Observed on 6.18: the FIN's empty skb is redirected too, its send fails,
    and the failure is reported on the destination socket; the bytes before
    it arrived, and the socket still works.)
    """
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # reading clears it
    return bool(err) and not (err == errno.EPIPE and peer_ended)


async def kernel_relay(sm: Sockmap, client: socket.socket, upstream: socket.socket,
                       counter: Counter) -> bool:  # fmt: skip
    """Move the tunnel's bytes in the kernel until both sides ended; False if it could not join."""
    loop = asyncio.get_running_loop()
    pairs = [(client, upstream), (upstream, client)]
    base_in = [_consumed(src) for src, _ in pairs]
    base_out = [_queued(dst) for _, dst in pairs]
    try:
        ca, cb = sm.join(client, upstream)
    except OSError:
        return False
    ep = select.epoll()
    watch = select.EPOLLRDHUP | select.EPOLLERR | select.EPOLLHUP
    for src, _ in pairs:
        ep.register(src.fileno(), watch)
    ended, done = [False, False], [False, False]
    wake = asyncio.Event()
    loop.add_reader(ep.fileno(), wake.set)
    try:
        while not all(done):
            for fd, events in ep.poll(0):
                i = 0 if fd == client.fileno() else 1
                if events & (select.EPOLLERR | select.EPOLLHUP) and _failed(
                    pairs[i][0], ended[1 - i]
                ):
                    return True  # a reset or error ends both
                if events & select.EPOLLRDHUP:
                    ended[i] = True
                    ep.unregister(fd)
            for i, (src, dst) in enumerate(pairs):
                if ended[i] and not done[i]:
                    if _failed(dst, True):
                        return True
                    moved = _tcp_info(src)[1] - 1 - base_in[i]  # FIN counts one
                    if _queued(dst) - base_out[i] >= moved:
                        dst.shutdown(socket.SHUT_WR)
                        done[i] = True
            if all(done):
                break
            if any(ended[i] and not done[i] for i in range(2)):
                await asyncio.sleep(0.001)  # draining: the peer's queue is the kernel's
            else:
                wake.clear()
                await wake.wait()
        return True
    finally:
        loop.remove_reader(ep.fileno())
        ep.close()
        counter.up += _data_received(client) - base_in[0]
        counter.down += _data_received(upstream) - base_in[1]
        sm.part(ca, cb)


# ---------------------------------------------------------------- a proxy to measure and check
async def _proxy(mode: str, listener: socket.socket, target: int, sm: Sockmap | None,
                 stats: dict[str, int]) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()

    async def handle(conn: socket.socket) -> None:
        up = socket.socket()
        for s in (conn, up):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        counter = Counter()
        try:
            await loop.sock_connect(up, ("127.0.0.1", target))
            # like a CONNECT: read the request line, forward it and what came with it, then switch
            head = b""
            while b"\n" not in head:
                chunk = await loop.sock_recv(conn, 1 << 16)
                if not chunk:
                    return
                head += chunk
            # consume every queued skb whole: a partly read skb is redirected whole (bytes twice)
            while True:
                try:
                    chunk = conn.recv(1 << 20)
                except BlockingIOError:
                    break
                head += chunk
                if not chunk:
                    break
            await loop.sock_sendall(up, head)
            counter.up += len(head)
            if mode == "sockmap+sndbuf":  # SO_SNDBUFFORCE: fewer "send queue full" retries
                for sock in (conn, up):
                    sock.setsockopt(socket.SOL_SOCKET, 32, _SNDBUF)
            if mode != "python" and sm is not None and await kernel_relay(sm, conn, up, counter):
                stats["kernel"] += 1
            else:
                stats["user"] += 1
                await relay(conn, up, counter)
        except OSError:
            pass
        finally:
            stats["up"] += counter.up
            stats["down"] += counter.down
            conn.close()
            up.close()

    tasks: set[asyncio.Future[None]] = set()
    while True:
        conn, _ = await loop.sock_accept(listener)
        task = asyncio.ensure_future(handle(conn))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


def _start_proxy(mode: str, target: int) -> tuple[int, int, int]:
    """Fork a proxy process; return (pid, port, stats pipe read end)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        sm = Sockmap() if mode != "python" else None
        stats = {"kernel": 0, "user": 0, "up": 0, "down": 0}

        def report(*_: object) -> None:
            os.write(wr, (repr(stats) + "\n").encode())
            if sm is not None:
                os.write(wr, (f"entries {sm.entries()}\n").encode())

        loop = asyncio.new_event_loop()
        loop.add_signal_handler(signal.SIGUSR1, report)
        loop.run_until_complete(_proxy(mode, listener, target, sm, stats))
        os._exit(0)
    os.close(wr)
    listener.close()
    return pid, port, rd


SERVER = r"""
import hashlib, os, socket, sys, threading
ls = socket.create_server(("127.0.0.1", 0)); print(ls.getsockname()[1], flush=True)
BLOCK = memoryview(hashlib.shake_256(b"corral").digest(1 << 20))
def send(c, n):
    while n > 0:
        n -= c.send(BLOCK[: min(n, len(BLOCK))])
def serve(c):
    line = b""
    while not line.endswith(b"\n"):
        line += c.recv(1)
    cmd, _, arg = line.strip().partition(b" ")
    if cmd == b"send":  # N bytes of the pattern, then FIN
        send(c, int(arg)); c.shutdown(socket.SHUT_WR); c.recv(1)
    elif cmd == b"sink":  # "ready", read to FIN, answer the SHA-256 and the count, then FIN
        c.sendall(b"ready\n")
        h, n, buf = hashlib.sha256(), 0, bytearray(1 << 20)
        while (k := c.recv_into(buf)):
            h.update(memoryview(buf)[:k]); n += k
        c.sendall(b"%s %d\n" % (h.hexdigest().encode(), n)); c.shutdown(socket.SHUT_WR)
    elif cmd == b"banner":  # speaks first, then echoes until FIN, then a trailer
        c.sendall(b"220 banner\n"); buf = bytearray(65536)
        while (k := c.recv_into(buf)):
            c.sendall(memoryview(buf)[:k])
        c.sendall(b"bye\n"); c.shutdown(socket.SHUT_WR)
    elif cmd == b"reset":  # a reset after some bytes
        c.sendall(b"x" * 1000)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    c.close()
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

CLIENT = r"""
import socket, sys, time
port, size = int(sys.argv[1]), int(sys.argv[2])
buf = bytearray(1 << 20)
start = time.perf_counter()
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"send %d\n" % size)
got = 0
while (n := s.recv_into(buf)):
    got += n
elapsed = time.perf_counter() - start
assert got == size, got
print(size / elapsed / 1e6)
"""


def _pattern(n: int) -> bytes:
    block = hashlib.shake_256(b"corral").digest(1 << 20)
    return (block * (n // len(block) + 1))[:n]


def _recv_all(s: socket.socket) -> bytes:
    out = bytearray()
    while chunk := s.recv(1 << 20):
        out += chunk
    return bytes(out)


def _case_send(port: int, size: int) -> tuple[int, int]:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"send %d\n" % size)
    got = _recv_all(s)
    s.close()
    assert got == _pattern(size), f"{len(got)} bytes, not the {size} sent"
    return len(b"send %d\n" % size), size


def _case_sink(port: int, size: int) -> tuple[int, int]:
    data = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(30)
    s.sendall(b"sink\n")
    assert s.recv(6) == b"ready\n"
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)  # half-close: the answer still comes back
    answer = _recv_all(s)
    s.close()
    want = b"%s %d\n" % (hashlib.sha256(data).hexdigest().encode(), size)
    assert answer == want, f"answer {answer[:80]!r}"
    return 5 + size, 6 + len(want)


def _case_banner(port: int, _: int) -> tuple[int, int]:
    """The server speaks first; the client pipelines through the switch."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(30)
    sent = bytearray(b"banner\n")
    s.sendall(sent)
    for i in range(200):
        piece = b"%05d;" % i * 50
        s.sendall(piece)
        sent += piece
    s.shutdown(socket.SHUT_WR)
    got = _recv_all(s)
    s.close()
    want = b"220 banner\n" + bytes(sent[7:]) + b"bye\n"
    assert got == want, f"{len(got)} bytes, {len(want)} expected"
    return len(sent), len(want)


def _case_reset(port: int, _: int) -> tuple[int, int]:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(30)  # a hang fails
    s.sendall(b"reset\n")
    try:
        _recv_all(s)
    except ConnectionResetError:
        pass
    s.close()
    return -1, -1


def _case_many(port: int, _: int) -> tuple[int, int]:
    for _ in range(200):
        _case_send(port, 1000)
    return 200 * len(b"send 1000\n"), 200 * 1000


def check_namespaces() -> str:
    """One socket in a new network namespace (the sandbox's proxy side), its peer in this one."""
    libc, newnet = ctypes.CDLL(None, use_errno=True), 0x40000000
    name = f"corral-sockmap-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        here = os.open("/proc/self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{name}", os.O_RDONLY)
        assert libc.setns(there, newnet) == 0
        try:
            listener = socket.create_server(("127.0.0.1", 0))
            client = socket.create_connection(listener.getsockname())
            inside, _ = listener.accept()
        finally:
            assert libc.setns(here, newnet) == 0
        listener = socket.create_server(("127.0.0.1", 0))
        outside = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        sm = Sockmap()
        ca, cb = sm.join(inside, outside)
        data = os.urandom(1 << 20)
        client.sendall(data)
        server.settimeout(10)
        got = bytearray()
        while len(got) < len(data):
            got += server.recv(1 << 20)
        server.sendall(b"answer")
        client.settimeout(10)
        ok = bytes(got) == data and client.recv(6) == b"answer"
        sm.part(ca, cb)
        return "passed" if ok else "FAILED"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def check_backpressure(limit: int = 256 << 20) -> str:
    """How much a sender gets rid of (in 5 s) through a joined pair when the receiver never reads."""

    def pair() -> tuple[socket.socket, socket.socket]:
        listener = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(listener.getsockname())
        return a, listener.accept()[0]

    client, inside = pair()
    outside, server = pair()
    sm = Sockmap()
    ca, cb = sm.join(inside, outside)
    server.setblocking(False)
    sent, block, start = 0, b"x" * (1 << 20), time.monotonic()
    while sent < limit and time.monotonic() - start < 5:
        try:
            sent += server.send(block)
        except BlockingIOError:
            time.sleep(0.01)
    client.settimeout(10)
    read = 0
    while read < sent:
        read += len(client.recv(1 << 20))
    sm.part(ca, cb)
    verdict = "held back" if sent < 32 << 20 else "NOT held back"
    return f"{verdict}: {sent >> 20} MiB accepted (all {read >> 20} MiB arrived later)"


def check(server_port: int, repeats: int) -> None:
    """Each case *repeats* times through the sockmap relay; a table of passes and failures."""
    pid, port, rd = _start_proxy("sockmap", server_port)
    cases = [
        ("server -> client, 64 KiB", _case_send, 64 << 10),
        ("server -> client, 16 MiB", _case_send, 16 << 20),
        ("client -> server, 64 KiB, SHA-256, half-close", _case_sink, 64 << 10),
        ("client -> server, 1 MiB, SHA-256, half-close", _case_sink, 1 << 20),
        ("client -> server, 16 MiB, SHA-256, half-close", _case_sink, 16 << 20),
        ("banner first, client pipelines through the switch", _case_banner, 0),
        ("server resets", _case_reset, 0),
        ("200 tunnels one after another (1000 bytes each)", _case_many, 0),
    ]
    try:
        up = down = 0
        exact = True
        for name, case, size in cases:
            failures: list[str] = []
            for _ in range(repeats):
                try:
                    u, d = case(port, size)
                    if u >= 0:
                        up, down = up + u, down + d
                    else:
                        exact = False
                except (AssertionError, OSError) as exc:
                    failures.append(str(exc) or type(exc).__name__)
                    exact = False
            time.sleep(0.3)
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.2)
            state = os.read(rd, 4096).decode().strip().replace("\n", "; ")
            state += f"; open fds {len(os.listdir(f'/proc/{pid}/fd'))}"
            print(f"| {name} | {repeats - len(failures)} / {repeats} |"
                  f" {'; '.join(sorted(set(failures)))[:120]} | {state} | up {up} down {down} |",
                  flush=True)  # fmt: skip
        time.sleep(0.5)
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.2)
        report = os.read(rd, 4096).decode().strip().replace("\n", "; ")
        print(f"| across network namespaces (1 MiB up, an answer back) | {check_namespaces()} |")
        print(f"| a receiver that never reads: is the sender held back? | {check_backpressure()} |")
        print(f"proxy: {report}" + (f"; expected up {up} down {down}" if exact else ""))
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def measure(server_port: int, sizes: list[int], repeats: int) -> None:
    modes = ("python", "sockmap", "sockmap+sndbuf")
    procs = {mode: _start_proxy(mode, server_port) for mode in modes}
    ports = {"direct": server_port, **{m: p[1] for m, p in procs.items()}}
    try:
        print(
            "| transfer | direct | Python relay | sockmap redirect | sockmap, 8 MiB send buffers |"
        )
        print("| --- | --- | --- | --- | --- |")
        for size in sizes:
            res: dict[str, list[float]] = {m: [] for m in ports}
            for _ in range(repeats):
                for mode, port in ports.items():
                    out = subprocess.run(
                        [sys.executable, "-c", CLIENT, str(port), str(size)],
                        capture_output=True, text=True, timeout=300, check=True,
                    )  # fmt: skip
                    res[mode].append(float(out.stdout))
            med = {m: statistics.median(v) for m, v in res.items()}
            d = med["direct"]
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            print(
                f"| {label} | {d:.0f} MB/s | "
                + " | ".join(f"{med[m]:.0f} MB/s ({med[m] / d:.0%})" for m in modes)
                + " |",
                flush=True,
            )
    finally:
        for pid, _, _ in procs.values():
            os.kill(pid, 9)
            os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["check", "measure"])
    parser.add_argument("-n", type=int, default=9, help="samples per size and path")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        if args.what == "check":
            check(port, args.n)
        else:
            measure(port, [64 << 10, 1 << 20, 16 << 20, 200 << 20], args.n)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
