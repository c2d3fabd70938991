//! TLS towards clients: `client_tls_sslmode` and the files and lists that go with it.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
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
                let v = WebPkiClientVerifier::builder_with_provider(roots, provider);
                // Below verify-ca a certificate is checked when the client gives one (it
                // may be used for auth_type cert) but none is needed.
                let v = if verify { v } else { v.allow_unauthenticated() };
                builder.with_client_cert_verifier(v.build().map_err(|e| what(e.to_string()))?)
            }
            None if verify => {
                return Err(what(
                    "client_tls_sslmode verify-ca and verify-full need client_tls_ca_file".into(),
                ))
            }
            None => builder.with_no_client_auth(),
        };
        let chain = super::certs(cert).map_err(what)?;
        let end_point = super::end_point(&chain[0]);
        let mut config = builder
            .with_single_cert(chain, super::key(key).map_err(what)?)
            .map_err(|e| what(format!("{} with {}: {e}", cert.display(), key.display())))?;
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
