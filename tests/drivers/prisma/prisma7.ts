// Prisma 7's client (the Rust-free one: its query compiler is WASM, queries go through
// @prisma/adapter-pg, i.e. node-postgres) through Weir in transaction mode: 10
// PrismaClients at once, each with the adapter's own pg.Pool.
//
// Usage: tsx prisma7.ts [named]
//   default: the adapter at its defaults, which sends every query as an unnamed statement
//   named:   with statementNameGenerator (node-postgres then prepares each text once per
//            connection under that name), and ?pgbouncer=true in the URL, which Prisma 6's
//            engine obeyed and this adapter does not look at
// Reads WEIR_HOST, WEIR_PORT, WEIR_DB, WEIR_USER, WEIR_CLIENTS, and WEIR_PRISMA_CLIENT: the
// client that `prisma generate` wrote at install time (scripts/install-drivers).
import { createHash } from "node:crypto";
import { PrismaPg } from "@prisma/adapter-pg";

const { PrismaClient } = require(process.env.WEIR_PRISMA_CLIENT as string);

const named = process.argv[2] === "named";
const clients = Number(process.env.WEIR_CLIENTS || "10");

function check(cond: boolean, what: string): void {
  if (!cond) throw new Error("FAILED: " + what);
}

// Every client waits here until all have arrived, so that their work overlaps; a client
// that failed opens it for the others.
function barrier(n: number): { arrive: () => Promise<void>; open: () => void } {
  let arrived = 0;
  let open = () => {};
  const opened = new Promise<void>((resolve) => (open = resolve));
  return {
    arrive: () => {
      arrived += 1;
      if (arrived === n) open();
      return opened;
    },
    open: () => open(),
  };
}

class Rollback extends Error {}

async function client(i: number, meet: () => Promise<void>): Promise<void> {
  const app = `drv-prisma-${i}`;
  let url =
    `postgresql://${process.env.WEIR_USER}@${process.env.WEIR_HOST}:${process.env.WEIR_PORT}/` +
    `${process.env.WEIR_DB}?application_name=${app}`;
  if (named) url += "&pgbouncer=true";
  const options = named
    ? { statementNameGenerator: (q: { sql: string }) => "p" + createHash("sha1").update(q.sql).digest("hex").slice(0, 20) }
    : undefined;
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: url }, options) });
  try {
    const base = i * 1000;
    for (let n = 0; n < 8; n++) {
      await prisma.row.create({ data: { id: base + n, v: `c${n}` } });
      const r = await prisma.$queryRaw`select ${n}::int + ${i}::int as s, current_setting('application_name') as app`;
      check(r[0].s === n + i && r[0].app === app, `client ${i}: ${JSON.stringify(r)}`);
      if (n === 3) await meet();
    }
    const found = await prisma.row.findMany({ where: { id: { gte: base, lt: base + 1000 } }, orderBy: { id: "asc" } });
    check(found.length === 8 && found[7].v === "c7", `client ${i}: findMany ${JSON.stringify(found)}`);

    // An interactive transaction rolled back by throwing: its insert is seen inside it,
    // then nowhere.
    const lost = 500000 + i;
    try {
      await prisma.$transaction(async (tx: any) => {
        await tx.row.create({ data: { id: lost, v: "lost" } });
        await tx.row.update({ where: { id: base }, data: { v: "lost" } });
        check((await tx.row.count({ where: { id: lost } })) === 1, `client ${i}: insert unseen in its transaction`);
        throw new Rollback();
      });
      check(false, `client ${i}: the transaction did not throw`);
    } catch (e) {
      if (!(e instanceof Rollback)) throw e;
    }
    check((await prisma.row.count({ where: { id: lost } })) === 0, `client ${i}: the rolled-back insert is visible`);
    check((await prisma.row.findUnique({ where: { id: base } })).v === "c0", `client ${i}: the rolled-back update is visible`);

    // One rolled back by PostgreSQL's error (a duplicate key), and one committed.
    try {
      await prisma.$transaction(async (tx: any) => {
        await tx.row.create({ data: { id: base + 100, v: "lost" } });
        await tx.row.create({ data: { id: base + 1, v: "duplicate" } });
      });
      check(false, `client ${i}: the duplicate key was accepted`);
    } catch (e: any) {
      check(e.code === "P2002", `client ${i}: ${e}`);
    }
    await prisma.$transaction(async (tx: any) => {
      await tx.row.create({ data: { id: base + 200, v: "interactive" } });
      await tx.row.update({ where: { id: base + 1 }, data: { v: "updated" } });
    });

    // Batch transactions: one committed, one whose last query fails, which undoes it whole.
    await prisma.$transaction([
      prisma.row.create({ data: { id: base + 300, v: "batch" } }),
      prisma.row.create({ data: { id: base + 301, v: "batch" } }),
      prisma.row.update({ where: { id: base + 2 }, data: { v: "batch" } }),
    ]);
    try {
      await prisma.$transaction([
        prisma.row.create({ data: { id: base + 400, v: "lost" } }),
        prisma.row.create({ data: { id: base + 300, v: "duplicate" } }),
      ]);
      check(false, `client ${i}: the duplicate key in a batch was accepted`);
    } catch (e: any) {
      check(e.code === "P2002", `client ${i}: ${e}`);
    }
    await meet();
    const rows = await prisma.row.findMany({ where: { id: { gte: base, lt: base + 1000 } } });
    const byId = new Map(rows.map((r: { id: number; v: string }) => [r.id - base, r.v]));
    check(
      rows.length === 11 && byId.get(1) === "updated" && byId.get(2) === "batch" && byId.get(200) === "interactive",
      `client ${i}: ${JSON.stringify(rows)}`
    );
    // Named statements are seen by PostgreSQL as prepared statements of the session (Weir's
    // names through Weir); unnamed ones never.
    const prepared = await prisma.$queryRaw`select count(*)::int as n from pg_prepared_statements`;
    check(named ? prepared[0].n > 0 : prepared[0].n === 0, `client ${i}: ${prepared[0].n} prepared statements`);
  } finally {
    await prisma.$disconnect();
  }
}

async function main(): Promise<void> {
  const meets = [barrier(clients), barrier(clients)];
  const results = await Promise.allSettled(
    Array.from({ length: clients }, (_, i) => {
      let k = 0;
      return client(i, () => meets[k++].arrive()).catch((e) => {
        meets.forEach((m) => m.open());
        throw e;
      });
    })
  );
  const failed = results.filter((r) => r.status === "rejected") as PromiseRejectedResult[];
  for (const f of failed) console.log(String(f.reason && f.reason.stack ? f.reason.stack : f.reason));
  if (failed.length > 0) {
    console.error(`${failed.length} client(s) failed`);
    process.exit(1);
  }
  const version = require("@prisma/client/package.json").version;
  console.log(`Prisma ${version} (${named ? "named statements" : "unnamed statements"}): ${clients} clients ok`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
