//! Stored secrets, as found in an auth_file or returned by auth_query.

use std::fmt;

use crate::scram::keys;
use crate::{b64, ct, md5};

/// A password secret in any of the forms PostgreSQL stores or PgBouncer's
/// auth_file accepts.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Plain(String),
    /// `"md5"` followed by 32 lowercase hex digits.
    Md5(String),
    Scram(ScramSecret),
}

/// A SCRAM-SHA-256 verifier (`SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>`).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramSecret {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl Secret {
    /// Classifies a secret the way PostgreSQL's `get_password_type` does:
    /// anything that is not a well-formed md5 hash or SCRAM verifier is a
    /// plaintext password.
    pub fn parse(text: &str) -> Secret {
        if md5::is_md5_secret(text) {
            Secret::Md5(text.to_owned())
        } else if let Some(scram) = ScramSecret::parse(text) {
            Secret::Scram(scram)
        } else {
            Secret::Plain(text.to_owned())
        }
    }
}

impl fmt::Debug for Secret {
    // Secrets end up in config dumps and error logs; keep them out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Plain(_) => f.write_str("Secret::Plain(<redacted>)"),
            Secret::Md5(_) => f.write_str("Secret::Md5(<redacted>)"),
            Secret::Scram(s) => f.debug_tuple("Secret::Scram").field(s).finish(),
        }
    }
}

impl ScramSecret {
    /// Parses the format written by PostgreSQL's `scram_build_secret`. The
    /// salt may have any length: managed services do not all use 16 bytes.
    pub fn parse(text: &str) -> Option<ScramSecret> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored_key, server_key) = keys.split_once(':')?;
        if iterations.is_empty() || !iterations.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let iterations: u32 = iterations.parse().ok().filter(|&i| i >= 1)?;
        Some(ScramSecret {
            iterations,
            salt: b64::decode(salt.as_bytes())?,
            stored_key: b64::decode_key(stored_key.as_bytes())?,
            server_key: b64::decode_key(server_key.as_bytes())?,
        })
    }

    fn from_password_bytes(password: &[u8], salt: &[u8], iterations: u32) -> ScramSecret {
        let salted = keys::salted_password(password, salt, iterations);
        ScramSecret {
            iterations,
            salt: salt.to_vec(),
            stored_key: keys::sha256(&keys::client_key(&salted)),
            server_key: keys::server_key(&salted),
        }
    }

    /// Whether `password` is the one this verifier was built from.
    pub fn verify_password(&self, password: &[u8]) -> bool {
        let candidate = ScramSecret::from_password_bytes(password, &self.salt, self.iterations);
        // Both keys, though PostgreSQL checks only ServerKey: a verifier whose
        // halves disagree is corrupt and should not let anyone in.
        let stored_ok = ct::eq(&candidate.stored_key, &self.stored_key);
        let server_ok = ct::eq(&candidate.server_key, &self.server_key);
        stored_ok & server_ok
    }
}

/// The text form PostgreSQL stores in `pg_authid.rolpassword`.
impl fmt::Display for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            b64::encode(&self.salt),
            b64::encode(&self.stored_key),
            b64::encode(&self.server_key)
        )
    }
}

impl fmt::Debug for ScramSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramSecret")
            .field("iterations", &self.iterations)
            .field("salt", &b64::encode(&self.salt))
            .finish_non_exhaustive()
    }
}

/// Builds a SCRAM-SHA-256 verifier like PostgreSQL's `scram_build_secret`,
/// SASLprep included (raw bytes when SASLprep rejects the password).
pub fn scram_secret(password: &str, salt: &[u8], iterations: u32) -> ScramSecret {
    ScramSecret::from_password_bytes(password.as_bytes(), salt, iterations)
}

