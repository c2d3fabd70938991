/// Why an authentication exchange failed.
///
/// Protocol violations are kept apart from [`AuthError::WrongPassword`] so the
/// pooler can log the former and answer the latter with PostgreSQL's usual
/// "password authentication failed" without telling the client more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("malformed SCRAM message ({0})")]
    Malformed(&'static str),
    #[error("password authentication failed")]
    WrongPassword,
    #[error("SCRAM channel binding is not supported")]
    UnsupportedChannelBinding,
    /// The client could bind and says the server cannot, but the server offered it.
    #[error("SCRAM channel binding negotiation error")]
    ChannelBindingDowngrade,
    #[error("client uses authorization identity, but it is not supported")]
    UnsupportedAuthzid,
    #[error("client requires an unsupported SCRAM extension")]
    UnsupportedExtension,
    #[error("invalid SCRAM response (nonce mismatch)")]
    NonceMismatch,
    #[error("malformed SCRAM message (invalid iteration count)")]
    InvalidIterationCount,
    #[error("incorrect server signature")]
    InvalidServerSignature,
    #[error("error received from server in SCRAM exchange: {0}")]
    ServerError(String),
    #[error("SCRAM exchange step called out of order")]
    OutOfOrder,
}
