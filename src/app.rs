//! The state every task shares: the current configuration snapshot, the pools, the cancel
//! registry and the shutdown signal.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use weir_auth::Secret;
use weir_config::{AuthFile, Config, Database, LogFormat, PoolMode};

use crate::pool::{Limit, Limits, Pool, PoolSettings};
use crate::server::{ServerAddr, ServerTarget};

/// A configuration and the auth_file it names, loaded together and swapped together.
pub struct Snapshot {
    pub config: Config,
    pub auth_file: AuthFile,
    /// The auth_file's secrets, parsed once here rather than at every login.
    secrets: HashMap<String, Secret>,
    /// TLS towards clients, with the certificates and keys as read at this load.
    pub client_tls: Arc<crate::tls::accept::ClientTls>,
    /// TLS towards servers, likewise.
    pub server_tls: Arc<crate::tls::connect::ServerTls>,
    /// auth_hba_file and auth_ident_file as read at this load.
    pub hba: Option<Arc<weir_config::hba::Hba>>,
    pub ident: Option<Arc<weir_config::hba::Ident>>,
    /// auth_ldap_options, for auth_type ldap.
    pub ldap: Option<Arc<weir_config::ldap::LdapOptions>>,
}

type AuthFiles = (
    Option<Arc<weir_config::hba::Hba>>,
    Option<Arc<weir_config::hba::Ident>>,
);

/// auth_hba_file (needed by auth_type hba) and auth_ident_file.
fn auth_files(g: &weir_config::General) -> Result<AuthFiles, String> {
    let hba = match (&g.auth_hba_file, g.auth_type) {
        (Some(p), _) => Some(Arc::new(weir_config::hba::Hba::load(p)?)),
        (None, weir_config::AuthType::Hba) => {
            return Err("auth_type = hba needs auth_hba_file".into())
        }
        (None, _) => None,
    };
    let ident = match &g.auth_ident_file {
        Some(p) => Some(Arc::new(weir_config::hba::Ident::load(p)?)),
        None => None,
    };
    Ok((hba, ident))
}

/// auth_ldap_options (needed by auth_type ldap); and, for auth_type pam, that libpam can
/// be loaded. A mistake fails the load, or the console's SET.
fn external_auth(
    g: &weir_config::General,
) -> Result<Option<Arc<weir_config::ldap::LdapOptions>>, String> {
    use weir_config::AuthType;
    let ldap = match (&g.auth_ldap_options, g.auth_type) {
        (Some(text), _) => Some(Arc::new(
            weir_config::ldap::LdapOptions::parse_str(text)
                .map_err(|e| format!("auth_ldap_options: {e}"))?,
        )),
        (None, AuthType::Ldap) => return Err("auth_type = ldap needs auth_ldap_options".into()),
        (None, _) => None,
    };
    if g.auth_type == AuthType::Pam {
        crate::external_auth::pam::check_available(g.auth_pam_confdir.as_deref())?;
    }
    Ok(ldap)
}

impl Snapshot {
    fn assemble(
        config: Config,
        auth_file: AuthFile,
        client_tls: Arc<crate::tls::accept::ClientTls>,
        server_tls: Arc<crate::tls::connect::ServerTls>,
        (hba, ident): AuthFiles,
        ldap: Option<Arc<weir_config::ldap::LdapOptions>>,
    ) -> Snapshot {
        let secrets = auth_file
            .iter()
            .map(|(user, text)| (user.clone(), Secret::parse(text)))
            .collect();
        Snapshot {
            config,
            auth_file,
            secrets,
            client_tls,
            server_tls,
            hba,
            ident,
            ldap,
        }
    }

