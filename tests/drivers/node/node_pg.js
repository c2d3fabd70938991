// node-postgres (pg) at its default settings through Weir in transaction mode: named
// queries ({name, text}) are prepared once per connection and reused.
'use strict';

const { Client } = require('pg');
const { env, check, barrier, runClients } = require('./common');

const meet = barrier(env.clients);

async function client(i) {
  const app = `drv-node-pg-${i}`;
  const c = new Client({ host: env.host, port: env.port, database: env.database, user: env.user, application_name: app });
  await c.connect();
  try {
    for (let n = 0; n < 8; n++) {
      const r = await c.query({
        name: 'add',
        text: "select $1::int + $2::int as s, current_setting('application_name') as a",
        values: [n, i],
      });
      check(r.rows[0].s === n + i, `client ${i}: ${r.rows[0].s} != ${n + i}`);
      check(r.rows[0].a === app, `client ${i}: application_name ${r.rows[0].a} != ${app}`);
      if (n === 3) await meet();
    }
    // A second named statement, its name shared by every client with a different text each.
    for (let n = 0; n < 3; n++) {
      const r = await c.query({ name: 'mine', text: `select ${i} * 100 + $1::int as v`, values: [n] });
      check(r.rows[0].v === i * 100 + n, `client ${i}: mine ${r.rows[0].v}`);
    }
    // A transaction with an error mid-way, then the connection still works.
    await c.query('begin');
    await c.query({ name: 'ins', text: 'insert into drv_node_pg (id, v) values ($1, $2)', values: [100000 + i, 'lost'] });
    let failed = false;
    try {
      await c.query({ name: 'div', text: 'select 1 / ($1::int - $1::int)', values: [i] });
    } catch (e) {
      failed = e.code === '22012';
    }
    check(failed, `client ${i}: division by zero was not raised`);
    await c.query('rollback');
    const r = await c.query({ name: 'count', text: 'select count(*)::int as n from drv_node_pg where id = $1', values: [100000 + i] });
    check(r.rows[0].n === 0, `client ${i}: the failed transaction's insert is visible`);
    await c.query('begin');
    for (let k = 0; k < 20; k++) {
      await c.query({ name: 'ins', text: 'insert into drv_node_pg (id, v) values ($1, $2)', values: [i * 1000 + k, `v${k}`] });
    }
    await c.query('commit');
    const n = await c.query({ name: 'range', text: 'select count(*)::int as n from drv_node_pg where id / 1000 = $1', values: [i] });
    check(n.rows[0].n === 20, `client ${i}: ${n.rows[0].n} rows`);
    // Session state (SET search_path) follows the client in transaction mode, and
    // no other client on the same server sees it.
    await c.query(`set search_path to drv_schema_${i}, public`);
    const sp = await c.query('show search_path');
    check(sp.rows[0].search_path === `drv_schema_${i}, public`, 'search_path');
  } finally {
    await c.end();
  }
}

runClients(client, `pg ${require('pg/package.json').version}`);
