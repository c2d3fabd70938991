//! Reading the `attr=value,attr=value` syntax shared by all SCRAM messages.

use crate::AuthError;

/// A cursor over a SCRAM message, mirroring PostgreSQL's `read_attr_value`
/// and `read_any_attr` so that edge cases (a trailing comma, extensions)
/// are accepted or refused the same way.
pub(crate) struct Attrs<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(input: &'a [u8]) -> Self {
        Attrs { input, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.input.len()
    }

    /// Offset of the next unread attribute.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Reads attribute `attr`, failing with `missing` if something else is next.
    pub(crate) fn expect(
        &mut self,
        attr: u8,
        missing: &'static str,
    ) -> Result<&'a [u8], AuthError> {
        if self.input.get(self.pos) != Some(&attr) {
            return Err(AuthError::Malformed(missing));
        }
        self.pos += 1;
        self.value()
    }

    /// Reads whatever attribute comes next; `None` at the end of the message.
    pub(crate) fn next_any(&mut self) -> Result<Option<(u8, &'a [u8])>, AuthError> {
        let Some(&attr) = self.input.get(self.pos) else {
            return Ok(None);
        };
        if !attr.is_ascii_alphabetic() {
            return Err(AuthError::Malformed(
                "attribute expected, but found invalid character",
            ));
        }
        self.pos += 1;
        Ok(Some((attr, self.value()?)))
    }

    fn value(&mut self) -> Result<&'a [u8], AuthError> {
        if self.input.get(self.pos) != Some(&b'=') {
            return Err(AuthError::Malformed(
                "expected character \"=\" for attribute",
            ));
        }
        self.pos += 1;
        let rest = self.input.get(self.pos..).unwrap_or_default();
        let len = rest.iter().position(|&b| b == b',').unwrap_or(rest.len());
        let value = &rest[..len];
        // skip the value and its separating comma, if any
        self.pos += len + 1;
        Ok(value)
    }
}

/// RFC 5802 `printable`: %x21-2B / %x2D-7E, i.e. visible ASCII except ','.
pub(crate) fn is_printable(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| (0x21..=0x7e).contains(&b) && b != b',')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_attributes_in_order() {
        let mut a = Attrs::new(b"r=abc,s=,i=4096");
        assert_eq!(a.expect(b'r', "r").unwrap(), b"abc");
        assert_eq!(a.expect(b's', "s").unwrap(), b"");
        assert_eq!(a.pos(), 9);
        assert_eq!(a.next_any().unwrap(), Some((b'i', &b"4096"[..])));
        assert!(a.is_empty());
        assert_eq!(a.next_any().unwrap(), None);
    }

    #[test]
    fn rejects_bad_syntax() {
        assert!(Attrs::new(b"x=1").expect(b'r', "r").is_err());
        assert!(Attrs::new(b"r").expect(b'r', "r").is_err());
        assert!(Attrs::new(b"rx").expect(b'r', "r").is_err());
        assert!(Attrs::new(b"").expect(b'r', "r").is_err());
        assert!(Attrs::new(b"1=2").next_any().is_err());
    }

    #[test]
    fn trailing_comma_is_consumed() {
        let mut a = Attrs::new(b"v=abc,");
        assert_eq!(a.expect(b'v', "v").unwrap(), b"abc");
        assert!(a.is_empty());
    }

    #[test]
    fn printable() {
        assert!(is_printable(
            b"rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
        ));
        assert!(!is_printable(b"a,b"));
        assert!(!is_printable(b"a b"));
        assert!(!is_printable(b"a\x00"));
    }
}
