//! The dashboard's memory: one sample per second of rates, latencies and connection
//! counts, for the last ten minutes, so that a freshly opened page shows history at once.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use serde_json::{json, Value};

use super::live::Live;
use crate::stats::{Delta, LATENCY_BOUNDS_US, LATENCY_BUCKETS};

/// Ten minutes at one sample a second.
pub const CAPACITY: usize = 600;
/// The dashboard's tiles and pools table average over this many seconds' readings
/// (smoother than one second), the same window for both so that their figures agree.
const POOL_WINDOW: usize = 5;

#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    pub tps: f64,
    pub qps: f64,
    pub xact_avg_ms: f64,
    pub xact_p50_ms: f64,
    pub xact_p95_ms: f64,
    pub xact_p99_ms: f64,
    pub query_avg_ms: f64,
    pub wait_avg_ms: f64,
    pub max_wait_ms: f64,
    pub recv_bps: f64,
    pub sent_bps: f64,
    pub errors: u64,
    pub cl_active: u64,
    pub cl_waiting: u64,
    pub sv_active: u64,
    pub sv_idle: u64,
    pub sv_login: u64,
}

impl Sample {
    fn to_json(self) -> Value {
        let r = |v: f64| (v * 1000.0).round() / 1000.0;
        json!({
            "t": self.t,
            "tps": r(self.tps),
            "qps": r(self.qps),
            "xact_avg_ms": r(self.xact_avg_ms),
            "xact_p50_ms": r(self.xact_p50_ms),
            "xact_p95_ms": r(self.xact_p95_ms),
            "xact_p99_ms": r(self.xact_p99_ms),
            "query_avg_ms": r(self.query_avg_ms),
            "wait_avg_ms": r(self.wait_avg_ms),
            "max_wait_ms": r(self.max_wait_ms),
            "recv_bps": r(self.recv_bps),
            "sent_bps": r(self.sent_bps),
            "errors": self.errors,
            "cl_active": self.cl_active,
            "cl_waiting": self.cl_waiting,
            "sv_active": self.sv_active,
            "sv_idle": self.sv_idle,
            "sv_login": self.sv_login,
        })
    }
}

/// Rates of one pool over the last few seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolRates {
    pub tps: f64,
    pub qps: f64,
    pub xact_avg_ms: f64,
    pub wait_avg_ms: f64,
}

/// Pooler-wide figures over the same window as `PoolRates`, for the dashboard's tiles.
#[derive(Debug, Clone, Copy, Default)]
pub struct Current {
    pub rates: PoolRates,
    pub xact_p99_ms: f64,
    /// How many seconds the window actually spans (less until enough readings exist).
    pub window_s: f64,
}

struct Reading {
    at: Instant,
    totals: Delta,
    xact_hist: [u64; LATENCY_BUCKETS],
    errors: u64,
    pools: HashMap<(String, String), Delta>,
}

#[derive(Default)]
pub struct History {
    samples: VecDeque<Sample>,
    /// The last few readings, newest last: the previous one for the sample, the oldest for
    /// per-pool rates.
    readings: VecDeque<Reading>,
    pool_rates: HashMap<(String, String), PoolRates>,
    current: Current,
}

fn rates(d: &Delta, o: &Delta, secs: f64) -> PoolRates {
    PoolRates {
        tps: per_sec(d.xacts, o.xacts, secs),
        qps: per_sec(d.queries, o.queries, secs),
        xact_avg_ms: avg_ms(d.xact_time_us, o.xact_time_us, d.xacts, o.xacts),
        wait_avg_ms: avg_ms(
            d.wait_time_us,
            o.wait_time_us,
            d.server_assignments,
            o.server_assignments,
        ),
    }
}

fn per_sec(new: u64, old: u64, secs: f64) -> f64 {
    new.saturating_sub(old) as f64 / secs
}

fn avg_ms(time_new: u64, time_old: u64, n_new: u64, n_old: u64) -> f64 {
    let n = n_new.saturating_sub(n_old);
    if n == 0 {
        0.0
    } else {
        time_new.saturating_sub(time_old) as f64 / n as f64 / 1000.0
    }
}

/// Estimates a quantile (0..1) of a histogram of bucket counts, in milliseconds, by
/// linear interpolation inside the bucket it falls in.
pub fn quantile_ms(buckets: &[u64; LATENCY_BUCKETS], q: f64) -> f64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut seen = 0.0;
    for (i, &n) in buckets.iter().enumerate() {
        let lo = if i == 0 { 0 } else { LATENCY_BOUNDS_US[i - 1] };
        let Some(&hi) = LATENCY_BOUNDS_US.get(i) else {
            return lo as f64 / 1000.0;
        };
        if n > 0 && seen + n as f64 >= rank {
            let frac = (rank - seen) / n as f64;
            return (lo as f64 + frac * (hi - lo) as f64) / 1000.0;
        }
        seen += n as f64;
    }
    0.0
}

