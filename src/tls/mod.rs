//! TLS settings as PgBouncer spells them (`*_tls_protocols`, `*_tls_ciphers`,
//! `*_tls13_ciphers`, PEM files), turned into rustls configurations: `accept` for clients,
//! `connect` for servers.

pub mod accept;
pub mod connect;

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::aws_lc_rs::{cipher_suite as cs, default_provider};
use rustls::crypto::CryptoProvider;
use rustls::crypto::{verify_tls13_signature_with_raw_key, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, SubjectPublicKeyInfoDer};
use rustls::sign::CertifiedKey;
use rustls::DigitallySignedStruct;
use rustls::{RootCertStore, SupportedCipherSuite, SupportedProtocolVersion};

/// OpenSSL's names for the suites rustls has (TLS 1.3 ones under their RFC names, as
/// `*_tls13_ciphers` gives them).
const SUITES: [(&str, SupportedCipherSuite); 9] = [
    ("TLS_AES_256_GCM_SHA384", cs::TLS13_AES_256_GCM_SHA384),
    ("TLS_AES_128_GCM_SHA256", cs::TLS13_AES_128_GCM_SHA256),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        cs::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// PgBouncer's cipher keywords (libtls'): each means a set of OpenSSL suites; rustls has
/// only modern AEAD suites, which every one of them includes.
const KEYWORDS: [&str; 8] = [
    "default", "secure", "fast", "normal", "compat", "legacy", "insecure", "all",
];

/// OpenSSL suite names rustls does not implement (CBC, RSA key exchange, DHE, ...):
/// recognised, so that a list naming them is not a typo, and left out.
fn is_known_openssl_name(name: &str) -> bool {
    const WORDS: [&str; 37] = [
        "ECDHE",
        "DHE",
        "EDH",
        "ADH",
        "AECDH",
        "RSA",
        "ECDSA",
        "DSS",
        "PSK",
        "SRP",
        "AES",
        "AES128",
        "AES256",
        "GCM",
        "CCM",
        "CCM8",
        "CBC",
        "CBC3",
        "DES",
        "RC4",
        "MD5",
        "SHA",
        "SHA256",
        "SHA384",
        "CHACHA20",
        "POLY1305",
        "CAMELLIA128",
        "CAMELLIA256",
        "ARIA128",
        "ARIA256",
        "NULL",
        "SEED",
        "IDEA",
        "KRB5",
        "EXP",
        "ANON",
        "ECDH",
    ];
    name.split('-').all(|w| WORDS.contains(&w))
}

/// A rustls provider with the suites `ciphers` (TLS 1.2, OpenSSL syntax: names or
/// keywords joined by ':' or ',') and `tls13` (TLS 1.3 names, ':'-separated) allow.
pub fn provider(ciphers: &str, tls13: Option<&str>) -> Result<Arc<CryptoProvider>, String> {
    let mut chosen: Vec<SupportedCipherSuite> = Vec::new();
    take_suites(&mut chosen, ciphers, false)?;
    let has13 = chosen.iter().any(|s| s.tls13().is_some());
    match tls13 {
        Some(list) => {
            chosen.retain(|s| s.tls13().is_none());
            take_suites(&mut chosen, list, true)?;
        }
        None if !has13 => chosen.extend(SUITES[..3].iter().map(|(_, s)| *s)),
        None => {}
    }
    if chosen.is_empty() {
        return Err(format!("no TLS cipher left from \"{ciphers}\""));
    }
    Ok(Arc::new(CryptoProvider {
        cipher_suites: chosen,
        ..default_provider()
    }))
}

/// Adds the suites a list names (only TLS 1.3 ones when `tls13`).
fn take_suites(
    chosen: &mut Vec<SupportedCipherSuite>,
    list: &str,
    tls13: bool,
) -> Result<(), String> {
    let mut add = |s: SupportedCipherSuite| {
        if !chosen.contains(&s) {
            chosen.push(s);
        }
    };
    for item in list
        .split([':', ','])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let item = item.trim_start_matches(['+', '@']);
        if item.starts_with('!') || item.starts_with('-') {
            continue;
        }
        if KEYWORDS.contains(&item.to_ascii_lowercase().as_str())
            || matches!(
                item,
                "HIGH" | "MEDIUM" | "DEFAULT" | "ALL" | "ECDHE" | "EECDH"
            )
        {
            for (n, s) in SUITES.iter() {
                if !tls13 || n.starts_with("TLS_") {
                    add(*s);
                }
            }
            continue;
        }
        match SUITES.iter().find(|(n, _)| n.eq_ignore_ascii_case(item)) {
            Some((_, s)) => add(*s),
            None if is_known_openssl_name(item) => {
                tracing::warn!(
                    "TLS cipher {item} is not available (rustls has only AEAD suites); left out"
                );
            }
            None => return Err(format!("unknown TLS cipher: {item}")),
        }
    }
    Ok(())
}

