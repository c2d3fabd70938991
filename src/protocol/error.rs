//! An error as PostgreSQL reports it: severity, SQLSTATE and message. Weir builds these for
//! the clients it refuses and keeps the ones a server sends it while logging in.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// Boxed: errors are rare, and they travel inside the futures and enums every client task
/// carries, which should not grow by four strings for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgError(Box<ErrorFields>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    /// PostgreSQL's source function ('R'), for an error Weir makes in PostgreSQL's place
    /// where drivers tell errors apart by it (asyncpg's InvalidCachedStatementError).
    pub routine: Option<&'static str>,
}

impl Deref for PgError {
    type Target = ErrorFields;
    fn deref(&self) -> &ErrorFields {
        &self.0
    }
}

impl DerefMut for PgError {
    fn deref_mut(&mut self) -> &mut ErrorFields {
        &mut self.0
    }
}

impl PgError {
    pub fn new(severity: &str, code: &str, message: impl Into<String>) -> PgError {
        PgError(Box::new(ErrorFields {
            severity: severity.into(),
            code: code.into(),
            message: message.into(),
            detail: None,
            routine: None,
        }))
    }

    pub fn into_fields(self) -> ErrorFields {
        *self.0
    }

    pub fn fatal(code: &str, message: impl Into<String>) -> PgError {
        PgError::new("FATAL", code, message)
    }

    pub fn error(code: &str, message: impl Into<String>) -> PgError {
        PgError::new("ERROR", code, message)
    }

    /// Parses the fields of an ErrorResponse/NoticeResponse body.
    pub fn parse(body: &[u8]) -> PgError {
        let mut e = PgError::new("ERROR", "XX000", "");
        for field in body.split(|b| *b == 0) {
            let Some((&tag, value)) = field.split_first() else {
                continue;
            };
            let value = String::from_utf8_lossy(value).into_owned();
            match tag {
                b'S' => e.severity = value,
                b'C' => e.code = value,
                b'M' => e.message = value,
                b'D' => e.detail = Some(value),
                _ => {}
            }
        }
        e
    }
}

/// The SQLSTATE of an ErrorResponse/NoticeResponse body, without parsing the rest.
pub fn error_code(fields: &[u8]) -> Option<&[u8]> {
    fields.split(|b| *b == 0).find_map(|f| f.strip_prefix(b"C"))
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.code, self.message)
    }
}

impl std::error::Error for PgError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_the_builder() {
        let err = PgError::fatal("28P01", "password authentication failed for user \"x\"");
        let msg = crate::protocol::messages::error_response(&err);
        assert_eq!(msg[0], b'E');
        let parsed = PgError::parse(&msg[5..]);
        assert_eq!(parsed, err);
    }

    #[test]
    fn parse_tolerates_garbage() {
        let e = PgError::parse(b"\0\0S");
        assert_eq!(e.severity, "");
        let e = PgError::parse(b"");
        assert_eq!(e.code, "XX000");
    }
}
