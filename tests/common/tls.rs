//! Certificates for TLS tests, made with the openssl command: a CA, a server certificate
//! for localhost and 127.0.0.1 signed by it, and client certificates.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Certs {
    pub dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The extensions of an end-entity certificate, and `ext`.
fn v3(ext: &str) -> String {
    format!("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n{ext}")
}

impl Certs {
    /// A CA, and `server.crt`/`server.key` for localhost and 127.0.0.1.
    pub fn new() -> Certs {
        Certs::with_ca(false)
    }

    /// As `new`, with an X.509 version 1 CA certificate (no extensions, as older setups
    /// and PgBouncer's suite make them); `server.crt` is version 3.
    pub fn with_v1_ca() -> Certs {
        Certs::with_ca(true)
    }

    fn with_ca(v1: bool) -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("weir-certs-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        let subj = "/CN=Weir Test CA";
        if v1 {
            let req = [
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.csr",
                "-subj", subj,
            ];
            openssl(d, &req);
            let sign = [
                "x509", "-req", "-in", "ca.csr", "-signkey", "ca.key", "-out", "ca.crt", "-days",
                "30",
            ];
            openssl(d, &sign);
        } else {
            let req = [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.crt", "-days", "30", "-subj", subj,
            ];
            openssl(d, &req);
        }
        let certs = Certs { dir };
        certs.sign(
            "server",
            "localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        certs
    }

    /// `<name>.crt`/`<name>.key` for a client whose certificate names `cn`.
    pub fn client(&self, name: &str, cn: &str) {
        self.sign(name, cn, "extendedKeyUsage=clientAuth\n");
    }

    /// `<name>.crt`/`<name>.key`: a server certificate for the DNS name `dns` only.
    pub fn server(&self, name: &str, dns: &str) {
        self.sign(
            name,
            dns,
            &format!("subjectAltName=DNS:{dns}\nextendedKeyUsage=serverAuth\n"),
        );
    }

    /// `<name>.crt`/`<name>.key` for localhost and 127.0.0.1, with an EC P-384 key and
    /// signed with SHA-384: a certificate whose tls-server-end-point hash is SHA-384.
    pub fn server_sha384(&self, name: &str) {
        self.sign_with(
            name,
            "localhost",
            &v3("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"],
            "-sha384",
        );
    }

    /// `<name>.crt`/`<name>.key`: a self-signed X.509 version 1 certificate (no
    /// extensions), which webpki verifies only as a trust anchor.
    pub fn v1(&self, name: &str) {
        let d = self.dir.path();
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                "/CN=localhost",
            ],
        );
        openssl(
            d,
            &[
                "x509", "-req", "-in", &csr, "-signkey", &key, "-out", &crt, "-days", "30",
            ],
        );
    }

    /// `<name>.crt`/`<name>.key`: an X.509 version 1 certificate for `cn` signed by the
    /// CA (`openssl x509 -req` without `-extfile`): no subjectAltName, no extensions.
    pub fn v1_signed(&self, name: &str, cn: &str) {
        self.sign_with(name, cn, "", &["-newkey", "rsa:2048"], "-sha256");
    }

    /// Whether `openssl x509 -text` calls the certificate version 1.
    pub fn is_v1(&self, file: &str) -> bool {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(self.path(file))
            .output()
            .expect("run openssl");
        String::from_utf8_lossy(&out.stdout).contains("Version: 1 (0x0)")
    }

    fn sign(&self, name: &str, cn: &str, ext: &str) {
        self.sign_with(name, cn, &v3(ext), &["-newkey", "rsa:2048"], "-sha256");
    }

    /// Signs with the CA; `ext` empty makes a version 1 certificate.
    fn sign_with(&self, name: &str, cn: &str, ext: &str, newkey: &[&str], digest: &str) {
        let d = self.dir.path();
        let (key, csr, crt, extf) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        openssl(
            d,
            &[
                &["req"][..],
                newkey,
                &[
                    "-nodes",
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            ]
            .concat(),
        );
        let mut sign = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "30",
            digest,
        ];
        if !ext.is_empty() {
            std::fs::write(d.join(&extf), ext).expect("write ext");
            sign.extend(["-extfile", &extf]);
        }
        openssl(d, &sign);
        // libpq refuses a key readable by others.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join(&key), std::fs::Permissions::from_mode(0o600))
            .expect("chmod key");
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn p(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }
}