/// `*_tls_protocols`: `secure` (TLS 1.2 and 1.3), `all`, `legacy`, or a list of
/// `tlsv1.0` .. `tlsv1.3`. rustls has no 1.0 and 1.1: a list naming only those (an old
/// pgbouncer.ini) gets TLS 1.2, the nearest it speaks, rather than a configuration that
/// will not load; `protocol_notices` says so in the log.
pub fn protocols(spec: &str) -> Result<Vec<&'static SupportedProtocolVersion>, String> {
    let (mut v, too_old) = parse_protocols(spec)?;
    if v.is_empty() {
        if too_old.is_empty() {
            return Err(format!("no TLS protocol Weir supports in \"{spec}\""));
        }
        v.push(&rustls::version::TLS12);
    }
    Ok(v)
}

/// The versions named that rustls speaks, and those it does not (TLS 1.0, 1.1).
fn parse_protocols(
    spec: &str,
) -> Result<(Vec<&'static SupportedProtocolVersion>, Vec<&str>), String> {
    let mut v: Vec<&'static SupportedProtocolVersion> = Vec::new();
    let mut too_old = Vec::new();
    for item in spec
        .split([',', ':', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match item.to_ascii_lowercase().as_str() {
            "secure" | "default" | "all" | "legacy" => {
                v = vec![&rustls::version::TLS12, &rustls::version::TLS13];
            }
            "tlsv1.2" => v.push(&rustls::version::TLS12),
            "tlsv1.3" => v.push(&rustls::version::TLS13),
            "tlsv1.0" | "tlsv1.1" => too_old.push(item),
            other => return Err(format!("unknown TLS protocol: {other}")),
        }
    }
    v.dedup_by_key(|p| p.version);
    Ok((v, too_old))
}

/// What the log says, once per load, of TLS settings that take effect only in part: TLS
/// versions rustls does not speak, half of the client certificate pair towards servers.
pub fn protocol_notices(g: &weir_config::General) -> Vec<String> {
    let mut notices = Vec::new();
    for (option, spec) in [
        ("client_tls_protocols", &g.client_tls_protocols),
        ("server_tls_protocols", &g.server_tls_protocols),
    ] {
        let Ok((v, too_old)) = parse_protocols(spec) else {
            continue;
        };
        if too_old.is_empty() {
            continue;
        }
        let instead = if v.is_empty() {
            "TLS 1.2 is used instead"
        } else {
            "left out"
        };
        notices.push(format!(
            "{option}: {} not supported (rustls speaks TLS 1.2 and 1.3 only); {instead}",
            too_old.join(", ")
        ));
    }
    if g.server_tls_cert_file.is_some() != g.server_tls_key_file.is_some() {
        notices.push(
            "server_tls_cert_file and server_tls_key_file go together: no client certificate is offered to servers until both are set".into(),
        );
    }
    notices
}

pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

pub fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("{}: no usable private key ({e})", path.display()))
}

/// Weir's own certificate (towards clients or servers) with its key. Not rustls'
/// `with_single_cert`: it checks that the key is the certificate's by parsing the
/// certificate with webpki, which refuses X.509 v1 ones (UnsupportedCertVersion), though
/// the peer is the one to verify it and OpenSSL (libpq, PostgreSQL) accepts them. The
/// same check is made here with a parser that takes v1.
pub fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, String> {
    let chain = certs(cert)?;
    let signing = provider
        .key_provider
        .load_private_key(self::key(key)?)
        .map_err(|e| format!("{}: {e}", key.display()))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&chain[0])
        .map_err(|e| format!("{}: not a usable certificate ({e})", cert.display()))?;
    // A key type that cannot say its public key is taken, as rustls does.
    if let Some(spki) = signing.public_key() {
        if spki.as_ref() != parsed.tbs_certificate.subject_pki.raw {
            return Err(format!(
                "{} with {}: the private key is not the certificate's",
                cert.display(),
                key.display()
            ));
        }
    }
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// Whether a certificate is X.509 version 1 (no extensions: what `openssl x509 -req`
/// makes without `-extfile`).
pub fn is_v1(der: &[u8]) -> bool {
    x509_parser::parse_x509_certificate(der)
        .is_ok_and(|(_, c)| c.tbs_certificate.version == x509_parser::x509::X509Version::V1)
}

