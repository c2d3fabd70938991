//! Weir as the SCRAM server, verifying a client (PostgreSQL's auth-scram.c).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use super::keys::{self, Key};
use super::messages::{is_printable, Attrs};
use super::DEFAULT_ITERATIONS;
use crate::{b64, ct, scram_secret, AuthError, ScramSecret, Secret};

/// One SCRAM exchange with a client.
pub struct ServerSession {
    secret: ScramSecret,
    state: State,
    /// tls-server-end-point data (RFC 5929) of the TLS connection the exchange runs on:
    /// SCRAM-SHA-256-PLUS was offered, and a client that binds must bind to this.
    binding: Option<Vec<u8>>,
    /// Tests and fuzzing only (`with_nonce`): a random nonce would stop a replayed
    /// client-final-message at the nonce check.
    fixed_nonce: Option<String>,
}

enum State {
    Initial,
    SentFirst {
        /// What c= must carry: the gs2 header, and the binding data after a 'p'.
        expected_cbind: Vec<u8>,
        client_first_bare: Vec<u8>,
        server_first: Vec<u8>,
        nonce: Vec<u8>,
    },
    Finished,
}

/// The outcome of a successful exchange.
pub struct ServerFinal {
    /// server-final-message (`v=<ServerSignature>`) for AuthenticationSASLFinal.
    pub message: Vec<u8>,
    /// The client's ClientKey, recovered from its proof.
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl fmt::Debug for ServerFinal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerFinal")
            .field("message", &String::from_utf8_lossy(&self.message))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ServerSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Initial => "Initial",
            State::SentFirst { .. } => "SentFirst",
            State::Finished => "Finished",
        };
        f.debug_struct("ServerSession")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// A random key for the process: the salts given to plaintext passwords and the mock
/// verifiers of unknown users derive from it.
fn process_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(keys::random_bytes::<32>)
}

fn derive(label: &[u8], user: &str) -> Key {
    keys::hmac(process_key(), &[label, b"\0", user.as_bytes()])
}

fn user_salt(user: &str) -> Vec<u8> {
    derive(b"salt", user)[..16].to_vec()
}

/// What an unknown user is challenged with (PostgreSQL's scram_mock_salt): the same salt
/// every time for a name, from the same function as a plaintext password's salt, so that
/// neither repeated attempts nor the salt tell a made-up user from a real one; no key is
/// derived, and the exchange fails at the proof as a wrong password does.
pub fn mock_secret(user: &str) -> ScramSecret {
    ScramSecret {
        iterations: DEFAULT_ITERATIONS,
        salt: user_salt(user),
        stored_key: derive(b"stored", user),
        server_key: derive(b"server", user),
    }
}

/// Verifiers made from plaintext passwords. Only users with a secret reach it, so it is
/// as large as the auth_file (or what auth_query returned); it is emptied if it ever
/// holds more than this, rather than grow without bound.
const PLAIN_VERIFIERS_MAX: usize = 4096;

fn plain_verifier(user: &str, password: &str) -> ScramSecret {
    static CACHE: OnceLock<Mutex<HashMap<(String, String), ScramSecret>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (user.to_owned(), password.to_owned());
    if let Some(found) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return found;
    }
    let made = scram_secret(password, &user_salt(user), DEFAULT_ITERATIONS);
    if let Ok(mut c) = cache.lock() {
        if c.len() >= PLAIN_VERIFIERS_MAX {
            c.clear();
        }
        c.insert(key, made.clone());
    }
    made
}

impl ServerSession {
    /// `None` for md5 secrets: SCRAM needs the password or a SCRAM verifier.
    /// A plaintext secret gets a fresh verifier (random 16-byte salt, 4096
    /// iterations), as PostgreSQL would have stored.
    pub fn new(secret: &Secret) -> Option<ServerSession> {
        let secret = match secret {
            Secret::Plain(password) => {
                scram_secret(password, &keys::random_bytes::<16>(), DEFAULT_ITERATIONS)
            }
            Secret::Scram(scram) => scram.clone(),
            Secret::Md5(_) => return None,
        };
        Some(ServerSession::from_scram(secret))
    }