/// Checks a cleartext password (auth_type=plain, or a PasswordMessage sent in
/// answer to AuthenticationCleartextPassword) against any kind of secret.
pub fn plain_verify(user: &str, secret: &Secret, password: &[u8]) -> bool {
    match secret {
        Secret::Plain(expected) => ct::eq(expected.as_bytes(), password),
        Secret::Md5(expected) => ct::eq(
            expected.as_bytes(),
            md5::md5_secret_bytes(user.as_bytes(), password).as_bytes(),
        ),
        Secret::Scram(scram) => scram.verify_password(password),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // Stored by PostgreSQL 15 with password_encryption = scram-sha-256.
    pub(crate) const PG_FOO: &str = "SCRAM-SHA-256$4096:CoNmwUe3I4HPiPQkphMLpg==$xtGJB1i6wK00Mwi6oSfXrSZ96YcmEbbqEWSXkeyvpdI=:KflFTG00zROqLlYY00ICnoV9cYeo9em5M2MTR2mko7I=";
    pub(crate) const PG_PENCIL: &str = "SCRAM-SHA-256$4096:XuOKuHT1V7J6+0Ci7W1+iQ==$qEqhNYrClP97kKWz7/cTsw+vQtcSI7z72mIey6YM+98=:xQfUCw84bq4JpAUcF6OioJmLItg/xWJipBaDLqXPTVc=";
    /// Password "a\u{AD}b\u{FB01}", which SASLprep turns into "abfi".
    const PG_SASLPREPPED: &str = "SCRAM-SHA-256$4096:7qt5YPJd/Yh8EbEX0hZkHQ==$OFMRORKDQuuCxBQLi42WN2pqUPpML9nbI1HyiuYAp3s=:iscNYfFlCjElYurgUkHK/C2Ft59omuZOpkwgLQhC6Fs=";
    /// Password "a\x07b": ASCII, so used verbatim.
    const PG_CONTROL_CHAR: &str = "SCRAM-SHA-256$4096:J1KVg1qSoR6dteoiMzoKKw==$3PX7x9nGDSZMkxV9JifwcEXUo+REISAQSJHB0R9+D0E=:vtXaLGRpBam8FkzKU7S/WJPFqK4QVKY0dlYXB3DjIfc=";
    /// Password "foo" with the 32-byte salt 00 01 .. 1f (Python hashlib).
    pub(crate) const FOO_SALT32: &str = "SCRAM-SHA-256$4096:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=$2XSSxIAa8JSnZGnwIW+f90HdRVr+CPzkOOM1Uu2GFGQ=:a/uIs3nTcixehHWQmE7EB6jyprt2WbCvD2Uj+9048UI=";

    fn scram(text: &str) -> ScramSecret {
        match Secret::parse(text) {
            Secret::Scram(s) => s,
            other => panic!("not a SCRAM secret: {other:?}"),
        }
    }

    #[test]
    fn builds_the_verifier_postgres_stores() {
        for (stored, password) in [
            (PG_FOO, "foo"),
            (PG_PENCIL, "pencil"),
            (PG_SASLPREPPED, "a\u{AD}b\u{FB01}"),
            (PG_CONTROL_CHAR, "a\x07b"),
        ] {
            let parsed = scram(stored);
            let built = scram_secret(password, &parsed.salt, parsed.iterations);
            assert_eq!(built, parsed, "{password:?}");
            assert_eq!(built.to_string(), stored);
        }
    }

    #[test]
    fn thirty_two_byte_salt() {
        let parsed = scram(FOO_SALT32);
        assert_eq!(parsed.salt, (0u8..32).collect::<Vec<_>>());
        assert_eq!(scram_secret("foo", &parsed.salt, 4096), parsed);
        assert_eq!(parsed.to_string(), FOO_SALT32);
        assert!(plain_verify("u", &Secret::Scram(parsed.clone()), b"foo"));
        assert!(!plain_verify("u", &Secret::Scram(parsed), b"fooo"));
    }

    #[test]
    fn parse_classifies() {
        assert!(matches!(
            Secret::parse("md53175bce1d3201d16594cebf9d7eb3f9d"),
            Secret::Md5(_)
        ));
        assert!(matches!(Secret::parse(PG_FOO), Secret::Scram(_)));
        for plain in [
            "",
            "hunter2",
            "MD53175bce1d3201d16594cebf9d7eb3f9d",
            "SCRAM-SHA-256$",
            "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",            // keys too short
            "SCRAM-SHA-256$0:CoNmwUe3I4HPiPQkphMLpg==$xtGJB1i6wK00Mwi6oSfXrSZ96YcmEbbqEWSXkeyvpdI=:KflFTG00zROqLlYY00ICnoV9cYeo9em5M2MTR2mko7I=",
            "SCRAM-SHA-256$-1:CoNmwUe3I4HPiPQkphMLpg==$xtGJB1i6wK00Mwi6oSfXrSZ96YcmEbbqEWSXkeyvpdI=:KflFTG00zROqLlYY00ICnoV9cYeo9em5M2MTR2mko7I=",
            "SCRAM-SHA-256$4096:!!$xtGJB1i6wK00Mwi6oSfXrSZ96YcmEbbqEWSXkeyvpdI=:KflFTG00zROqLlYY00ICnoV9cYeo9em5M2MTR2mko7I=",
            "SCRAM-SHA-256$4096:CoNmwUe3I4HPiPQkphMLpg==$xtGJB1i6wK00Mwi6oSfXrSZ96YcmEbbqEWSXkeyvpdI=",
            "SCRAM-SHA-1$4096:CoNmwUe3I4HPiPQkphMLpg==$xtGJB1i6wK00Mwi6oSfXrSZ96YcmEbbqEWSXkeyvpdI=:KflFTG00zROqLlYY00ICnoV9cYeo9em5M2MTR2mko7I=",
        ] {
            assert_eq!(Secret::parse(plain), Secret::Plain(plain.to_owned()), "{plain:?}");
        }
    }

    #[test]
    fn plain_verify_all_kinds() {
        let kinds = [
            Secret::Plain("foo".into()),
            Secret::Md5(crate::md5_secret("x", "foo")),
            Secret::parse(PG_FOO),
        ];
        for secret in &kinds {
            assert!(plain_verify("x", secret, b"foo"), "{secret:?}");
            assert!(!plain_verify("x", secret, b"Foo"), "{secret:?}");
            assert!(!plain_verify("x", secret, b""), "{secret:?}");
            assert!(!plain_verify("x", secret, b"\xff"), "{secret:?}");
        }
        // md5 hashes are salted with the user name
        assert!(!plain_verify("y", &kinds[1], b"foo"));
        assert!(plain_verify(
            "",
            &Secret::parse(PG_SASLPREPPED),
            "abfi".as_bytes()
        ));
    }

    #[test]
    fn debug_hides_secrets() {
        let shown = format!(
            "{:?} {:?} {:?}",
            Secret::Plain("hunter2".into()),
            Secret::parse("md53175bce1d3201d16594cebf9d7eb3f9d"),
            Secret::parse(PG_FOO)
        );
        assert!(!shown.contains("hunter2"));
        assert!(!shown.contains("3175bce"));
        assert!(!shown.contains("xtGJB1i6"));
    }
}
