//! TLS towards clients: `client_tls_sslmode` and the files and lists that go with it.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use weir_config::{General, SslMode};

/// How clients are accepted, built from the configuration when it is loaded (and again on
/// every reload, so that new certificates and keys take effect for new clients).
pub struct ClientTls {
    pub mode: SslMode,
    /// None when `client_tls_sslmode` is disable.
    pub config: Option<Arc<ServerConfig>>,
    /// tls-server-end-point (RFC 5929) of the certificate Weir shows clients, for
    /// SCRAM-SHA-256-PLUS.
    pub end_point: Option<Vec<u8>>,
}

impl ClientTls {
    pub fn disabled() -> ClientTls {
        ClientTls {
            mode: SslMode::Disable,
            config: None,
            end_point: None,
        }
    }

    /// A TCP client must use TLS: a plain StartupMessage is refused.
    pub fn required(&self) -> bool {
        matches!(
            self.mode,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }

    pub fn from_config(g: &General) -> Result<ClientTls, String> {
        if g.client_tls_sslmode == SslMode::Disable {
            return Ok(ClientTls::disabled());
        }
        let what = |e: String| format!("client TLS: {e}");
        let (Some(cert), Some(key)) = (&g.client_tls_cert_file, &g.client_tls_key_file) else {
            return Err(what(
                "client_tls_sslmode needs client_tls_key_file and client_tls_cert_file".into(),
            ));
        };
        let provider = super::provider(&g.client_tls_ciphers, g.client_tls13_ciphers.as_deref())
            .map_err(what)?;
        let versions = super::protocols(&g.client_tls_protocols).map_err(what)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| what(e.to_string()))?;
        let verify = matches!(
            g.client_tls_sslmode,
            SslMode::VerifyCa | SslMode::VerifyFull
        );
        let builder = match &g.client_tls_ca_file {
            Some(ca) => {
                let roots = Arc::new(super::roots(ca).map_err(what)?);
                let v = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
                // Below verify-ca a certificate is checked when the client gives one (it
                // may be used for auth_type cert) but none is needed.
                let v = if verify { v } else { v.allow_unauthenticated() };
                let v = v.build().map_err(|e| what(e.to_string()))?;
                builder.with_client_cert_verifier(Arc::new(ExplainV1(v)))
            }
            None if verify => {
                return Err(what(
                    "client_tls_sslmode verify-ca and verify-full need client_tls_ca_file".into(),
                ))
            }
            None => builder.with_no_client_auth(),
        };
        let certified = super::certified_key(cert, key, &provider).map_err(what)?;
        let end_point = super::end_point(&certified.cert[0]);
        let mut config =
            builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
        // libpq 17 and later send it (and require it for sslnegotiation=direct); clients
        // that send no ALPN are accepted all the same.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        // libpq never resumes a TLS session, and PostgreSQL itself turns resumption off
        // (SSL_OP_NO_TICKET, no session cache): tickets would be made and sent on every
        // login for nothing.
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(ClientTls {
            mode: g.client_tls_sslmode,
            config: Some(Arc::new(config)),
            end_point,
        })
    }
}

/// webpki's verifier, whose refusal of a client's X.509 v1 certificate says what it is
/// and how to reissue it (see `super::explain_v1`).
#[derive(Debug)]
struct ExplainV1(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for ExplainV1 {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(|e| super::explain_v1(e, "the client's", end_entity, intermediates))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
