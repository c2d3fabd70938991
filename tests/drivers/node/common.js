// Connection parameters the driver matrix (tests/driver_matrix.rs) passes in env.
'use strict';

const env = {
  host: process.env.WEIR_HOST,
  port: Number(process.env.WEIR_PORT),
  database: process.env.WEIR_DB,
  user: process.env.WEIR_USER,
  clients: Number(process.env.WEIR_CLIENTS || '10'),
};

function check(cond, what) {
  if (!cond) throw new Error(`FAILED: ${what}`);
}

/** A barrier for `n` async clients. */
function barrier(n) {
  let waiting = 0;
  let release;
  const all = new Promise((r) => (release = r));
  return async () => {
    waiting += 1;
    if (waiting === n) release();
    await all;
  };
}

/** Runs client(i) for each client at once; exits 1 listing the ones that failed. */
async function runClients(client, label) {
  const results = await Promise.allSettled([...Array(env.clients).keys()].map(client));
  const failed = results
    .map((r, i) => (r.status === 'rejected' ? `client ${i}: ${r.reason && r.reason.stack}` : null))
    .filter(Boolean);
  failed.forEach((f) => console.log(f));
  if (failed.length > 0) {
    console.error(`${failed.length} client(s) failed`);
    process.exit(1);
  }
  console.log(`${label}: ${env.clients} clients ok`);
}

module.exports = { env, check, barrier, runClients };