    /// Startup and RELOAD: a file that cannot be used fails the whole load, so that the
    /// configuration in force (SHOW CONFIG) is never one whose TLS is not. Each TLS side
    /// is built once, here: checking it and building it again later would let a file
    /// that changed in between leave a side without the TLS its mode asks for.
    pub fn load(path: &Path) -> Result<Snapshot, String> {
        let mut config = weir_config::load(path).map_err(|e| e.to_string())?;
        // PgBouncer's words for TLS files or settings it cannot use, at start and reload.
        let setup = |e: String| format!("TLS setup failed: {e}");
        // The console may give the pair one at a time; a file giving half of it is a
        // mistake to refuse where it was made.
        let g = &config.general;
        if g.server_tls_cert_file.is_some() != g.server_tls_key_file.is_some() {
            return Err(setup(
                "server TLS: server_tls_cert_file and server_tls_key_file go together".into(),
            ));
        }
        let client_tls =
            Arc::new(crate::tls::accept::ClientTls::from_config(&config.general).map_err(setup)?);
        let server_tls =
            Arc::new(crate::tls::connect::ServerTls::from_config(&config.general).map_err(setup)?);
        config
            .notices
            .extend(crate::tls::protocol_notices(&config.general));
        let auth = auth_files(&config.general)?;
        let ldap = external_auth(&config.general)?;
        let auth_file = match &config.general.auth_file {
            Some(p) => {
                let loaded =
                    weir_config::load_auth_file_with_notices(p).map_err(|e| e.to_string())?;
                // Logged with the configuration's own, once per load.
                config.notices.extend(loaded.notices);
                loaded.users
            }
            None => AuthFile::default(),
        };
        Ok(Snapshot::assemble(
            config, auth_file, client_tls, server_tls, auth, ldap,
        ))
    }

    /// The console's SET: `config` is this snapshot's with the options `changed` (lower
    /// case) set. A TLS side none of whose options changed keeps the rustls
    /// configuration in force, files unread, so that a SET of something else cannot turn
    /// TLS off or fail on a file that went bad since (the next RELOAD finds that). A side
    /// whose options changed is built from them as a group, and the SET is refused if it
    /// cannot be: TLS settings in SHOW CONFIG are always those in force.
    pub fn with_options(&self, config: Config, changed: &[String]) -> Result<Snapshot, String> {
        let touches = |side: &str| changed.iter().any(|k| k.starts_with(side));
        let client_tls = if touches("client_tls") {
            Arc::new(crate::tls::accept::ClientTls::from_config(&config.general)?)
        } else {
            self.client_tls.clone()
        };
        let server_tls = if touches("server_tls") {
            let tls = crate::tls::connect::ServerTls::from_config(&config.general)?;
            for notice in crate::tls::protocol_notices(&config.general) {
                tracing::warn!("{notice}");
            }
            Arc::new(tls)
        } else {
            self.server_tls.clone()
        };
        // Without readable HBA rules every auth_type hba login is refused (no rule
        // matches), so this fails closed.
        let auth = auth_files(&config.general).unwrap_or_else(|e| {
            tracing::error!("{e}");
            (None, None)
        });
        let ldap = external_auth(&config.general)?;
        Ok(Snapshot::assemble(
            config,
            self.auth_file.clone(),
            client_tls,
            server_tls,
            auth,
            ldap,
        ))
    }

    /// The database entry a client's database name resolves to, with the name PostgreSQL
    /// should see: an explicit entry, else the `*` fallback under the client's own name.
    pub fn resolve_database<'a>(&'a self, name: &'a str) -> Option<(&'a Database, &'a str)> {
        let db = self
            .config
            .database(name)
            .or(self.config.fallback_database.as_ref())?;
        Some((db, db.dbname.as_deref().unwrap_or(name)))
    }

    pub fn secret(&self, user: &str) -> Option<&Secret> {
        self.secrets.get(user)
    }

    pub fn pool_mode(&self, db: &Database, user: &str) -> PoolMode {
        self.config
            .users
            .get(user)
            .and_then(|u| u.pool_mode)
            .or(db.pool_mode)
            .unwrap_or(self.config.general.pool_mode)
    }
}

