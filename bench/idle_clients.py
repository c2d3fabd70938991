#!/usr/bin/env python3
"""Open N logged-in, idle PostgreSQL client connections and hold them.

Used by bench/run for the idle-client memory measurement. Each client does a
real startup: StartupMessage, authentication (trust, cleartext or md5), and
waits for ReadyForQuery. Then the socket is simply held open. With BENCH_CLIENT_TLS=1
in the environment, each client asks for TLS first (SSLRequest).

    idle_clients.py HOST PORT USER PASSWORD DBNAME COUNT [CONCURRENCY [STATEMENTS]]

With STATEMENTS, each client then prepares that many named statements (Parse of
s0, s1, ... and a Sync; the same texts in every client, as an application's clients
send) before it idles.

Prints one line "READY <connected> <failed> <first-error>" on stdout once every
client has either logged in or given up, then blocks until stdin is closed (or
the process is signalled) and exits, closing every socket.

Python standard library only.
"""

import asyncio
import hashlib
import os
import resource
import ssl
import struct
import sys


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def startup_packet(user, dbname):
    body = struct.pack("!I", 196608)  # protocol 3.0
    for k, v in (("user", user), ("database", dbname),
                 ("application_name", "weir-bench-idle")):
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def password_message(data):
    return b"p" + struct.pack("!I", len(data) + 4) + data


def statement_text(i):
    # pgbench's table, so that the statements are valid; the comment makes each its own.
    return (f"SELECT aid, bid, abalance, filler FROM pgbench_accounts "
            f"WHERE aid = $1 AND bid = $2 ORDER BY aid LIMIT 10 /* statement {i} */")


def parse_message(name, text):
    body = name.encode() + b"\0" + text.encode() + b"\0" + struct.pack("!H", 0)
    return b"P" + struct.pack("!I", len(body) + 4) + body


async def prepare(reader, writer, n):
    writer.write(b"".join(parse_message(f"s{i}", statement_text(i)) for i in range(n))
                 + b"S\0\0\0\x04")
    await writer.drain()
    while True:
        hdr = await reader.readexactly(5)
        length = struct.unpack("!I", hdr[1:])[0]
        body = await reader.readexactly(length - 4) if length > 4 else b""
        if hdr[:1] == b"E":
            raise RuntimeError(f"prepare failed: {body!r}")
        if hdr[:1] == b"Z":
            return


async def start_tls(reader, writer):
    """SSLRequest, then TLS over the same stream (bench/run --client-tls)."""
    writer.write(struct.pack("!II", 8, 80877103))
    await writer.drain()
    if await reader.readexactly(1) != b"S":
        raise RuntimeError("the pooler refused TLS")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    await writer.start_tls(ctx)


async def login(host, port, user, password, dbname):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if os.environ.get("BENCH_CLIENT_TLS") == "1":
            await start_tls(reader, writer)
        writer.write(startup_packet(user, dbname))
        await writer.drain()
        while True:
            hdr = await reader.readexactly(5)
            typ, length = hdr[:1], struct.unpack("!I", hdr[1:])[0]
            body = await reader.readexactly(length - 4) if length > 4 else b""
            if typ == b"R":
                code = struct.unpack("!I", body[:4])[0]
                if code == 0:
                    continue
                if code == 3:
                    writer.write(password_message(password.encode() + b"\0"))
                elif code == 5:
                    salt = body[4:8]
                    inner = hashlib.md5((password + user).encode()).hexdigest()
                    outer = hashlib.md5(inner.encode() + salt).hexdigest()
                    writer.write(password_message(b"md5" + outer.encode() + b"\0"))
                else:
                    raise RuntimeError(f"unsupported authentication request {code}")
                await writer.drain()
            elif typ == b"E":
                fields = {}
                for part in body.split(b"\0"):
                    if part:
                        fields[part[:1]] = part[1:].decode(errors="replace")
                raise RuntimeError(f"server error: {fields.get(b'M', body)}")
            elif typ == b"Z":
                return reader, writer
            # 'S' ParameterStatus, 'K' BackendKeyData, 'N' notices: ignore.
    except BaseException:
        writer.close()
        raise


async def main_async(host, port, user, password, dbname, count, concurrency, statements):
    sem = asyncio.Semaphore(concurrency)
    held = []
    errors = []

    async def one():
        delay = 0.05
        last = None
        for _ in range(8):
            async with sem:
                try:
                    conn = await asyncio.wait_for(
                        login(host, port, user, password, dbname), 30)
                    if statements:
                        await asyncio.wait_for(prepare(*conn, statements), 30)
                    held.append(conn)
                    return
                except Exception as e:  # noqa: BLE001 - report and retry
                    last = e
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        errors.append(f"{type(last).__name__}: {last}")

    await asyncio.gather(*(one() for _ in range(count)))
    first = errors[0].replace("\n", " ") if errors else "-"
    sys.stdout.write(f"READY {len(held)} {len(errors)} {first}\n")
    sys.stdout.flush()
    # Hold every socket until the parent closes our stdin.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for _, w in held:
        w.close()


def main():
    if len(sys.argv) not in (7, 8, 9):
        sys.stderr.write(__doc__)
        return 2
    host, port, user, password, dbname, count = sys.argv[1:7]
    concurrency = int(sys.argv[7]) if len(sys.argv) >= 8 else 64
    statements = int(sys.argv[8]) if len(sys.argv) == 9 else 0
    raise_nofile()
    asyncio.run(main_async(host, int(port), user, password, dbname,
                           int(count), concurrency, statements))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
