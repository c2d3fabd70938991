//! auth_type = pam and auth_type = ldap / hba `ldap`, against the real thing: libpam with
//! service files the tests write (pam_permit, pam_deny, pam_exec running a script), and
//! a scratch OpenLDAP slapd; clients are tokio-postgres and psql through Weir to a real
//! PostgreSQL. PgBouncer's suite: test_pam_negative, test_pam_positive, test_pam_exec,
//! test_ldap_auth.
//!
//! The PAM service files go to a directory of the test's own (auth_pam_confdir), so tests
//! running at once never share /etc/pam.d/pgbouncer.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

async fn refused(port: u16, user: &str, password: &str) -> ErrorFields {
    let e = connect_pw(port, "postgres", user, password)
        .await
        .err()
        .unwrap_or_else(|| panic!("{user}/{password} got in"));
    expect_db_error(&e)
}

async fn logs_in(weir: &Weir, user: &str, password: &str) {
    let c = connect_pw(weir.port(), "postgres", user, password)
        .await
        .unwrap_or_else(|e| panic!("{user}: {e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select current_user").await, user);
}

/// psql through Weir with a password.
fn psql_pw(weir: &Weir, user: &str, password: &str, sql: &str) -> Result<String, String> {
    psql_at(
        "127.0.0.1",
        weir.port(),
        "postgres",
        user,
        Some(password),
        sql,
    )
}

/// Weir's stderr, once it stopped at startup as it must.
fn refused_at_load(builder: WeirBuilder) -> String {
    let mut weir = builder.spawn();
    assert!(weir
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    weir.stderr()
}

fn count(weir: &Weir, text: &str) -> usize {
    weir.logfile().matches(text).count()
}

// ---------------------------------------------------------------------------
// PAM

/// A PAM service "pgbouncer" in `dir` that runs `script` through pam_exec, which hands
/// it the password on stdin (expose_authtok) and PAM_USER, PAM_SERVICE, PAM_RHOST,
/// PAM_TYPE in its environment.
fn pam_exec_service(dir: &Path, script: &Path) {
    write(
        dir,
        "pgbouncer",
        &format!(
            "auth required pam_exec.so expose_authtok /bin/sh {}\n\
             account required pam_permit.so\n",
            script.display()
        ),
    );
}

/// A PostgreSQL with role alice/alicepw, and a directory holding `script` and a PAM
/// directory (for auth_pam_confdir) whose "pgbouncer" service runs it.
fn pam_setup(script: impl FnOnce(&Path) -> String) -> (PgServer, tempfile::TempDir, PathBuf) {
    let pg = PgServer::start();
    pg.create_user("alice", "alicepw", "md5");
    let dir = tempfile::tempdir().expect("tmp");
    let text = script(dir.path());
    let script = write(dir.path(), "check.sh", &text);
    let confdir = dir.path().join("pam.d");
    std::fs::create_dir(&confdir).expect("mkdir");
    pam_exec_service(&confdir, &script);
    (pg, dir, confdir)
}

/// PgBouncer's test_pam_exec, test_pam_positive and test_pam_negative in one Weir:
/// PAM gets the user, the password, the service name and the client's address; a wrong
/// password is refused with PgBouncer's words and logged once; pam_permit lets anyone
/// in, pam_deny no one. The service file is read at each login, so it is rewritten
/// between the cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pam_checks_the_password_with_the_pgbouncer_service() {
    let (pg, dir, confdir) = pam_setup(|d| {
        format!(
            "read -r pw\n\
             echo \"$PAM_USER $pw $PAM_SERVICE $PAM_RHOST $PAM_TYPE\" >> {seen}\n\
             [ \"$PAM_USER\" = alice ] || exit 1\n\
             [ \"$pw\" = alicepw ] || exit 3\n\
             [ \"$PAM_SERVICE\" = pgbouncer ] || exit 5\n\
             [ \"$PAM_RHOST\" = 127.0.0.1 ] || exit 8\n\
             exit 0\n",
            seen = d.join("seen").display()
        )
    });
    let seen = dir.path().join("seen");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "pam")
        .set("auth_pam_confdir", confdir.display())
        // Not read under PAM: a wrong password here must not matter.
        .userlist(&[("alice", "not-this-one")])
        .start();

    logs_in(&weir, "alice", "alicepw").await;
    let lines = std::fs::read_to_string(&seen).expect("the script ran");
    assert_eq!(lines.trim(), "alice alicepw pgbouncer 127.0.0.1 auth");

    let before = count(&weir, "pam_authenticate() failed");
    let f = refused(weir.port(), "alice", "wrong").await;
    assert_eq!(
        (f.severity.as_str(), f.code.as_str(), f.message.as_str()),
        ("FATAL", "28P01", "PAM authentication failed")
    );
    weir.wait_for_log("pam_conversation(): PAM error: /bin/sh failed: exit code 3");
    weir.wait_for_log("pam_authenticate() failed");
    assert_eq!(count(&weir, "pam_authenticate() failed"), before + 1);

    // Another user, through psql: PAM_USER is who the client says it is.
    let e = psql_pw(&weir, "bob", "alicepw", "select 1").expect_err("bob got in");
    assert!(e.contains("PAM authentication failed"), "{e}");
    weir.wait_for_log("/bin/sh failed: exit code 1");

    // test_pam_positive: pam_permit takes any password.
    write(
        &confdir,
        "pgbouncer",
        "auth required pam_permit.so\naccount required pam_permit.so\n",
    );
    logs_in(&weir, "alice", "anything at all").await;
    assert_eq!(
        psql_pw(&weir, "alice", "also fine", "select 41 + 1").expect("psql"),
        "42"
    );

    // test_pam_negative: pam_deny takes none; and the account step counts too
    // (authenticated, but the account refused).
    for (auth, account, logged) in [
        (
            "pam_deny",
            "pam_deny",
            "pam_authenticate() failed: Authentication failure",
        ),
        ("pam_permit", "pam_deny", "pam_acct_mgmt() failed"),
    ] {
        let service = format!("auth required {auth}.so\naccount required {account}.so\n");
        write(&confdir, "pgbouncer", &service);
        let f = refused(weir.port(), "alice", "alicepw").await;
        assert_eq!(f.message, "PAM authentication failed");
        weir.wait_for_log(logged);
    }
}