/// A peer's certificate failed verification: when it (or one in its chain) is X.509 v1,
/// which webpki never verifies except as a trust anchor, the error says so and how to
/// reissue it, rather than rustls' bare "UnsupportedCertVersion" or "BadEncoding". Only
/// the error is changed: verification has failed either way.
pub fn explain_v1(
    err: rustls::Error,
    whose: &str,
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
) -> rustls::Error {
    let text = if is_v1(end_entity) {
        format!(
            "{whose} certificate is X.509 v1, which rustls cannot verify; reissue it as X.509 v3, \
             e.g. openssl x509 -req ... -extfile v3.ext with basicConstraints=CA:FALSE \
             (and subjectAltName=DNS:<host name>) in v3.ext"
        )
    } else if intermediates.iter().any(|c| is_v1(c)) {
        // The chain may have failed for another reason too (expired, unknown issuer):
        // rustls' own words stay in the message.
        format!(
            "{err}; an intermediate CA certificate in {whose} chain is X.509 v1, which rustls \
             accepts only as a trust anchor; put it in the CA file or reissue it as X.509 v3 \
             with basicConstraints=CA:TRUE"
        )
    } else {
        return err;
    };
    rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(
        Arc::new(V1Certificate(text)),
    )))
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct V1Certificate(String);

/// The handshake signature of a peer whose certificate is not verified (server_tls_sslmode
/// below verify-ca), checked against the certificate's key when rustls cannot: its
/// `verify_tls1*_signature` parse the certificate with webpki, which refuses X.509 v1
/// ones, and so a v1 server certificate failed under require though nothing is to be
/// verified (libpq takes it). The key is the certificate's subjectPublicKeyInfo,
/// matched to the schemes the provider supports as webpki does.
pub fn v1_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    if !tls13 {
        return key_signature(message, cert, dss.scheme, dss.signature(), algs);
    }
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|_| bad_encoding())?;
    verify_tls13_signature_with_raw_key(
        message,
        &SubjectPublicKeyInfoDer::from(parsed.tbs_certificate.subject_pki.raw),
        dss,
        algs,
    )
}

fn bad_encoding() -> rustls::Error {
    rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
}

/// `signature` of `message` checked with the certificate's key (TLS 1.2: each algorithm
/// the scheme may mean for the key's type, as rustls tries them).
fn key_signature(
    message: &[u8],
    cert: &[u8],
    scheme: rustls::SignatureScheme,
    signature: &[u8],
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|_| bad_encoding())?;
    let spki = &parsed.tbs_certificate.subject_pki;
    let alg_id = der_contents(spki.raw)
        .and_then(|(inner, _)| der_contents(inner))
        .map(|(id, _)| id)
        .ok_or_else(bad_encoding)?;
    let candidates = algs
        .mapping
        .iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, a)| *a)
        .unwrap_or_default();
    let mut fitting = candidates
        .iter()
        .filter(|a| a.public_key_alg_id().as_ref() == alg_id)
        .peekable();
    if fitting.peek().is_none() {
        return Err(rustls::Error::PeerMisbehaved(
            rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
        ));
    }
    match fitting.any(|a| {
        a.verify_signature(&spki.subject_public_key.data, message, signature)
            .is_ok()
    }) {
        true => Ok(HandshakeSignatureValid::assertion()),
        false => Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::BadSignature,
        )),
    }
}

/// The contents of the DER element `der` starts with, and what follows it; None when it
/// is cut short.
fn der_contents(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (_tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, rest) = rest.split_at_checked(n)?;
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    rest.split_at_checked(len)
}

/// The trust anchors of a CA file. X.509 v1 ones are taken (webpki reads a v1
/// certificate as an anchor: its subject and key are all an anchor needs, and it is
/// trusted because the configuration names it).
pub fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for c in certs(path)? {
        store
            .add(c)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(store)
}

