#!/usr/bin/env python3
"""Writes the seed corpus (fuzz/corpus/<target>/seed-*): a few real, valid inputs per
target, so that the fuzzers start from messages PostgreSQL clients and servers send and
files operators write. Run again after changing it; the output is committed."""

import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def msg(tag, body):
    return tag + struct.pack(">I", len(body) + 4) + body


def cstr(s):
    return s.encode() + b"\0"


def packet(payload):
    return struct.pack(">I", len(payload) + 4) + payload


def startup(params, version=196608):
    body = struct.pack(">I", version)
    for k, v in params:
        body += cstr(k) + cstr(v)
    return packet(body + b"\0")


SSL = packet(struct.pack(">I", 80877103))
GSS = packet(struct.pack(">I", 80877104))
CANCEL = packet(struct.pack(">III", 80877102, 4242, 0xDEADBEEF))
# Protocol 3.2's: a 32-byte key, as PostgreSQL 18 and Weir give a 3.2 client.
CANCEL_3_2 = packet(struct.pack(">III", 80877102, 4242, 0xDEADBEEF) + bytes(range(28)))

LIBPQ = [("user", "bob"), ("database", "app"), ("application_name", "psql"),
         ("client_encoding", "UTF8")]
JDBC = [("user", "app"), ("database", "shop"), ("client_encoding", "UTF8"),
        ("DateStyle", "ISO"), ("TimeZone", "Europe/Paris"), ("extra_float_digits", "2")]


def parse(name, sql, types=()):
    return msg(b"P", cstr(name) + cstr(sql) + struct.pack(">h", len(types))
               + b"".join(struct.pack(">I", t) for t in types))


def bind(portal, stmt, params):
    body = cstr(portal) + cstr(stmt) + struct.pack(">h", 0) + struct.pack(">h", len(params))
    for p in params:
        body += struct.pack(">i", -1) if p is None else struct.pack(">i", len(p)) + p
    return msg(b"B", body + struct.pack(">h", 0))


def describe(kind, name):
    return msg(b"D", kind + cstr(name))


def close(kind, name):
    return msg(b"C", kind + cstr(name))


EXECUTE = msg(b"E", cstr("") + struct.pack(">i", 0))
SYNC = msg(b"S", b"")
FLUSH = msg(b"H", b"")


def query(sql):
    return msg(b"Q", cstr(sql))


def sasl_initial(mech, data):
    return msg(b"p", cstr(mech) + struct.pack(">i", len(data)) + data)


def auth(code, data=b""):
    return msg(b"R", struct.pack(">I", code) + data)


def param_status(k, v):
    return msg(b"S", cstr(k) + cstr(v))


def error(fields, tag=b"E"):
    return msg(tag, b"".join(t + cstr(v) for t, v in fields) + b"\0")


def row_description(cols):
    body = struct.pack(">h", len(cols))
    for name in cols:
        body += cstr(name) + struct.pack(">IhIhih", 0, 0, 25, -1, -1, 0)
    return msg(b"T", body)


def data_row(values):
    body = struct.pack(">h", len(values))
    for v in values:
        body += struct.pack(">i", -1) if v is None else struct.pack(">i", len(v)) + v
    return msg(b"D", body)


def ready(status=b"I"):
    return msg(b"Z", status)


LOGIN_TAIL = (param_status("server_version", "17.2") + param_status("client_encoding", "UTF8")
              + param_status("DateStyle", "ISO, MDY") + param_status("TimeZone", "UTC")
              + param_status("integer_datetimes", "on")
              + msg(b"K", struct.pack(">II", 31337, 0x12345678)) + ready())
REPLIES = (msg(b"1", b"") + msg(b"2", b"") + msg(b"t", struct.pack(">hI", 1, 25))
           + row_description(["?column?"]) + data_row([b"1"]) + msg(b"C", cstr("SELECT 1"))
           + msg(b"3", b"") + ready())

C1 = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
S1 = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
C2 = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
      b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
S2 = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