pub struct App {
    pub config_path: PathBuf,
    pub snapshot: ArcSwap<Snapshot>,
    /// Database name, then server user: looked up with borrowed names at every login.
    pools: Mutex<HashMap<String, HashMap<String, Arc<Pool>>>>,
    /// max_db_connections and max_user_connections, shared by the pools of a database or user.
    db_limits: Mutex<HashMap<String, Arc<Limit>>>,
    user_limits: Mutex<HashMap<String, Arc<Limit>>>,
    /// Hands out pool target generations: a reload that changes how a pool reaches its
    /// servers gives it a new one, so connections opened under the old one are closed.
    generation: AtomicU64,
    pub clients: AtomicUsize,
    pub shutdown: CancellationToken,
}

impl App {
    pub fn new(config_path: PathBuf, snapshot: Snapshot) -> Arc<App> {
        crate::conn_log::configure(&snapshot.config.general);
        crate::server::cancel_wait::configure(&snapshot.config.general);
        crate::logging::set_json(snapshot.config.general.log_format == LogFormat::Json);
        crate::login_notice::configure(&snapshot.config.general);
        Arc::new(App {
            config_path,
            snapshot: ArcSwap::from_pointee(snapshot),
            pools: Mutex::new(HashMap::new()),
            db_limits: Mutex::new(HashMap::new()),
            user_limits: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(1),
            clients: AtomicUsize::new(0),
            shutdown: CancellationToken::new(),
        })
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Arc<Pool>>>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool for a database entry and the user Weir logs in as, created on first use.
    pub fn pool(&self, snap: &Snapshot, db_name: &str, client_user: &str) -> Option<Arc<Pool>> {
        let (db, _) = snap.resolve_database(db_name)?;
        let server_user = db.user.as_deref().unwrap_or(client_user);
        self.pool_as(snap, db_name, server_user)
    }

    /// The pool for a database entry and an explicit server user. A database with a forced
    /// `user=` has one pool per entry, keyed by and sized for that user, as PgBouncer's: the
    /// `[users]` settings of whoever logs in through it do not apply to it.
    pub fn pool_as(&self, snap: &Snapshot, db_name: &str, server_user: &str) -> Option<Arc<Pool>> {
        let (db, server_db) = snap.resolve_database(db_name)?;
        let mut pools = self.pools();
        if let Some(p) = pools.get(db_name).and_then(|users| users.get(server_user)) {
            return Some(p.clone());
        }
        if !pools.contains_key(db_name) && snap.config.database(db_name).is_none() {
            // PgBouncer's line for the first pool of a name only the `*` entry serves.
            tracing::info!("registered new auto-database: db={db_name}");
        }
        let server_user = server_user.to_owned();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let limits = self.limits(snap, db_name, db, &server_user);
        let settings = pool_settings(
            snap,
            db_name,
            db,
            server_db,
            &server_user,
            generation,
            limits,
        );
        let pool = Pool::new(db_name.to_owned(), server_user.clone(), settings);
        self.sync_reader(&pool);
        pools
            .entry(db_name.to_owned())
            .or_default()
            .insert(server_user, pool.clone());
        Some(pool)
    }

    /// Creates the pool of every database entry with a forced user and a min_pool_size, so
    /// that its janitor opens those servers before any client arrives, as PgBouncer does
    /// for forced-user databases (other pools are created by their first client).
    pub fn open_forced_pools(&self) {
        let snap = self.snapshot.load_full();
        let g = &snap.config.general;
        for (name, db) in &snap.config.databases {
            if let Some(user) = &db.user {
                if db.min_pool_size.unwrap_or(g.min_pool_size) > 0 {
                    self.pool_as(&snap, name, user);
                }
            }
        }
    }

    /// The shared limits for a database entry and a server user, created on first use and
    /// updated to the snapshot's values.
    fn limits(&self, snap: &Snapshot, db_name: &str, db: &Database, user: &str) -> Limits {
        let g = &snap.config.general;
        let db_max = db.max_db_connections.unwrap_or(g.max_db_connections) as usize;
        let user_max = snap
            .config
            .users
            .get(user)
            .and_then(|u| u.max_user_connections)
            .unwrap_or(g.max_user_connections) as usize;
        let get = |map: &Mutex<HashMap<String, Arc<Limit>>>, key: &str, max: usize| {
            let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
            let limit = map
                .entry(key.to_owned())
                .or_insert_with(|| Limit::new(max))
                .clone();
            limit.set_max(max);
            limit
        };
        Limits {
            db: Some(get(&self.db_limits, db_name, db_max)),
            user: Some(get(&self.user_limits, user, user_max)),
        }
    }

    /// A split pool has a pool of reads beside it, with settings that follow its own.
    fn sync_reader(&self, pool: &Arc<Pool>) {
        let settings = pool.settings();
        if settings.split.is_none() {
            if let Some(r) = pool.reader.swap(None) {
                // Its servers are closed as they are given back; its clients moved on.
                let mut s = (**r.settings()).clone();
                s.min_pool_size = 0;
                s.target.generation = self.generation.fetch_add(1, Ordering::Relaxed);
                r.update_settings(s);
            }
            return;
        }
        match pool.reader.load_full() {
            Some(r) => {
                let old = r.settings().target.generation;
                let mut s = reader_settings(&settings, old);
                if !same_target(&s.target, &r.settings().target) {
                    s.target.generation = self.generation.fetch_add(1, Ordering::Relaxed);
                }
                r.update_settings(s);
            }
            None => {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                let r = Pool::with_role(
                    pool.database.clone(),
                    pool.user.clone(),
                    reader_settings(&settings, generation),
                    true,
                );
                pool.reader.store(Some(r));
            }
        }
    }

    /// Every pool and every pool of reads (PAUSE, RECONNECT, KILL and the host checks
    /// act on both).
    pub fn all_pools_with_readers(&self) -> Vec<Arc<Pool>> {
        let mut v = self.all_pools();
        let readers: Vec<_> = v.iter().filter_map(|p| p.reader.load_full()).collect();
        v.extend(readers);
        v
    }

    /// Takes out of the map those of the pools named by (database, server user) that
    /// `free` picks, and returns them. `free` runs under the map's lock, through which
    /// every login gets its pool: a pool nothing else holds then cannot be got meanwhile.
    pub(crate) fn free_pools(
        &self,
        names: &[(String, String)],
        free: impl Fn(&Arc<Pool>) -> bool,
    ) -> Vec<Arc<Pool>> {
        let mut pools = self.pools();
        let mut freed = Vec::new();
        for (db, user) in names {
            let Some(users) = pools.get_mut(db) else {
                continue;
            };
            if users.get(user).is_some_and(&free) {
                freed.extend(users.remove(user));
            }
            if users.is_empty() {
                pools.remove(db);
            }
        }
        freed
    }

    /// Every pool, for the admin console and metrics.
    pub fn all_pools(&self) -> Vec<Arc<Pool>> {
        self.pools()
            .values()
            .flat_map(|u| u.values())
            .cloned()
            .collect()
    }

    /// Swaps in a reloaded configuration. Pools keep their servers unless the way to reach
    /// them changed; pools whose database is gone drain: their clients finish the
    /// transaction in progress and are then closed with "database removed".
    pub fn apply(&self, snap: Snapshot) {
        let pools = self.all_pools();
        for pool in pools {
            let Some((db, server_db)) = snap.resolve_database(&pool.database) else {
                // Its clients keep their servers to the end of their transaction, but no
                // more are opened for nobody: the idle ones go at server_idle_timeout.
                if pool.settings().min_pool_size > 0 {
                    let mut settings = (**pool.settings()).clone();
                    settings.min_pool_size = 0;
                    pool.update_settings(settings);
                }
                if !pool.is_removed() {
                    pool.set_removed(true);
                    // Idle and parked clients are woken to leave now (PARK rather than
                    // STOP: STOP stays set, and would spin a client whose database a
                    // later reload brings back).
                    for c in crate::registry::clients::CLIENTS.snapshot() {
                        if *c.database == *pool.database {
                            c.raise(crate::registry::clients::PARK);
                        }
                    }
                }
                continue;
            };
            pool.set_removed(false);
            let old = pool.settings();
            let limits = self.limits(&snap, &pool.database, db, &pool.user);
            let mut settings = pool_settings(
                &snap,
                &pool.database,
                db,
                server_db,
                &pool.user,
                old.target.generation,
                limits,
            );
            if settings.target.secret.is_none() && old.secret_learnt {
                settings.target.secret = old.target.secret.clone();
                settings.secret_learnt = true;
            }
            if !same_target(&settings.target, &old.target) {
                settings.target.generation = self.generation.fetch_add(1, Ordering::Relaxed);
            }
            pool.update_settings(settings);
            self.sync_reader(&pool);
        }
        crate::conn_log::configure(&snap.config.general);
        crate::server::cancel_wait::configure(&snap.config.general);
        crate::logging::set_json(snap.config.general.log_format == LogFormat::Json);
        crate::login_notice::configure(&snap.config.general);
        crate::server::hosts::retain(|name| snap.resolve_database(name).is_some());
        crate::split::retain(|name| snap.resolve_database(name).is_some());
        self.snapshot.store(Arc::new(snap));
        self.open_forced_pools();
    }
}

fn same_target(a: &ServerTarget, b: &ServerTarget) -> bool {
    a.addr == b.addr
        && a.hosts.same_as(&b.hosts)
        && a.attrs == b.attrs
        && a.user == b.user
        && a.database == b.database
        && a.secret == b.secret
        && a.startup_params == b.startup_params
        && a.connect_query == b.connect_query
        && a.tcp == b.tcp
        && a.tls == b.tls
}

/// Where PostgreSQL's Unix socket is when a database entry names no host.
fn default_socket_dir() -> &'static str {
    if Path::new("/var/run/postgresql").is_dir() {
        "/var/run/postgresql"
    } else {
        "/tmp"
    }
}

