// postgres.js at its default settings (prepare: true: every query is a named prepared
// statement) through Weir in transaction mode.
'use strict';

const postgres = require('postgres');
const { env, check, barrier, runClients } = require('./common');

const meet = barrier(env.clients);

async function client(i) {
  const app = `drv-postgres-js-${i}`;
  // max: 1 so that each client is one connection (the default pool would open up to 10).
  const sql = postgres({ host: env.host, port: env.port, database: env.database, username: env.user, max: 1,
    connection: { application_name: app }, onnotice: () => {} });
  try {
    for (let n = 0; n < 8; n++) {
      const [r] = await sql`select ${n}::int + ${i}::int as s, current_setting('application_name') as a`;
      check(r.s === n + i, `client ${i}: ${r.s} != ${n + i}`);
      check(r.a === app, `client ${i}: application_name ${r.a} != ${app}`);
      if (n === 3) await meet();
    }
    let failed = false;
    try {
      await sql.begin(async (tx) => {
        await tx`insert into drv_postgres_js (id, v) values (${100000 + i}, 'lost')`;
        await tx`select 1 / (${i}::int - ${i}::int)`;
      });
    } catch (e) {
      failed = e.code === '22012';
    }
    check(failed, `client ${i}: division by zero was not raised`);
    const [c0] = await sql`select count(*)::int as n from drv_postgres_js where id = ${100000 + i}`;
    check(c0.n === 0, `client ${i}: the failed transaction's insert is visible`);
    await sql.begin(async (tx) => {
      const rows = [...Array(20).keys()].map((k) => ({ id: i * 1000 + k, v: `v${k}` }));
      await tx`insert into drv_postgres_js ${tx(rows, 'id', 'v')}`;
    });
    for (let n = 0; n < 6; n++) {
      const [c1] = await sql`select count(*)::int as n from drv_postgres_js where id / 1000 = ${i}`;
      check(c1.n === 20, `client ${i}: ${c1.n} rows`);
    }
    // Session state (SET search_path) follows the client in transaction mode, and
    // no other client on the same server sees it.
    await sql.unsafe(`set search_path to drv_schema_${i}, public`);
    const [sp] = await sql`show search_path`;
    check(sp.search_path === `drv_schema_${i}, public`, 'search_path');
  } finally {
    await sql.end();
  }
}

runClients(client, 'postgres.js');
