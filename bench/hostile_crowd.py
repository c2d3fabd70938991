#!/usr/bin/env python3
"""A hostile crowd against a pooler, for bench/run --hostile.

Opens SILENT connections that never say anything, HALF connections that send an
SSLRequest and then half a TLS ClientHello (or, refused TLS, nothing more), and CUT
connections that send half a startup packet; prints READY with the counts; then, until
its stdin is closed, keeps FLOOD tasks logging in with a wrong password (md5) and
sending 2 GB length prefixes, as fast as they are answered. At the end it prints
DONE <failed logins> <refused huge lengths> <other errors>.

    hostile_crowd.py HOST PORT USER DBNAME SILENT HALF CUT FLOOD
"""

import asyncio
import hashlib
import struct
import sys

# A record header announcing 16 kB of ClientHello, and the first bytes of it.
HALF_HELLO = bytes([0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00, 0x3F, 0xFC])
SSL_REQUEST = struct.pack("!II", 8, 80877103)
HUGE = bytes([0x7F, 0xFF, 0xFF, 0xF0, 0, 3, 0, 0])


def startup_packet(user, dbname):
    body = struct.pack("!I", 196608)
    for k, v in (("user", user), ("database", dbname)):
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


async def open_one(host, port, first=b""):
    reader, writer = await asyncio.open_connection(host, port)
    if first:
        writer.write(first)
        await writer.drain()
    return reader, writer


async def half_tls(host, port):
    reader, writer = await open_one(host, port, SSL_REQUEST)
    answer = await reader.readexactly(1)
    if answer == b"S":
        writer.write(HALF_HELLO)
        await writer.drain()
    return reader, writer


async def read_message(reader):
    hdr = await reader.readexactly(5)
    length = struct.unpack("!I", hdr[1:])[0]
    body = await reader.readexactly(length - 4) if length > 4 else b""
    return hdr[:1], body


async def wrong_password(host, port, user, dbname):
    """One login with a wrong password; True when it was refused as such."""
    reader, writer = await open_one(host, port, startup_packet(user, dbname))
    try:
        while True:
            typ, body = await read_message(reader)
            if typ == b"R":
                code = struct.unpack("!I", body[:4])[0]
                if code == 5:
                    salt = body[4:8]
                    inner = hashlib.md5(b"not-the-password" + user.encode()).hexdigest()
                    outer = hashlib.md5(inner.encode() + salt).hexdigest()
                    msg = b"md5" + outer.encode() + b"\0"
                elif code == 3:
                    msg = b"not-the-password\0"
                else:
                    return False
                writer.write(b"p" + struct.pack("!I", len(msg) + 4) + msg)
                await writer.drain()
            elif typ == b"E":
                # PostgreSQL and Weir say 28P01, PgBouncer 08P01: refused either way.
                return True
            else:
                return False
    finally:
        writer.close()


async def huge_length(host, port):
    reader, writer = await open_one(host, port, HUGE)
    try:
        typ, _ = await read_message(reader)
        return typ == b"E"
    finally:
        writer.close()


async def main_async(host, port, user, dbname, silent, half, cut, flood):
    held = []
    for _ in range(silent):
        held.append(await open_one(host, port))
    for _ in range(half):
        held.append(await half_tls(host, port))
    for _ in range(cut):
        held.append(await open_one(host, port, startup_packet(user, dbname)[:10]))
    sys.stdout.write(f"READY {silent} {half} {cut}\n")
    sys.stdout.flush()

    stop = asyncio.Event()
    counts = {"failed_logins": 0, "huge_refused": 0, "other": 0}

    async def flooder(i):
        while not stop.is_set():
            try:
                if i % 2 == 0:
                    ok = await asyncio.wait_for(wrong_password(host, port, user, dbname), 10)
                    counts["failed_logins" if ok else "other"] += 1
                else:
                    ok = await asyncio.wait_for(huge_length(host, port), 10)
                    counts["huge_refused" if ok else "other"] += 1
            except Exception:  # noqa: BLE001 - counted, the flood goes on
                counts["other"] += 1
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(flooder(i)) for i in range(flood)]
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _, w in held:
        w.close()
    sys.stdout.write(f"DONE {counts['failed_logins']} {counts['huge_refused']} {counts['other']}\n")
    sys.stdout.flush()


def main():
    if len(sys.argv) != 9:
        sys.stderr.write(__doc__)
        return 2
    host, port, user, dbname = sys.argv[1:5]
    silent, half, cut, flood = (int(x) for x in sys.argv[5:9])
    asyncio.run(main_async(host, int(port), user, dbname, silent, half, cut, flood))
    return 0


if __name__ == "__main__":
    sys.exit(main())