    /// Like [`ServerSession::new`], for `user`, with what a login flood must not make
    /// costly: a plaintext secret's verifier is derived once per user and password (4,096
    /// PBKDF2 rounds on every attempt would let anyone who can connect spend
    /// milliseconds of Weir's CPU per attempt), with a salt fixed per user for the
    /// process, as a stored verifier's is.
    pub fn for_user(user: &str, secret: &Secret) -> Option<ServerSession> {
        let secret = match secret {
            Secret::Plain(password) => plain_verifier(user, password),
            Secret::Scram(scram) => scram.clone(),
            Secret::Md5(_) => return None,
        };
        Some(ServerSession::from_scram(secret))
    }

    #[cfg(test)]
    pub(crate) fn salt(&self) -> &[u8] {
        &self.secret.salt
    }

    pub fn from_scram(secret: ScramSecret) -> ServerSession {
        ServerSession {
            secret,
            state: State::Initial,
            binding: None,
            fixed_nonce: None,
        }
    }

    /// The exchange runs over TLS with these tls-server-end-point data: SCRAM-SHA-256-PLUS
    /// is offered, and a client that says it could bind but thinks the server cannot
    /// ('y') is refused, as PostgreSQL refuses it (a downgrade).
    pub fn with_channel_binding(mut self, data: Vec<u8>) -> ServerSession {
        self.binding = Some(data);
        self
    }

    /// Fixed server nonce, to replay published exchanges (tests, fuzzing). Never for a
    /// real login: the nonce is what makes a recorded exchange useless to replay.
    #[doc(hidden)]
    pub fn with_nonce(secret: ScramSecret, server_nonce: &str) -> ServerSession {
        ServerSession {
            fixed_nonce: Some(server_nonce.to_owned()),
            ..ServerSession::from_scram(secret)
        }
    }

    fn server_nonce(&self) -> String {
        if let Some(nonce) = &self.fixed_nonce {
            return nonce.clone();
        }
        keys::new_nonce()
    }

    /// Takes SASLInitialResponse data (gs2 header + client-first-message-bare)
    /// and returns server-first-message for AuthenticationSASLContinue.
    pub fn client_first(&mut self, data: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::Initial) {
            return Err(AuthError::OutOfOrder);
        }
        self.state = State::Finished;
        let (gs2_header, client_first_bare, client_nonce) = parse_client_first(data)?;
        let mut expected_cbind = gs2_header.to_vec();
        match (gs2_header.first(), &self.binding) {
            (Some(b'p'), Some(binding)) => expected_cbind.extend_from_slice(binding),
            (Some(b'p'), None) => return Err(AuthError::UnsupportedChannelBinding),
            (Some(b'y'), Some(_)) => return Err(AuthError::ChannelBindingDowngrade),
            _ => {}
        }

        let mut nonce = client_nonce.to_vec();
        nonce.extend_from_slice(self.server_nonce().as_bytes());
        let mut server_first = b"r=".to_vec();
        server_first.extend_from_slice(&nonce);
        server_first.extend_from_slice(
            format!(
                ",s={},i={}",
                b64::encode(&self.secret.salt),
                self.secret.iterations
            )
            .as_bytes(),
        );