/// A PAM check blocks its thread for as long as the module takes; it must not block the
/// runtime. With one worker, a client already logged in runs queries while another
/// login is held inside PAM (its script waits for a file the test writes only after
/// those queries answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_pam_module_does_not_stall_other_clients() {
    let (pg, dir, confdir) = pam_setup(|d| {
        format!(
            "read -r pw\n\
             [ \"$pw\" = slow ] || exit 0\n\
             touch {entered}\n\
             i=0; while [ ! -e {go} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n\
             exit 0\n",
            entered = d.join("entered").display(),
            go = d.join("go").display()
        )
    });
    let go = dir.path().join("go");
    let entered = dir.path().join("entered");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "pam")
        .set("auth_pam_confdir", confdir.display())
        .set("workers", 1)
        .start();
    let early = connect_pw(weir.port(), "postgres", "alice", "fast")
        .await
        .expect("login");
    let port = weir.port();
    let held = tokio::spawn(async move { connect_pw(port, "postgres", "alice", "slow").await });
    assert!(
        eventually_async(Duration::from_secs(10), || {
            let entered = entered.clone();
            async move { entered.exists() }
        })
        .await,
        "the slow login never reached PAM"
    );
    for i in 0..5 {
        let sql = format!("select {i}");
        assert_eq!(q1(&early, &sql).await, i.to_string());
    }
    assert!(!held.is_finished(), "the slow login did not wait in PAM");
    std::fs::write(&go, "").expect("go");
    let late = held.await.expect("join").expect("slow login");
    assert_eq!(q1(&late, "select 7").await, "7");
}

/// auth_type = pam with an auth_pam_confdir that does not exist still loads (PAM finds
/// no service there and refuses every login, as libpam does), and a config asking for a
/// PAM this machine has is not refused: the check at load is about libpam itself.
#[test]
fn pam_without_a_service_file_refuses_logins() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "pam")
        .set("auth_pam_confdir", dir.path().join("none").display())
        .start();
    let e = psql_pw(&weir, "postgres", "x", "select 1").expect_err("got in without a PAM service");
    assert!(e.contains("PAM authentication failed"), "{e}");
}

// ---------------------------------------------------------------------------
// LDAP

