// node-postgres through Weir with its default settings: named queries
// ({name, text}) are prepared once per connection and reused by name.
// WEIR_URL names the pooler; ten clients run at once.
const { Client } = require('pg');
const assert = require('assert');

const URL = process.env.WEIR_URL;

async function client(n) {
  const c = new Client({ connectionString: URL });
  await c.connect();
  try {
    for (let i = 0; i < 8; i++) {
      const r = await c.query({ name: 'add', text: 'SELECT $1::int + $2::int AS s', values: [n, i] });
      assert.strictEqual(r.rows[0].s, n + i);
    }
    await c.query('BEGIN');
    await assert.rejects(c.query('SELECT 1/0'), /division by zero/);
    await c.query('ROLLBACK');
    assert.strictEqual((await c.query('SELECT 42 AS v')).rows[0].v, 42);
  } finally {
    await c.end();
  }
}

async function setIsolation() {
  const a = new Client({ connectionString: URL });
  const b = new Client({ connectionString: URL });
  await a.connect();
  await b.connect();
  try {
    await a.query("SET search_path = pg_catalog; SET application_name = 'client-a'");
    for (let i = 0; i < 5; i++) {
      const sp = (await b.query('SHOW search_path')).rows[0].search_path;
      assert.strictEqual(sp, '"$user", public', `client B sees search_path ${sp}`);
      const app = (await b.query('SHOW application_name')).rows[0].application_name;
      assert.notStrictEqual(app, 'client-a');
    }
  } finally {
    await a.end();
    await b.end();
  }
}

(async () => {
  await Promise.all([...Array(10).keys()].map(client));
  await setIsolation();
  console.log('node-postgres: ok');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