SEEDS = {
    "startup_packet": {
        "libpq": startup(LIBPQ),
        "jdbc": startup(JDBC),
        "ssl-then-startup": SSL + startup(LIBPQ),
        "gssenc-ssl-then-startup": GSS + SSL + startup(LIBPQ),
        "cancel": CANCEL,
        "cancel-3.2": CANCEL_3_2,
        "options": startup([("user", "bob"), ("database", "app"),
                            ("options", "-c search_path=a,b --work-mem=8MB -cstatement_timeout=5s")]),
        "protocol-3.2": startup(LIBPQ + [("_pq_.test_option", "on")], version=196610),
    },
    "frontend_messages": {
        "extended": b"\x00" + parse("s1", "select $1::int", [23]) + bind("", "s1", [b"42"])
        + describe(b"P", "") + EXECUTE + SYNC,
        "extended-peek": b"\x01" + parse("s1", "select $1::int", [23]) + bind("", "s1", [b"42"])
        + describe(b"S", "s1") + EXECUTE + close(b"S", "s1") + SYNC,
        "reprepare-small-cache": b"\x11" + parse("a", "select 1") + parse("b", "select 2")
        + parse("c", "select 3") + bind("", "a", []) + EXECUTE + parse("a", "select 1") + SYNC
        + close(b"S", "b") + SYNC,
        "failed-transaction": b"\x02" + parse("s", "select 1") + bind("p", "s", [None])
        + msg(b"E", cstr("p") + struct.pack(">i", 10)) + SYNC,
        "ahead": b"\x04" + bind("", "s1", [b"x"]) + describe(b"S", "s1") + EXECUTE + SYNC,
        "simple-queries": b"\x00" + query("SET search_path TO a, b; LISTEN jobs")
        + query("select set_config('myapp.tenant', '7', false)")
        + query("PREPARE q (int) AS select $1") + query("EXECUTE q(1)")
        + query("select pg_advisory_lock(1)") + query("CREATE TEMP TABLE t (a int)")
        + query("DECLARE c CURSOR WITH HOLD FOR select 1") + query("DEALLOCATE ALL")
        + query("UNLISTEN *") + query("DISCARD ALL") + query("RESET ALL"),
        "set-config-bind": b"\x00" + parse("", "select set_config($1, $2, false)")
        + bind("", "", [b"MyApp.X", b"1"]) + EXECUTE + SYNC,
        "sasl-initial": b"\x00" + sasl_initial("SCRAM-SHA-256", C1)
        + sasl_initial("SCRAM-SHA-256-PLUS", b"p=tls-server-end-point,,n=,r=abc"),
        "listen-extended": b"\x00" + parse("", "LISTEN jobs") + bind("", "", [])
        + describe(b"P", "") + EXECUTE + SYNC,
        "listen-query": b"\x00" + query("  listen a; UNLISTEN \"B c\"; unlisten *"),
        "flush-terminate": b"\x00" + parse("s", "select 1") + FLUSH + msg(b"X", b""),
    },
    "backend_messages": {
        "login-ok": auth(0) + LOGIN_TAIL + REPLIES,
        "login-md5": auth(5, b"\x01\x02\x03\x04") + auth(0) + LOGIN_TAIL + REPLIES,
        "login-scram": auth(10, cstr("SCRAM-SHA-256-PLUS") + cstr("SCRAM-SHA-256") + b"\0")
        + auth(11, S1) + auth(12, S2) + auth(0) + LOGIN_TAIL,
        "login-error": error([(b"S", "FATAL"), (b"V", "FATAL"), (b"C", "28P01"),
                              (b"M", 'password authentication failed for user "bob"')]),
        "login-3.2": auth(0) + LOGIN_TAIL.replace(
            msg(b"K", struct.pack(">II", 31337, 0x12345678)),
            msg(b"K", struct.pack(">II", 31337, 0x12345678) + bytes(range(28)))) + REPLIES,
        "negotiate-3.0": msg(b"v", struct.pack(">II", 196608, 0)) + auth(0) + LOGIN_TAIL,
        "negotiate-notice": msg(b"v", struct.pack(">II", 0, 1) + cstr("_pq_.x")) + auth(0)
        + error([(b"S", "WARNING"), (b"C", "01000"), (b"M", "hi")], b"N") + LOGIN_TAIL,
        "error-reply": auth(0) + LOGIN_TAIL + msg(b"1", b"")
        + error([(b"S", "ERROR"), (b"C", "42P01"), (b"M", 'relation "t" does not exist'),
                 (b"P", "15"), (b"F", "parse_relation.c"), (b"L", "1449")]) + ready(),
        "read-back-rows": auth(0) + LOGIN_TAIL + data_row([b"search_path", b"a, b"])
        + data_row([b"", b"advisory lock,LISTEN"]) + data_row([b"work_mem", None])
        + msg(b"C", cstr("SELECT 3")) + ready(),
        "stale-plan": auth(0) + LOGIN_TAIL + msg(b"1", b"") + msg(b"2", b"")
        + error([(b"S", "ERROR"), (b"C", "0A000"),
                 (b"M", "cached plan must not change result type")]) + ready(b"I"),
    },
    "config_ini": {
        "example": open(os.path.join(EXAMPLES, "pgbouncer.ini"), "rb").read(),
        "full": b'''[databases]
app = host=127.0.0.1 port=5432 dbname=app pool_size=20 pool_mode=transaction
"quoted ""name""" = host=/tmp dbname=x
* = host=db1,db2 port=5432,5433 load_balance_hosts=round-robin

[users]
bob = pool_mode=session max_user_connections=3

[peers]
1 = host=10.0.0.1 port=6432

[pgbouncer]
listen_addr = 127.0.0.1, ::1
listen_port = 6432
auth_type = scram-sha-256
auth_file = userlist.txt
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
server_lifetime = 3600
query_wait_timeout = 120.5
ignore_startup_parameters = extra_float_digits, options
admin_users = admin
; a comment
# another
''',
    },
    "auth_file": {
        "example": open(os.path.join(EXAMPLES, "userlist.txt"), "rb").read(),
        "secrets": b'"bob" "md5d4b1c5f8c8e2bd04e2c6d5f2b6cf5a1a"\n'
        b'"alice" "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$'
        b'WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="\n'
        b'; comment\n"plain ""quoted"" user" "pass word"\n',
    },
    "hba": {
        "rules": b"""# TYPE  DATABASE  USER  ADDRESS  METHOD
local   all       all                     peer map=local
host    all       all   127.0.0.1/32      scram-sha-256
host    app,shop  bob   10.0.0.0 255.0.0.0 md5
hostssl all       all   ::1/128           cert
hostnossl "db"    all   0.0.0.0/0         reject
host    all       all   all               trust
\xfflocal root bob
local /^(.*)$ \\1
""",
        "lists": b"""host all user1,user2 , user3 127.0.0.1/32 md5
host app, "Quoted, Name" ,"all" a,,b, 10.0.0.0/8 trust
host all all 10.0.0.0/8 , 10.1.0.0/16 reject
""",
    },
    "scram": {
        "rfc7677": C1 + b"\xff" + C2 + b"\xff" + S1 + b"\xff" + S2,
        "channel-binding": b"p=tls-server-end-point,,n=,r=abc\xffc=cD10bHMtc2VydmVyLWVuZC1wb2ludCwsZW5kLXBvaW50,r=abc%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA"
        + b"\xffe=invalid-proof\xff",
        "server-error": b"y,,n=,r=x,ext=1\xff\xff" + S1 + b"\xffe=other-error",
    },
    "connstr": {
        "plain": b"host=localhost port=5432 dbname=postgres user=bob",
        "quoted": b"host='/var/run/postgresql' dbname='my db' password='it''s \\'x\\''",
        "multi-host": b"host=db1,db2,db3 port=5432,5433 load_balance_hosts=round-robin "
        b"pool_size=10 reserve_pool=2 connect_query='SELECT 1' application_name=app",
        "fallback": b"auth_user=pgb client_encoding=UTF8 datestyle=ISO timezone=UTC max_db_connections=50",
    },
}

for target, seeds in SEEDS.items():
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)