        self.state = State::SentFirst {
            expected_cbind,
            client_first_bare: client_first_bare.to_vec(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok(server_first)
    }

    /// Takes SASLResponse data (client-final-message) and checks the proof.
    pub fn client_final(&mut self, data: &[u8]) -> Result<ServerFinal, AuthError> {
        let State::SentFirst {
            expected_cbind,
            client_first_bare,
            server_first,
            nonce,
        } = std::mem::replace(&mut self.state, State::Finished)
        else {
            return Err(AuthError::OutOfOrder);
        };
        let msg = parse_client_final(data)?;

        // c= is the gs2 header (with the binding data when the client binds), base64.
        if msg.channel_binding != b64::encode(&expected_cbind).as_bytes() {
            return Err(AuthError::Malformed(
                "unexpected SCRAM channel-binding attribute in client-final-message",
            ));
        }
        if msg.nonce != nonce.as_slice() {
            return Err(AuthError::NonceMismatch);
        }

        let auth_message =
            keys::auth_message_parts(&client_first_bare, &server_first, msg.without_proof);
        let client_signature = keys::hmac(&self.secret.stored_key, &auth_message);
        let client_key = keys::xor(&msg.proof, &client_signature);
        if !ct::eq(&keys::sha256(&client_key), &self.secret.stored_key) {
            return Err(AuthError::WrongPassword);
        }

        let server_signature = keys::hmac(&self.secret.server_key, &auth_message);
        let mut message = b"v=".to_vec();
        message.extend_from_slice(b64::encode(&server_signature).as_bytes());
        Ok(ServerFinal {
            message,
            client_key,
            server_key: self.secret.server_key,
        })
    }
}

/// (gs2 header, client-first-message-bare, client nonce)
type ClientFirst<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// Splits client-first-message into its gs2 header ("n,,", "y,," or
/// "p=tls-server-end-point,,"), the bare part and the client nonce, rejecting what
/// PostgreSQL rejects.
fn parse_client_first(data: &[u8]) -> Result<ClientFirst<'_>, AuthError> {
    // PostgreSQL reads these as C strings; an embedded NUL is garbage.
    if data.contains(&0) {
        return Err(AuthError::Malformed("NUL byte in client-first-message"));
    }
    const END_POINT: &[u8] = b"p=tls-server-end-point";
    let flag_len = match data.first() {
        // 'y': the client could bind but thinks we cannot (the caller decides whether
        // that is true).
        Some(b'n' | b'y') => 1,
        Some(b'p') if data.starts_with(END_POINT) => END_POINT.len(),
        Some(b'p') => return Err(AuthError::UnsupportedChannelBinding),
        _ => return Err(AuthError::Malformed("unexpected channel-binding flag")),
    };
    let rest = match data.get(flag_len..) {
        Some([b',', rest @ ..]) => rest,
        _ => {
            return Err(AuthError::Malformed(
                "comma expected after channel-binding flag",
            ))
        }
    };
    let client_first_bare = match rest {
        [b'a', ..] => return Err(AuthError::UnsupportedAuthzid),
        [b',', bare @ ..] => bare,
        _ => {
            return Err(AuthError::Malformed(
                "unexpected attribute in client-first-message",
            ))
        }
    };
    if client_first_bare.first() == Some(&b'm') {
        return Err(AuthError::UnsupportedExtension);
    }

    let mut attrs = Attrs::new(client_first_bare);
    // The user name is ignored, as PostgreSQL does: the startup packet's wins.
    attrs.expect(b'n', "user name expected in client-first-message")?;
    let client_nonce = attrs.expect(b'r', "nonce expected in client-first-message")?;
    if client_nonce.is_empty() || !is_printable(client_nonce) {
        return Err(AuthError::Malformed(
            "non-printable characters in SCRAM nonce",
        ));
    }
    // optional extensions, none of which we understand
    while attrs.next_any()?.is_some() {}
    let gs2_header = &data[..data.len() - client_first_bare.len()];
    Ok((gs2_header, client_first_bare, client_nonce))
}

struct ClientFinal<'a> {
    channel_binding: &'a [u8],
    nonce: &'a [u8],
    proof: Key,
    without_proof: &'a [u8],
}

fn parse_client_final(data: &[u8]) -> Result<ClientFinal<'_>, AuthError> {
    let mut attrs = Attrs::new(data);
    let channel_binding = attrs.expect(b'c', "channel binding expected in client-final-message")?;
    let nonce = attrs.expect(b'r', "nonce expected in client-final-message")?;
    let (proof_start, proof) = loop {
        let start = attrs.pos();
        match attrs.next_any()? {
            Some((b'p', value)) => break (start, value),
            Some(_) => continue, // extensions before the proof are ignored
            None => {
                return Err(AuthError::Malformed(
                    "proof missing in client-final-message",
                ))
            }
        }
    };
    if !attrs.is_empty() {
        return Err(AuthError::Malformed(
            "garbage at end of client-final-message",
        ));
    }
    let proof = b64::decode_key(proof).ok_or(AuthError::Malformed(
        "malformed proof in client-final-message",
    ))?;
    // everything before ",p="
    let without_proof = data
        .get(..proof_start.saturating_sub(1))
        .unwrap_or_default();
    Ok(ClientFinal {
        channel_binding,
        nonce,
        proof,
        without_proof,
    })
}
