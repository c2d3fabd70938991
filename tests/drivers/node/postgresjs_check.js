// postgres.js through Weir with its default settings (prepare: true, named
// statements per connection). WEIR_URL names the pooler; ten clients.
const postgres = require('postgres');
const assert = require('assert');

const URL = process.env.WEIR_URL;

async function client(n) {
  const sql = postgres(URL, { max: 1, onnotice: () => {} });
  try {
    for (let i = 0; i < 8; i++) {
      const [r] = await sql`SELECT ${n}::int + ${i}::int AS s`;
      assert.strictEqual(r.s, n + i);
    }
    // Pipelined: queries sent together on the one connection.
    const rs = await Promise.all([1, 2, 3].map((k) => sql`SELECT ${k}::int * 2 AS v`));
    assert.deepStrictEqual(rs.map(([r]) => r.v), [2, 4, 6]);
    await assert.rejects(sql.begin(async (tx) => { await tx`SELECT 1/0`; }), /division by zero/);
    const [r] = await sql`SELECT 42 AS v`;
    assert.strictEqual(r.v, 42);
  } finally {
    await sql.end();
  }
}

(async () => {
  await Promise.all([...Array(10).keys()].map(client));
  console.log('postgres.js: ok');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