impl History {
    /// Adds a sample from a fresh reading (the first reading only sets the baseline).
    pub fn record(&mut self, live: &Live, now_ms: u64, errors: u64) {
        let at = Instant::now();
        let totals = live.totals();
        let (xact_hist, _) = live.histograms();
        let pools: HashMap<(String, String), Delta> = live
            .pools
            .iter()
            .map(|p| ((p.database.clone(), p.user.clone()), p.totals))
            .collect();
        if let Some(prev) = self.readings.back() {
            let secs = at.duration_since(prev.at).as_secs_f64().max(0.001);
            let o = &prev.totals;
            let mut hist = [0u64; LATENCY_BUCKETS];
            for (i, h) in hist.iter_mut().enumerate() {
                *h = xact_hist[i].saturating_sub(prev.xact_hist[i]);
            }
            let mut s = Sample {
                t: now_ms,
                tps: per_sec(totals.xacts, o.xacts, secs),
                qps: per_sec(totals.queries, o.queries, secs),
                xact_avg_ms: avg_ms(totals.xact_time_us, o.xact_time_us, totals.xacts, o.xacts),
                xact_p50_ms: quantile_ms(&hist, 0.50),
                xact_p95_ms: quantile_ms(&hist, 0.95),
                xact_p99_ms: quantile_ms(&hist, 0.99),
                query_avg_ms: avg_ms(
                    totals.query_time_us,
                    o.query_time_us,
                    totals.queries,
                    o.queries,
                ),
                wait_avg_ms: avg_ms(
                    totals.wait_time_us,
                    o.wait_time_us,
                    totals.server_assignments,
                    o.server_assignments,
                ),
                recv_bps: per_sec(totals.received, o.received, secs),
                sent_bps: per_sec(totals.sent, o.sent, secs),
                errors: errors.saturating_sub(prev.errors),
                ..Sample::default()
            };
            for p in &live.pools {
                s.cl_active += p.cl_active;
                s.cl_waiting += p.cl_waiting;
                s.sv_active += p.sv_active;
                s.sv_idle += p.sv_idle;
                s.sv_login += p.sv_login;
                s.max_wait_ms = s.max_wait_ms.max(p.max_wait_us as f64 / 1000.0);
            }
            if self.samples.len() >= CAPACITY {
                self.samples.pop_front();
            }
            self.samples.push_back(s);
        }
        if let Some(oldest) = self.readings.front() {
            let secs = at.duration_since(oldest.at).as_secs_f64().max(0.001);
            self.pool_rates = pools
                .iter()
                .map(|(k, d)| {
                    let o = oldest.pools.get(k).copied().unwrap_or_default();
                    (k.clone(), rates(d, &o, secs))
                })
                .collect();
            let mut hist = [0u64; LATENCY_BUCKETS];
            for (i, h) in hist.iter_mut().enumerate() {
                *h = xact_hist[i].saturating_sub(oldest.xact_hist[i]);
            }
            self.current = Current {
                rates: rates(&totals, &oldest.totals, secs),
                xact_p99_ms: quantile_ms(&hist, 0.99),
                window_s: secs,
            };
        }
        if self.readings.len() >= POOL_WINDOW {
            self.readings.pop_front();
        }
        self.readings.push_back(Reading {
            at,
            totals,
            xact_hist,
            errors,
            pools,
        });
    }

    /// Samples newer than `since_ms`, as JSON.
    pub fn since(&self, since_ms: u64) -> Vec<Value> {
        self.samples
            .iter()
            .filter(|s| s.t > since_ms)
            .map(|s| s.to_json())
            .collect()
    }

    /// The tiles' figures, over the pools table's window.
    pub fn current(&self) -> Current {
        self.current
    }

    pub fn pool_rates(&self, database: &str, user: &str) -> PoolRates {
        self.pool_rates
            .get(&(database.to_owned(), user.to_owned()))
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let mut b = [0u64; LATENCY_BUCKETS];
        // 100 observations in (100us, 250us].
        b[1] = 100;
        assert!((quantile_ms(&b, 0.5) - 0.175).abs() < 1e-9);
        assert!((quantile_ms(&b, 1.0) - 0.25).abs() < 1e-9);
        assert_eq!(quantile_ms(&[0; LATENCY_BUCKETS], 0.5), 0.0);
        let mut slow = [0u64; LATENCY_BUCKETS];
        slow[LATENCY_BUCKETS - 1] = 1;
        assert_eq!(quantile_ms(&slow, 0.99), 10_000.0);
    }
}
