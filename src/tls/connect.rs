//! TLS towards servers: `server_tls_sslmode` and the files and lists that go with it.
//!
//! The modes as PgBouncer documents them: `disable` never asks for TLS; `allow` logs in
//! in the clear and tries TLS when the server refuses that; `prefer` asks for TLS and
//! goes on in the clear when the server has none; `require` needs TLS but checks no
//! certificate; `verify-ca` checks the certificate against `server_tls_ca_file` (else
//! the system's CA bundle); `verify-full` checks the host name too. Unix sockets never use TLS (PostgreSQL
//! has none there).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_config::{General, SslMode};

use crate::stream::Stream;

/// How servers are reached, built from the configuration when it is loaded (and on
/// every reload).
pub struct ServerTls {
    pub mode: SslMode,
    /// None when `server_tls_sslmode` is disable.
    pub config: Option<Arc<ClientConfig>>,
    /// The settings it was built from: a reload that changes them makes pools open new
    /// connections (see app::same_target).
    settings: String,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerTls({:?})", self.mode)
    }
}

impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        self.mode == other.mode && self.settings == other.settings
    }
}

impl ServerTls {
    pub fn disabled() -> ServerTls {
        ServerTls {
            mode: SslMode::Disable,
            config: None,
            settings: String::new(),
        }
    }

    pub fn from_config(g: &General) -> Result<ServerTls, String> {
        if g.server_tls_sslmode == SslMode::Disable {
            return Ok(ServerTls::disabled());
        }
        let what = |e: String| format!("server TLS: {e}");
        let provider = super::provider(&g.server_tls_ciphers, g.server_tls13_ciphers.as_deref())
            .map_err(what)?;
        let versions = super::protocols(&g.server_tls_protocols).map_err(what)?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| what(e.to_string()))?;
        let verifier: Arc<dyn ServerCertVerifier> = match g.server_tls_sslmode {
            SslMode::VerifyCa | SslMode::VerifyFull => {
                let roots = match &g.server_tls_ca_file {
                    Some(ca) => super::roots(ca).map_err(what)?,
                    None => system_roots().map_err(what)?,
                };
                let roots = Arc::new(roots);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| what(e.to_string()))?;
                Arc::new(Webpki {
                    inner: webpki,
                    check_name: g.server_tls_sslmode == SslMode::VerifyFull,
                })
            }
            _ => {
                // Read all the same, so that a bad file is found at load and not when
                // someone raises the mode.
                if let Some(ca) = &g.server_tls_ca_file {
                    super::roots(ca).map_err(what)?;
                }
                Arc::new(Unverified(provider.clone()))
            }
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match (&g.server_tls_cert_file, &g.server_tls_key_file) {
            (Some(cert), Some(key)) => {
                let certified = super::certified_key(cert, key, &provider).map_err(what)?;
                builder.with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
                    certified,
                )))
            }
            (None, None) => builder.with_no_client_auth(),
            // One of the pair: the console sets them one at a time, as PgBouncer's
            // does. No certificate is offered until both are there (a server that asks
            // for one refuses the login: this fails closed); the file given is still
            // read, so that a bad one is refused now. See `super::protocol_notices`.
            (Some(cert), None) => {
                super::certs(cert).map_err(what)?;
                builder.with_no_client_auth()
            }
            (None, Some(key)) => {
                super::key(key).map_err(what)?;
                builder.with_no_client_auth()
            }
        };
        // PostgreSQL 17 checks it when sent (and needs it for direct TLS); older ones
        // ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        // PostgreSQL turns session resumption off: tickets and a cache would be kept for
        // nothing.
        config.resumption = rustls::client::Resumption::disabled();
        let path = |p: &Option<std::path::PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let settings = format!(
            "{}|{}|{}|{}|{}|{}",
            path(&g.server_tls_ca_file),
            path(&g.server_tls_cert_file),
            path(&g.server_tls_key_file),
            g.server_tls_protocols,
            g.server_tls_ciphers,
            g.server_tls13_ciphers.as_deref().unwrap_or("")
        );
        Ok(ServerTls {
            mode: g.server_tls_sslmode,
            config: Some(Arc::new(config)),
            settings,
        })
    }

    /// Whether the server must speak TLS once asked.
    pub fn required(&self) -> bool {
        matches!(
            self.mode,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

/// Where distributions keep the system's CA bundle: what PgBouncer's TLS library reads
/// when server_tls_ca_file is not set (a server with a publicly signed certificate).
const SYSTEM_CA_FILES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The system's CA bundle; certificates in it that webpki cannot use are skipped.
fn system_roots() -> Result<rustls::RootCertStore, String> {
    let Some(path) = SYSTEM_CA_FILES
        .iter()
        .map(std::path::Path::new)
        .find(|p| p.is_file())
    else {
        return Err(
            "server_tls_sslmode verify-ca and verify-full need server_tls_ca_file (no system CA bundle found)"
                .into(),
        );
    };
    let mut store = rustls::RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(super::certs(path)?);
    if added == 0 {
        return Err(format!("{}: no usable CA certificate", path.display()));
    }
    Ok(store)
}

/// Why a server connection is not in TLS though it was to be.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("server does not support TLS, and server_tls_sslmode is {0}")]
    Refused(&'static str),
    #[error("TLS handshake with server failed: {0}")]
    Handshake(std::io::Error),
    #[error("bad server name for TLS: {0}")]
    Name(String),
    #[error("{0}")]
    Io(std::io::Error),
    #[error("the server TLS settings could not be loaded (see the log)")]
    Unusable,
}

/// Asks the server for TLS (SSLRequest) and, when it agrees, shakes hands as `host`.
/// Returns the stream as it is to be used: in TLS, or as it was when the server has no
/// TLS and the mode lets that pass.
pub async fn upgrade(
    mut stream: Stream,
    tls: &ServerTls,
    host: &str,
    required: bool,
) -> Result<Stream, TlsError> {
    let Some(config) = &tls.config else {
        return match required {
            true => Err(TlsError::Unusable),
            false => Ok(stream),
        };
    };
    // SSLRequest: length 8, code 80877103.
    stream
        .write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .await
        .map_err(TlsError::Io)?;
    // Exactly one byte: anything sent after it before the handshake must not be taken as
    // part of the TLS session (CVE-2021-23222).
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await.map_err(TlsError::Io)?;
    match answer[0] {
        b'S' => {}
        // 'N', or an ErrorResponse from a server too old to know the request.
        _ if required => return Err(TlsError::Refused(tls.mode.as_str())),
        b'N' => return Ok(stream),
        _ => {
            return Err(TlsError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "unexpected answer to SSLRequest",
            )))
        }
    }
    let name = ServerName::try_from(host.to_owned()).map_err(|e| TlsError::Name(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let tls = connector
        .connect(name, stream)
        .await
        .map_err(TlsError::Handshake)?;
    Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(tls))))
}

