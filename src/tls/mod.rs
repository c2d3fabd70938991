//! TLS settings as PgBouncer spells them (`*_tls_protocols`, `*_tls_ciphers`,
//! `*_tls13_ciphers`, PEM files), turned into rustls configurations: `accept` for clients,
//! `connect` for servers.

pub mod accept;
pub mod connect;

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::aws_lc_rs::{cipher_suite as cs, default_provider};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
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

    #[test]
    fn protocol_lists() {
        assert_eq!(protocols("secure").expect("secure").len(), 2);
        assert_eq!(protocols("tlsv1.3").expect("1.3").len(), 1);
        assert_eq!(protocols("tlsv1.2,tlsv1.3").expect("both").len(), 2);
        let nearest = protocols("tlsv1.0").expect("1.0 alone gets 1.2");
        assert!(nearest.len() == 1 && nearest[0].version == rustls::ProtocolVersion::TLSv1_2);
        assert_eq!(protocols("tlsv1.1,tlsv1.3").expect("1.3").len(), 1);
        assert!(protocols("sslv3").is_err());
        assert!(protocols("sslv3").is_err());
    }
}