/// Where a database entry's server listens (its first host).
pub fn server_addr(db: &Database) -> ServerAddr {
    host_addr(db, 0)
}

/// Where each of a database entry's hosts listens, in order.
pub fn server_addrs(db: &Database) -> Vec<ServerAddr> {
    (0..db.host.len().max(1))
        .map(|i| host_addr(db, i))
        .collect()
}

/// The host set (see server::hosts) of a database entry.
pub fn host_set(name: &str, db: &Database) -> Arc<crate::server::hosts::HostSet> {
    crate::server::hosts::for_database(
        name,
        server_addrs(db),
        db.load_balance_hosts
            .unwrap_or(weir_config::LoadBalanceHosts::RoundRobin),
        write_attrs(db),
        &db.host_weights,
    )
}

/// Every host of every database entry (SHOW HOSTS, the dashboard): entries no pool has
/// used yet are listed too, with what is known: nothing.
pub fn host_rows(app: &App) -> Vec<crate::server::hosts::HostRow> {
    let snap = app.snapshot.load();
    for (name, db) in &snap.config.databases {
        host_set(name, db);
    }
    crate::server::hosts::rows()
}

fn host_addr(db: &Database, index: usize) -> ServerAddr {
    let port = db.port_for(index);
    match db.host.get(index).map(String::as_str) {
        None | Some("") => ServerAddr::Unix {
            path: PathBuf::from(format!("{}/.s.PGSQL.{port}", default_socket_dir())),
        },
        Some(h) if h.starts_with('/') => ServerAddr::Unix {
            path: PathBuf::from(format!("{h}/.s.PGSQL.{port}")),
        },
        Some(h) => ServerAddr::Tcp {
            host: h.to_owned(),
            port,
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn pool_settings(
    snap: &Snapshot,
    name: &str,
    db: &Database,
    server_db: &str,
    server_user: &str,
    generation: u64,
    limits: Limits,
) -> PoolSettings {
    let g = &snap.config.general;
    let user = snap.config.users.get(server_user);
    let secret = match (&db.user, &db.password) {
        (Some(_), Some(p)) => Some(Secret::parse(p)),
        _ => snap.secret(server_user).cloned(),
    };
    let mut startup_params = Vec::new();
    for (name, value) in [
        ("client_encoding", &db.client_encoding),
        ("DateStyle", &db.datestyle),
        ("TimeZone", &db.timezone),
    ] {
        if let Some(v) = value {
            startup_params.push((name.to_owned(), v.clone()));
        }
    }
    PoolSettings {
        pool_size: user
            .and_then(|u| u.pool_size)
            .or(db.pool_size)
            .unwrap_or(g.default_pool_size) as usize,
        target: ServerTarget {
            addr: server_addr(db),
            hosts: host_set(name, db),
            attrs: write_attrs(db),
            user: server_user.to_owned(),
            database: server_db.to_owned(),
            secret,
            startup_params,
            connect_query: db.connect_query.clone(),
            connect_timeout: g.server_connect_timeout,
            tcp: crate::tcp_options::TcpOptions::from_config(g),
            tls: snap.server_tls.clone(),
            generation,
        },
        reserve_pool_size: user
            .and_then(|u| u.reserve_pool_size)
            .or(db.reserve_pool_size)
            .unwrap_or(g.reserve_pool_size) as usize,
        reserve_pool_timeout: g.reserve_pool_timeout,
        min_pool_size: db.min_pool_size.unwrap_or(g.min_pool_size) as usize,
        server_check_query: match g.server_check_query.as_deref() {
            None | Some("") => None,
            Some("<empty>") => Some(String::new()),
            Some(q) => Some(q.to_owned()),
        },
        server_check_delay: g.server_check_delay,
        limits,
        query_wait_timeout: user
            .and_then(|u| u.query_wait_timeout)
            .or(db.query_wait_timeout)
            .unwrap_or(g.query_wait_timeout),
        server_lifetime: db.server_lifetime.unwrap_or(g.server_lifetime),
        server_idle_timeout: g.server_idle_timeout,
        server_login_retry: g.server_login_retry,
        server_reset_query: g.server_reset_query.clone().unwrap_or_default(),
        server_reset_query_always: g.server_reset_query_always,
        round_robin: g.server_round_robin,
        pipeline: crate::pool::PipelineSettings {
            // In session mode a server is never shared between requests; with
            // read_write_split, requests wait on the primary's WAL (split::lsn) first.
            depth: if snap.pool_mode(db, server_user) == PoolMode::Session || db.read_write_split {
                0
            } else {
                db.pipeline_depth.unwrap_or(g.pipeline_depth) as usize
            },
            slow: g.pipeline_slow_query,
        },
        secret_learnt: false,
        fast_close: g.server_fast_close && snap.pool_mode(db, server_user) == PoolMode::Session,
        prepared_cap: if snap.pool_mode(db, server_user) == PoolMode::Session {
            0
        } else {
            g.max_prepared_statements.min(u16::MAX.into()) as u16
        },
        split: splits(snap, db, server_user)
            .then(|| crate::split::entry(name, db.max_replica_lag.unwrap_or(g.max_replica_lag))),
    }
}

/// Whether a database entry's pools split reads from writes: asked for, in a pooled mode
/// (in session mode a client keeps its server, there is nothing to route).
fn splits(snap: &Snapshot, db: &Database, server_user: &str) -> bool {
    db.read_write_split && snap.pool_mode(db, server_user) != PoolMode::Session
}

/// What a host must be for a pool's connections: the entry's target_session_attrs, but a
/// split entry's own pool is for writes, and goes to a writable host.
fn write_attrs(db: &Database) -> weir_config::TargetSessionAttrs {
    use weir_config::TargetSessionAttrs as A;
    let attrs = db.target_session_attrs.unwrap_or(A::Any);
    match attrs {
        A::ReadWrite | A::Primary => attrs,
        _ if db.read_write_split => A::ReadWrite,
        _ => attrs,
    }
}

/// The settings of a split entry's pool of reads: its main pool's, reaching for standbys.
fn reader_settings(main: &PoolSettings, generation: u64) -> PoolSettings {
    let mut s = main.clone();
    s.target.attrs = weir_config::TargetSessionAttrs::PreferStandby;
    s.target.generation = generation;
    s
}