/// The certificate's hash with its signature's hash function (SHA-256 for MD5, SHA-1
/// and what names none), as PostgreSQL computes it; None when it cannot be parsed (then
/// SCRAM-SHA-256-PLUS is not used).
pub fn end_point(cert: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let oid = parsed.signature_algorithm.algorithm.to_id_string();
    Some(match oid.as_str() {
        // sha384WithRSAEncryption, ecdsa-with-SHA384
        "1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3" => sha2::Sha384::digest(cert).to_vec(),
        // sha512WithRSAEncryption, ecdsa-with-SHA512
        "1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4" => sha2::Sha512::digest(cert).to_vec(),
        _ => sha2::Sha256::digest(cert).to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_lists() {
        let all = provider("default", None).expect("default");
        assert_eq!(all.cipher_suites.len(), 9);
        let two = provider(
            "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384",
            None,
        )
        .expect("names");
        // The two TLS 1.2 suites, and TLS 1.3's (not named: all of them).
        assert_eq!(two.cipher_suites.len(), 5);
        let only = provider("fast", Some("TLS_AES_128_GCM_SHA256")).expect("tls13");
        assert_eq!(
            only.cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some())
                .count(),
            1
        );
        assert!(provider("HIGH:!aNULL:!MD5", None).is_ok());
        assert!(provider("AES128-SHA:ECDHE-RSA-AES128-GCM-SHA256", None).is_ok());
        assert_eq!(
            provider("ECDHE-RSA-AES128-GCM-SHA257", None)
                .err()
                .as_deref(),
            Some("unknown TLS cipher: ECDHE-RSA-AES128-GCM-SHA257")
        );
    }

    /// A handshake signature made with the key of an X.509 v1 certificate is taken, one
    /// that does not match is not, and the certificate's key check takes the v1 pair and
    /// refuses another key.
    #[test]
    fn v1_certificate_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl");
            assert!(out.status.success(), "{args:?}");
        };
        run(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "k.pem", "-out", "r.csr", "-subj",
            "/CN=v1",
        ]);
        run(&[
            "x509", "-req", "-in", "r.csr", "-signkey", "k.pem", "-out", "c.pem",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.pem",
            "-out",
            "o.csr",
            "-subj",
            "/CN=o",
        ]);
        std::fs::write(dir.path().join("msg"), b"handshake transcript").expect("write");
        run(&["dgst", "-sha256", "-sign", "k.pem", "-out", "sig", "msg"]);
        let cert = certs(&dir.path().join("c.pem")).expect("cert").remove(0);
        assert!(is_v1(&cert));
        let algs = default_provider().signature_verification_algorithms;
        let mut sig = std::fs::read(dir.path().join("sig")).expect("sig");
        let scheme = rustls::SignatureScheme::RSA_PKCS1_SHA256;
        let msg = b"handshake transcript";
        assert!(key_signature(msg, &cert, scheme, &sig, &algs).is_ok());
        assert!(key_signature(b"another transcript", &cert, scheme, &sig, &algs).is_err());
        let ecdsa = rustls::SignatureScheme::ECDSA_NISTP256_SHA256;
        assert!(key_signature(msg, &cert, ecdsa, &sig, &algs).is_err());
        sig[10] ^= 1;
        assert!(key_signature(msg, &cert, scheme, &sig, &algs).is_err());
        let provider = default_provider();
        let (c, k, o) = (
            dir.path().join("c.pem"),
            dir.path().join("k.pem"),
            dir.path().join("other.pem"),
        );
        assert!(certified_key(&c, &k, &provider).is_ok());
        let e = certified_key(&c, &o, &provider).err().unwrap_or_default();
        assert!(
            e.ends_with("the private key is not the certificate's"),
            "{e}"
        );
    }

    #[test]
    fn der_lengths() {
        assert_eq!(
            der_contents(&[0x30, 2, 1, 2, 9]),
            Some((&[1u8, 2][..], &[9u8][..]))
        );
        assert_eq!(
            der_contents(&[0x30, 0x81, 1, 7]),
            Some((&[7u8][..], &[][..]))
        );
        assert_eq!(der_contents(&[0x30, 3, 1]), None);
        assert_eq!(der_contents(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(der_contents(&[0x30]), None);
    }

    #[test]
    fn protocol_lists() {
        assert_eq!(protocols("secure").expect("secure").len(), 2);
        assert_eq!(protocols("tlsv1.3").expect("1.3").len(), 1);
        assert_eq!(protocols("tlsv1.2,tlsv1.3").expect("both").len(), 2);
        let nearest = protocols("tlsv1.0").expect("1.0 alone gets 1.2");
        assert!(nearest.len() == 1 && nearest[0].version == rustls::ProtocolVersion::TLSv1_2);
        assert_eq!(protocols("tlsv1.1,tlsv1.3").expect("1.3").len(), 1);
        assert!(protocols("sslv3").is_err());
        // The log says what was asked for and what is spoken instead.
        let g = weir_config::General {
            server_tls_protocols: "tlsv1.1".into(),
            ..Default::default()
        };
        let notices = protocol_notices(&g);
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(
            notices[0].starts_with("server_tls_protocols: tlsv1.1 not supported")
                && notices[0].ends_with("TLS 1.2 is used instead"),
            "{notices:?}"
        );
    }
}
