//! Weir as the SCRAM client, logging in to PostgreSQL (libpq's fe-auth-scram.c).

use std::fmt;

use super::keys::{self, Key};
use super::messages::Attrs;
use super::{Credential, MAX_ITERATIONS};
use crate::{b64, ct, AuthError};

/// How the exchange is bound to the TLS channel under it (RFC 5802's gs2 cbind-flag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// "n": not in TLS.
    None,
    /// "y": in TLS and able to bind, but the server offers no SCRAM-SHA-256-PLUS (a
    /// server that does offer it then knows the offer was stripped on the way).
    Unused,
    /// "p=tls-server-end-point": SCRAM-SHA-256-PLUS, with the hash of the server's
    /// certificate (RFC 5929).
    EndPoint(Vec<u8>),
}

impl Binding {
    /// The gs2 header, then the binding data: what c= carries, base64-encoded.
    fn cbind_input(&self) -> Vec<u8> {
        match self {
            Binding::None => b"n,,".to_vec(),
            Binding::Unused => b"y,,".to_vec(),
            Binding::EndPoint(data) => {
                let mut v = b"p=tls-server-end-point,,".to_vec();
                v.extend_from_slice(data);
                v
            }
        }
    }

    fn gs2_header(&self) -> &'static [u8] {
        match self {
            Binding::None => b"n,,",
            Binding::Unused => b"y,,",
            Binding::EndPoint(_) => b"p=tls-server-end-point,,",
        }
    }
}

/// One SCRAM exchange with a PostgreSQL server.
pub struct ClientSession {
    credential: Credential,
    nonce: String,
    user: String,
    binding: Binding,
    state: State,
}

enum State {
    Initial,
    SentFirst { client_first_bare: Vec<u8> },
    SentFinal { server_signature: Key },
    Finished,
}

impl fmt::Debug for ClientSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Initial => "Initial",
            State::SentFirst { .. } => "SentFirst",
            State::SentFinal { .. } => "SentFinal",
            State::Finished => "Finished",
        };
        f.debug_struct("ClientSession")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl ClientSession {
    pub fn new(credential: Credential) -> ClientSession {
        ClientSession::with_nonce(credential, "", keys::new_nonce())
    }

    /// Fixed user and nonce, to replay published exchanges (tests, fuzzing). Never for
    /// a real login.
    #[doc(hidden)]
    pub fn with_nonce(credential: Credential, user: &str, nonce: String) -> ClientSession {
        ClientSession {
            credential,
            nonce,
            user: user.to_owned(),
            binding: Binding::None,
            state: State::Initial,
        }
    }

    /// Binds the exchange to the TLS channel (before `client_first`).
    pub fn with_binding(mut self, binding: Binding) -> ClientSession {
        self.binding = binding;
        self
    }

    /// The mechanism to name in SASLInitialResponse.
    pub fn mechanism(&self) -> &'static str {
        match self.binding {
            Binding::EndPoint(_) => super::MECHANISM_PLUS,
            _ => super::MECHANISM,
        }
    }

    /// SASLInitialResponse data: gs2 header + client-first-message-bare. The
    /// user name is left empty like libpq; PostgreSQL uses the startup user.
    pub fn client_first(&mut self) -> Vec<u8> {
        let client_first_bare = format!("n={},r={}", self.user, self.nonce).into_bytes();
        let mut message = self.binding.gs2_header().to_vec();
        message.extend_from_slice(&client_first_bare);
        self.state = State::SentFirst { client_first_bare };
        message
    }

    /// Takes server-first-message (AuthenticationSASLContinue data) and
    /// returns client-final-message, proof included.
    pub fn server_first(&mut self, data: &[u8]) -> Result<Vec<u8>, AuthError> {
        let State::SentFirst { client_first_bare } =
            std::mem::replace(&mut self.state, State::Finished)
        else {
            return Err(AuthError::OutOfOrder);
        };

        let mut attrs = Attrs::new(data);
        let nonce = attrs.expect(b'r', "nonce expected in server-first-message")?;
        // libpq's check: the server must extend our nonce, byte for byte
        if !nonce.starts_with(self.nonce.as_bytes()) {
            return Err(AuthError::NonceMismatch);
        }
        let salt = attrs.expect(b's', "salt expected in server-first-message")?;
        let salt = b64::decode(salt).ok_or(AuthError::Malformed("invalid salt"))?;
        let iterations = parse_iterations(
            attrs.expect(b'i', "iteration count expected in server-first-message")?,
        )?;
        if !attrs.is_empty() {
            return Err(AuthError::Malformed(
                "garbage at end of server-first-message",
            ));
        }

        let (client_key, server_key) = match &self.credential {
            Credential::Password(password) => {
                let salted = keys::salted_password(password.as_bytes(), &salt, iterations);
                (keys::client_key(&salted), keys::server_key(&salted))
            }
            // The keys already embody the password, salt and iterations.
            Credential::Keys {
                client_key,
                server_key,
            } => (*client_key, *server_key),
        };

        let mut message = b"c=".to_vec();
        message.extend_from_slice(b64::encode(&self.binding.cbind_input()).as_bytes());
        message.extend_from_slice(b",r=");
        message.extend_from_slice(nonce);
        let auth_message = keys::auth_message_parts(&client_first_bare, data, &message);
        let client_signature = keys::hmac(&keys::sha256(&client_key), &auth_message);
        let server_signature = keys::hmac(&server_key, &auth_message);
        let proof = keys::xor(&client_key, &client_signature);

        message.extend_from_slice(b",p=");
        message.extend_from_slice(b64::encode(&proof).as_bytes());
        self.state = State::SentFinal { server_signature };
        Ok(message)
    }

    /// Takes server-final-message (AuthenticationSASLFinal data) and checks
    /// that the server knew the verifier too.
    pub fn server_final(&mut self, data: &[u8]) -> Result<(), AuthError> {
        let State::SentFinal { server_signature } =
            std::mem::replace(&mut self.state, State::Finished)
        else {
            return Err(AuthError::OutOfOrder);
        };
        let mut attrs = Attrs::new(data);
        if data.first() == Some(&b'e') {
            let error = attrs.expect(b'e', "error expected in server-final-message")?;
            return Err(AuthError::ServerError(
                String::from_utf8_lossy(error).into_owned(),
            ));
        }
        let verifier = attrs.expect(b'v', "verifier expected in server-final-message")?;
        if !attrs.is_empty() {
            return Err(AuthError::Malformed(
                "garbage at end of server-final-message",
            ));
        }
        let verifier =
            b64::decode_key(verifier).ok_or(AuthError::Malformed("malformed server signature"))?;
        if !ct::eq(&verifier, &server_signature) {
            return Err(AuthError::InvalidServerSignature);
        }
        Ok(())
    }
}

fn parse_iterations(text: &[u8]) -> Result<u32, AuthError> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return Err(AuthError::InvalidIterationCount);
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<u32>().ok())
        .filter(|i| (1..=MAX_ITERATIONS).contains(i))
        .ok_or(AuthError::InvalidIterationCount)
}
