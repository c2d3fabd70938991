//! SASLprep (RFC 4013) the way PostgreSQL's `pg_saslprep` does it.
//!
//! Client and server must derive the same salted password, so what matters is
//! agreeing with PostgreSQL and libpq, not with the RFC. PostgreSQL differs
//! from a textbook SASLprep in three ways that change the result:
//! pure-ASCII input is used verbatim (control characters included), input
//! that maps to nothing is rejected, and the prohibited/bidi checks look at
//! the mapped string *before* NFKC. On any failure the raw bytes are used.

use std::borrow::Cow;

use stringprep::tables;
use unicode_normalization::UnicodeNormalization;

/// Returns the bytes to feed into PBKDF2 for `password`.
pub(crate) fn prepare(password: &[u8]) -> Cow<'_, [u8]> {
    if password.is_ascii() {
        return Cow::Borrowed(password);
    }
    match std::str::from_utf8(password).ok().and_then(pg_saslprep) {
        Some(prepared) => Cow::Owned(prepared.into_bytes()),
        None => Cow::Borrowed(password),
    }
}

fn pg_saslprep(input: &str) -> Option<String> {
    let mapped: Vec<char> = input
        .chars()
        .filter_map(|c| {
            if tables::non_ascii_space_character(c) {
                Some(' ')
            } else if tables::commonly_mapped_to_nothing(c) {
                None
            } else {
                Some(c)
            }
        })
        .collect();
    let (&first, &last) = (mapped.first()?, mapped.last()?);

    if mapped.iter().any(|&c| prohibited(c)) {
        return None;
    }
    if mapped.iter().any(|&c| tables::bidi_r_or_al(c))
        && (mapped.iter().any(|&c| tables::bidi_l(c))
            || !tables::bidi_r_or_al(first)
            || !tables::bidi_r_or_al(last))
    {
        return None;
    }
    Some(mapped.into_iter().nfkc().collect())
}

/// The union PostgreSQL calls `prohibited_output_ranges`, plus unassigned
/// code points (table A.1).
fn prohibited(c: char) -> bool {
    tables::non_ascii_space_character(c)
        || tables::ascii_control_character(c)
        || tables::non_ascii_control_character(c)
        || tables::private_use(c)
        || tables::non_character_code_point(c)
        || tables::surrogate_code(c)
        || tables::inappropriate_for_plain_text(c)
        || tables::inappropriate_for_canonical_representation(c)
        || tables::change_display_properties_or_deprecated(c)
        || tables::tagging_character(c)
        || tables::unassigned_code_point(c)
}

#[cfg(test)]
mod tests {
    use super::prepare;

    #[test]
    fn ascii_is_verbatim_even_with_controls() {
        assert_eq!(&*prepare(b"pencil"), b"pencil");
        assert_eq!(&*prepare(b"a\x07b"), b"a\x07b");
    }

    #[test]
    fn maps_and_normalises() {
        // soft hyphen maps to nothing, U+FB01 (fi ligature) NFKC-decomposes,
        // U+00A0 maps to a space.
        assert_eq!(&*prepare("a\u{AD}b\u{FB01}".as_bytes()), b"abfi");
        assert_eq!(&*prepare("a\u{A0}b".as_bytes()), b"a b");
        assert_eq!(&*prepare("I\u{2168}".as_bytes()), b"IIX");
    }

    #[test]
    fn failures_fall_back_to_raw_bytes() {
        // maps to nothing: PostgreSQL refuses an empty result
        assert_eq!(&*prepare("\u{AD}".as_bytes()), "\u{AD}".as_bytes());
        // prohibited (private use)
        assert_eq!(&*prepare("a\u{E000}".as_bytes()), "a\u{E000}".as_bytes());
        // RandALCat mixed with LCat
        assert_eq!(
            &*prepare("\u{5D0}a\u{5D0}".as_bytes()),
            "\u{5D0}a\u{5D0}".as_bytes()
        );
        // not UTF-8
        assert_eq!(&*prepare(b"\xff\xfe"), b"\xff\xfe");
    }

    #[test]
    fn bidi_string_that_is_all_rtl_is_accepted() {
        assert_eq!(
            &*prepare("\u{5D0}\u{5D1}".as_bytes()),
            "\u{5D0}\u{5D1}".as_bytes()
        );
    }
}