/// A scratch OpenLDAP server on 127.0.0.1: dc=example,dc=net with ldapuser1/secret1 and
/// ldapuser2/secret2 under ou=people, and a search user cn=reader/readerpw.
struct Slapd {
    child: Child,
    port: u16,
    /// With TLS: where it speaks ldaps (its `port` then also takes StartTLS).
    ldaps_port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Slapd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Slapd {
    /// `tls`: a CA and `server.crt`/`server.key` (127.0.0.1) for ldaps and StartTLS.
    fn start(tls: Option<&common::tls::Certs>) -> Slapd {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        std::fs::create_dir(d.join("db")).expect("mkdir");
        let conf = write(
            d,
            "slapd.conf",
            &format!(
                "include /etc/ldap/schema/core.schema\n\
                 include /etc/ldap/schema/cosine.schema\n\
                 include /etc/ldap/schema/inetorgperson.schema\n\
                 modulepath /usr/lib/ldap\n\
                 moduleload back_mdb\n\
                 pidfile {d}/slapd.pid\n\
                 database mdb\n\
                 maxsize 10485760\n\
                 suffix \"dc=example,dc=net\"\n\
                 rootdn \"cn=admin,dc=example,dc=net\"\n\
                 rootpw adminpw\n\
                 directory {d}/db\n{tls}",
                d = d.display(),
                tls = tls.map_or(String::new(), |c| format!(
                    "TLSCACertificateFile {}\nTLSCertificateFile {}\n\
                     TLSCertificateKeyFile {}\n",
                    c.p("ca.crt"),
                    c.p("server.crt"),
                    c.p("server.key")
                ))
            ),
        );
        let mut ldif = String::from(
            "dn: dc=example,dc=net\nobjectClass: dcObject\nobjectClass: organization\n\
             o: example\ndc: example\n\n\
             dn: ou=people,dc=example,dc=net\nobjectClass: organizationalUnit\nou: people\n\n\
             dn: cn=reader,dc=example,dc=net\nobjectClass: person\ncn: reader\nsn: reader\n\
             userPassword: readerpw\n\n",
        );
        for n in 1..=2 {
            ldif.push_str(&format!(
                "dn: uid=ldapuser{n},ou=people,dc=example,dc=net\n\
                 objectClass: inetOrgPerson\nuid: ldapuser{n}\ncn: ldapuser{n}\nsn: user\n\
                 mail: user{n}@example.net\nuserPassword: secret{n}\n\n"
            ));
        }
        let data = write(d, "data.ldif", &ldif);
        let out = Command::new("slapadd")
            .arg("-f")
            .arg(&conf)
            .arg("-l")
            .arg(&data)
            .output()
            .expect("slapadd (scripts/install-deps installs slapd)");
        assert!(out.status.success(), "slapadd: {out:?}");
        for _ in 0..3 {
            let (port, ldaps_port) = (free_port(), free_port());
            let mut urls = format!("ldap://127.0.0.1:{port}/");
            if tls.is_some() {
                urls.push_str(&format!(" ldaps://127.0.0.1:{ldaps_port}/"));
            }
            let mut child = Command::new("slapd")
                .arg("-f")
                .arg(&conf)
                .arg("-h")
                .arg(&urls)
                // Stays in the foreground, so that it is this child and ends with it.
                .args(["-d", "0"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("slapd");
            let up = eventually(Duration::from_secs(10), || {
                matches!(child.try_wait(), Ok(None))
                    && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
            if up {
                return Slapd {
                    child,
                    port,
                    ldaps_port,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("slapd did not start");
    }
}

fn ldap_weir(pg: &PgServer, dir: &Path, hba_options: &str) -> WeirBuilder {
    let hba = format!(
        "host all ldapuser1,ldapuser2 127.0.0.1/32 ldap {hba_options}\n\
         host all all 127.0.0.1/32 md5\n"
    );
    Weir::for_pg(pg)
        .set("auth_type", "hba")
        .set("auth_hba_file", write(dir, "hba.conf", &hba).display())
        .userlist(&[("postgres", "pgpw")])
}

/// PgBouncer's test_ldap_auth: hba `ldap` in its simple-bind form (ldapprefix,
/// ldapsuffix) and its search+bind forms (ldapbasedn with the default attribute, with
/// ldapsearchattribute, with a search filter and a bind DN, an LDAP URL), then
/// auth_type = ldap with auth_ldap_options. The right password logs in and runs a
/// query; a wrong one gets PgBouncer's "LDAP authentication failed" (28P01), logged
/// once with the server's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_simple_bind_and_search_bind() {
    let ldap = Slapd::start(None);
    let pg = PgServer::start();
    pg.create_user("ldapuser1", "secret1", "md5");
    pg.create_user("ldapuser2", "secret2", "md5");
    let dir = tempfile::tempdir().expect("tmp");
    let p = ldap.port;

    // 1. Simple bind.
    let weir = ldap_weir(
        &pg,
        dir.path(),
        &format!(
            "ldapserver=127.0.0.1 ldapport={p} ldapprefix=\"uid=\" \
             ldapsuffix=\",ou=people,dc=example,dc=net\""
        ),
    )
    .start();
    logs_in(&weir, "ldapuser1", "secret1").await;
    let f = refused(weir.port(), "ldapuser1", "secret2").await;
    assert_eq!(
        (f.severity.as_str(), f.code.as_str(), f.message.as_str()),
        ("FATAL", "28P01", "LDAP authentication failed")
    );
    weir.wait_for_log(
        "LDAP login failed for user uid=ldapuser1,ou=people,dc=example,dc=net on server 127.0.0.1",
    );
    assert_eq!(count(&weir, "LDAP login failed"), 1);
    // Users the rule does not name go on to the next one (md5 from auth_file).
    let c = connect_pw(weir.port(), "postgres", "postgres", "pgpw")
        .await
        .expect("md5 user");
    assert_eq!(q1(&c, "select 1").await, "1");
    drop(weir);

    // 2. Search+bind: anonymous search for uid=<user> under the base DN.
    let weir = ldap_weir(
        &pg,
        dir.path(),
        &format!("ldapserver=127.0.0.1 ldapport={p} ldapbasedn=\"dc=example,dc=net\""),
    )
    .start();
    logs_in(&weir, "ldapuser1", "secret1").await;
    logs_in(&weir, "ldapuser2", "secret2").await;
    let f = refused(weir.port(), "ldapuser2", "secret1").await;
    assert_eq!(f.message, "LDAP authentication failed");
    weir.wait_for_log("LDAP login failed for user uid=ldapuser2,ou=people,dc=example,dc=net");
    drop(weir);

    // 3. Search+bind with a bind DN and a search filter (PgBouncer's "hba format" case:
    //    a quoted key, a comma before an option), by mail or uid.
    let weir = ldap_weir(
        &pg,
        dir.path(),
        &format!(
            "ldapserver=127.0.0.1 \"ldapport\"={p} ldapbasedn=\"dc=example,dc=net\" \
             ldapbinddn=\"cn=reader,dc=example,dc=net\" ldapbindpasswd=readerpw \
             ,ldapsearchfilter=\"(|(uid=$username)(mail=$username))\""
        ),
    )
    .start();
    logs_in(&weir, "ldapuser2", "secret2").await;
    let f = refused(weir.port(), "ldapuser2", "").await;
    assert_eq!(f.message, "LDAP authentication failed");
    drop(weir);

    // 4. An LDAP URL: attribute `uid`, scope sub.
    let weir = ldap_weir(
        &pg,
        dir.path(),
        &format!("ldapurl=\"ldap://127.0.0.1:{p}/dc=example,dc=net?uid?sub\""),
    )
    .start();
    logs_in(&weir, "ldapuser1", "secret1").await;
    drop(weir);

    // 5. auth_type = ldap: auth_ldap_options for everyone; a user PostgreSQL has and the
    //    directory does not.
    pg.create_user("ldapuser3", "x", "md5");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "ldap")
        .set(
            "auth_ldap_options",
            format!("ldapurl=\"ldap://127.0.0.1:{p}/dc=example,dc=net?uid?sub\""),
        )
        .start();
    logs_in(&weir, "ldapuser1", "secret1").await;
    let e =
        psql_pw(&weir, "ldapuser3", "x", "select 1").expect_err("a user LDAP does not have got in");
    assert!(e.contains("LDAP authentication failed"), "{e}");
    weir.wait_for_log("LDAP user \"ldapuser3\" does not exist");
    assert_eq!(
        psql_pw(&weir, "ldapuser2", "secret2", "select current_user").expect("psql"),
        "ldapuser2"
    );
}

/// An LDAP server that is not there fails the login (after the connect attempt), with
/// the reason in the log; bad LDAP options are refused at load with PgBouncer's words.
#[test]
fn ldap_mistakes() {
    let pg = PgServer::start();
    let dead = free_port();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "ldap")
        .set(
            "auth_ldap_options",
            format!("ldapserver=127.0.0.1 ldapport={dead} ldapbasedn=\"dc=example,dc=net\""),
        )
        .start();
    let e = psql_pw(&weir, "postgres", "x", "select 1").expect_err("got in without an LDAP server");
    assert!(e.contains("LDAP authentication failed"), "{e}");
    weir.wait_for_log("could not connect to LDAP server \"127.0.0.1\"");
    // The console's SET is refused alike, and changes nothing.
    let sock = weir.dir().display().to_string();
    let e = psql_at(
        &sock,
        weir.port(),
        "pgbouncer",
        "pgbouncer",
        None,
        "set auth_ldap_options = 'ldapserver=127.0.0.1'",
    )
    .expect_err("SET of bad LDAP options taken");
    assert!(
        e.contains("SET failed: authentication settings could not be applied")
            && e.contains("requires argument"),
        "{e}"
    );
    drop(weir);

    for (options, error) in [
        (
            "ldapserver=127.0.0.1",
            "requires argument \"ldapbasedn\", \"ldapprefix\", or \"ldapsuffix\" to be set",
        ),
        (
            "ldapserver=h ldapbasedn=x ldapfoo=1",
            "invalid LDAP key parameter: \"ldapfoo\"",
        ),
    ] {
        let err = refused_at_load(
            Weir::for_pg(&pg)
                .set("auth_type", "ldap")
                .set("auth_ldap_options", options),
        );
        assert!(err.contains(error), "{options}: {err}");
    }
    let err = refused_at_load(Weir::for_pg(&pg).set("auth_type", "ldap"));
    assert!(
        err.contains("auth_type = ldap needs auth_ldap_options"),
        "{err}"
    );
}

/// ldaps and StartTLS (PgBouncer's cases 8.x): Weir checks the server's certificate
/// against the CA it is given (here SSL_CERT_FILE, read in place of the system's roots);
/// ldaps towards the plain port fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_over_tls() {
    let certs = common::tls::Certs::new();
    let ldap = Slapd::start(Some(&certs));
    let pg = PgServer::start();
    pg.create_user("ldapuser1", "secret1", "md5");
    let dir = tempfile::tempdir().expect("tmp");
    let (p, tls_p) = (ldap.port, ldap.ldaps_port);
    for options in [
        format!("ldapurl=\"ldaps://127.0.0.1:{tls_p}/dc=example,dc=net?uid?sub\""),
        format!(
            "ldapserver=127.0.0.1 ldapport={p} ldapprefix=\"uid=\" \
             ldapsuffix=\",ou=people,dc=example,dc=net\" ldaptls=1"
        ),
        format!("ldapserver=127.0.0.1 ldapport={p} ldapbasedn=\"dc=example,dc=net\" ldaptls=1"),
    ] {
        let weir = ldap_weir(&pg, dir.path(), &options)
            .env("SSL_CERT_FILE", &certs.p("ca.crt"))
            .start();
        logs_in(&weir, "ldapuser1", "secret1").await;
        let f = refused(weir.port(), "ldapuser1", "secret2").await;
        assert_eq!(f.message, "LDAP authentication failed", "{options}");
    }
    let weir = ldap_weir(
        &pg,
        dir.path(),
        &format!("ldapurl=\"ldaps://127.0.0.1:{p}/dc=example,dc=net?uid?sub\""),
    )
    .env("SSL_CERT_FILE", &certs.p("ca.crt"))
    .start();
    let f = refused(weir.port(), "ldapuser1", "secret1").await;
    assert_eq!(f.message, "LDAP authentication failed");
    weir.wait_for_log("could not connect to LDAP server");
    drop(weir);
    // Without the CA, the server's certificate is not trusted.
    let weir = ldap_weir(
        &pg,
        dir.path(),
        &format!("ldapurl=\"ldaps://127.0.0.1:{tls_p}/dc=example,dc=net?uid?sub\""),
    )
    .env(
        "SSL_CERT_FILE",
        &dir.path().join("no-such-file").display().to_string(),
    )
    .start();
    let f = refused(weir.port(), "ldapuser1", "secret1").await;
    assert_eq!(f.message, "LDAP authentication failed");
    weir.wait_for_log("could not connect to LDAP server");
}