/// The TLS session of a server connection, when it has one.
pub fn session(stream: &Stream) -> Option<&rustls::ClientConnection> {
    match stream {
        Stream::Tls(t) => match &**t {
            tokio_rustls::TlsStream::Client(c) => Some(c.get_ref().1),
            tokio_rustls::TlsStream::Server(_) => None,
        },
        _ => None,
    }
}

/// verify-full and verify-ca: the chain must lead to a root of server_tls_ca_file; the
/// name in the certificate is looked at only under verify-full. A refusal because the
/// certificate is X.509 v1 says so (see `super::explain_v1`).
#[derive(Debug)]
struct Webpki {
    inner: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Webpki {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            // webpki checks the name only once the chain is good: a name error means the
            // chain passed.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            Err(e) => Err(super::explain_v1(
                e,
                "the server's",
                end_entity,
                intermediates,
            )),
            Ok(v) => Ok(v),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// prefer, allow and require: any certificate (as libpq without a root file). The
/// handshake's signatures are still checked: the peer must hold the certificate's key,
/// which is what the channel binding of SCRAM-SHA-256-PLUS builds on.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algs)
            .or_else(|e| v1_fallback(e, message, cert, dss, algs, false))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algs)
            .or_else(|e| v1_fallback(e, message, cert, dss, algs, true))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// rustls could not check a handshake signature: when that is because the certificate is
/// X.509 v1 (see `super::v1_signature`), it is checked with the certificate's key.
fn v1_fallback(
    err: rustls::Error,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &rustls::crypto::WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    if !super::is_v1(cert) {
        return Err(err);
    }
    super::v1_signature(message, cert, dss, algs, tls13)
}

/// What SHOW SERVERS and SHOW CLIENTS say of a TLS session, as PgBouncer does:
/// `TLSv1.3/TLS_AES_256_GCM_SHA384/ECDH=X25519`.
pub fn describe(conn: &rustls::CommonState) -> String {
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_owned(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_owned(),
        Some(v) => format!("{v:?}"),
        None => return String::new(),
    };
    let suite = conn
        .negotiated_cipher_suite()
        .map(|s| openssl_name(s.suite()))
        .unwrap_or_default();
    let group = conn
        .negotiated_key_exchange_group()
        .map(|g| format!("{:?}", g.name()).replace("secp256r1", "prime256v1"))
        .unwrap_or_default();
    format!("{version}/{suite}/ECDH={group}")
}

/// OpenSSL's name of a suite (PgBouncer shows those), from the table in tls/mod.rs.
fn openssl_name(suite: rustls::CipherSuite) -> String {
    super::SUITES
        .iter()
        .find(|(_, s)| s.suite() == suite)
        .map(|(n, _)| (*n).to_owned())
        .unwrap_or_else(|| format!("{suite:?}"))
}
