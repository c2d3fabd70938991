//! The SCRAM-SHA-256 key schedule (RFC 5802 section 3).

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::b64;
use crate::saslprep;

pub(crate) type Key = [u8; 32];

/// PostgreSQL's SCRAM_RAW_NONCE_LEN: 18 random bytes, 24 base64 characters.
const RAW_NONCE_LEN: usize = 18;

pub(crate) fn hmac(key: &[u8], parts: &[&[u8]]) -> Key {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

pub(crate) fn sha256(data: &[u8]) -> Key {
    Sha256::digest(data).into()
}

/// Hi(Normalize(password), salt, i), with PostgreSQL's SASLprep fallback.
pub(crate) fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> Key {
    let prepared = saslprep::prepare(password);
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(&prepared, salt, iterations, &mut out);
    out
}

pub(crate) fn client_key(salted_password: &Key) -> Key {
    hmac(salted_password, &[b"Client Key"])
}

pub(crate) fn server_key(salted_password: &Key) -> Key {
    hmac(salted_password, &[b"Server Key"])
}

/// AuthMessage = client-first-message-bare "," server-first-message ","
/// client-final-message-without-proof
pub(crate) fn auth_message_parts<'a>(
    client_first_bare: &'a [u8],
    server_first: &'a [u8],
    client_final_without_proof: &'a [u8],
) -> [&'a [u8]; 5] {
    [
        client_first_bare,
        b",",
        server_first,
        b",",
        client_final_without_proof,
    ]
}

pub(crate) fn xor(a: &Key, b: &Key) -> Key {
    let mut out = [0u8; 32];
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b)) {
        *o = x ^ y;
    }
    out
}

pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes
}

pub(crate) fn new_nonce() -> String {
    b64::encode(&random_bytes::<RAW_NONCE_LEN>())
}
