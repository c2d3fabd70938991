//! PostgreSQL's md5 password scheme.

use md5::{Digest, Md5};

use crate::{ct, Secret};

const PREFIX: &str = "md5";

/// PostgreSQL's `isMD5`: exactly "md5" and 32 *lowercase* hex digits.
pub(crate) fn is_md5_secret(text: &str) -> bool {
    text.len() == 35
        && text.starts_with(PREFIX)
        && text
            .bytes()
            .skip(3)
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn md5_hex(parts: &[&[u8]]) -> String {
    let mut hasher = Md5::new();
    for part in parts {
        hasher.update(part);
    }
    let mut out = String::with_capacity(35);
    out.push_str(PREFIX);
    for byte in hasher.finalize() {
        out.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    out
}

pub(crate) fn md5_secret_bytes(user: &[u8], password: &[u8]) -> String {
    md5_hex(&[password, user])
}

/// The stored form of `password`: `"md5" + hex(md5(password || user))`.
pub fn md5_secret(user: &str, password: &str) -> String {
    md5_secret_bytes(user.as_bytes(), password.as_bytes())
}

/// What a client sends in answer to AuthenticationMD5Password(salt):
/// `"md5" + hex(md5(hex(md5(password || user)) || salt))`. `None` for SCRAM
/// secrets, from which the md5 hash cannot be recovered.
pub fn md5_response(user: &str, secret: &Secret, salt: [u8; 4]) -> Option<String> {
    let stored = match secret {
        Secret::Plain(password) => md5_secret(user, password),
        Secret::Md5(hash) => hash.clone(),
        Secret::Scram(_) => return None,
    };
    let hex = stored.strip_prefix(PREFIX)?;
    Some(md5_hex(&[hex.as_bytes(), &salt]))
}

/// Checks a client's md5 PasswordMessage payload (without its trailing NUL).
pub fn md5_verify(user: &str, secret: &Secret, salt: [u8; 4], response: &[u8]) -> bool {
    md5_response(user, secret, salt).is_some_and(|expected| ct::eq(expected.as_bytes(), response))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Stored by PostgreSQL 15 (password_encryption = md5).
    const POSTGRES_POSTGRES: &str = "md53175bce1d3201d16594cebf9d7eb3f9d";
    const ALICE_SECRET: &str = "md54a0a68b43b6cd5cf266fa02f196e2371";
    const M_POSTGRES: &str = "md5e55f71fef883ee8efa627b60ba1e4c26";

    #[test]
    fn secret_matches_postgres() {
        assert_eq!(md5_secret("postgres", "postgres"), POSTGRES_POSTGRES);
        assert_eq!(md5_secret("alice", "secret"), ALICE_SECRET);
        assert_eq!(md5_secret("m", "postgres"), M_POSTGRES);
    }

    #[test]
    fn response_known_vector() {
        // md5(hex(md5("secretalice")) || 01 02 03 04), computed independently
        let expected = "md598a0412b9c31436fc53776e863350083";
        let salt = [1, 2, 3, 4];
        assert_eq!(
            md5_response("alice", &Secret::Plain("secret".into()), salt).unwrap(),
            expected
        );
        assert_eq!(
            md5_response("alice", &Secret::parse(ALICE_SECRET), salt).unwrap(),
            expected
        );
    }

    #[test]
    fn verify_round_trip() {
        let salt = [0xde, 0xad, 0xbe, 0xef];
        for secret in [Secret::Plain("secret".into()), Secret::parse(ALICE_SECRET)] {
            let response = md5_response("alice", &secret, salt).unwrap();
            assert!(md5_verify("alice", &secret, salt, response.as_bytes()));
            assert!(!md5_verify(
                "alice",
                &secret,
                [0, 0, 0, 0],
                response.as_bytes()
            ));
            assert!(!md5_verify("alice", &secret, salt, b""));
            assert!(!md5_verify(
                "alice",
                &secret,
                salt,
                &response.as_bytes()[..34]
            ));
        }
        // a plaintext secret is hashed with the user name it is checked for
        let response = md5_response("alice", &Secret::Plain("secret".into()), salt).unwrap();
        assert!(!md5_verify(
            "bob",
            &Secret::Plain("secret".into()),
            salt,
            response.as_bytes()
        ));
        let wrong = md5_response("alice", &Secret::Plain("Secret".into()), salt).unwrap();
        assert!(!md5_verify(
            "alice",
            &Secret::parse(ALICE_SECRET),
            salt,
            wrong.as_bytes()
        ));
    }

    #[test]
    fn scram_secrets_cannot_answer_md5() {
        let secret = Secret::Scram(crate::scram_secret("x", b"salt", 1));
        assert_eq!(md5_response("u", &secret, [0; 4]), None);
        assert!(!md5_verify("u", &secret, [0; 4], b"md5"));
    }

    #[test]
    fn hand_built_md5_secret_without_prefix_does_not_panic() {
        assert_eq!(md5_response("u", &Secret::Md5("xx".into()), [0; 4]), None);
        assert_eq!(md5_response("u", &Secret::Md5("é".into()), [0; 4]), None);
    }

    #[test]
    fn detection_is_as_strict_as_postgres() {
        assert!(is_md5_secret(POSTGRES_POSTGRES));
        assert!(!is_md5_secret(&POSTGRES_POSTGRES.to_uppercase()));
        assert!(!is_md5_secret("md53175BCE1d3201d16594cebf9d7eb3f9d"));
        assert!(!is_md5_secret("md53175bce1d3201d16594cebf9d7eb3f9"));
        assert!(!is_md5_secret("md53175bce1d3201d16594cebf9d7eb3f9dd"));
        assert!(!is_md5_secret("md53175bce1d3201d16594cebf9d7eb3f9g"));
    }
}
