use subtle::ConstantTimeEq;

/// Equality that does not leak, through timing, how many leading bytes match.
/// Lengths are not secret (hashes and proofs have fixed sizes), so a length
/// mismatch returns early.
pub fn eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn compares() {
        assert!(super::eq(b"abc", b"abc"));
        assert!(!super::eq(b"abc", b"abd"));
        assert!(!super::eq(b"abc", b"ab"));
        assert!(super::eq(b"", b""));
    }
}
