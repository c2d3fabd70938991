//! Session parameters as PostgreSQL reports them with ParameterStatus.

/// Parameters a client may set at startup and that Weir keeps equal on whatever server the
/// client is lent (PgBouncer's list, plus IntervalStyle).
pub const TRACKED: &[&str] = &[
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
];

/// The canonical spelling of a tracked parameter, matched case-insensitively as PostgreSQL
/// does for GUC names.
pub fn tracked_name(name: &str) -> Option<&'static str> {
    TRACKED
        .iter()
        .copied()
        .find(|t| t.eq_ignore_ascii_case(name))
}

/// Most parameters a server's ParameterStatus messages may add to a set. PostgreSQL
/// reports about twenty (extensions can add a few); without a bound, a server sending
/// distinct names without end grew the set, each one a linear search: 100,000 of them
/// during a login took 27 s of a worker thread (found by the backend_messages fuzz
/// target). Past the bound, new names are passed on but not recorded.
pub const MAX_REPORTED: usize = 256;

/// A small ordered map: a handful of entries, so a Vec beats hashing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamSet(Vec<(String, String)>);

impl ParamSet {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn set(&mut self, name: &str, value: &str) {
        match self.0.iter_mut().find(|(k, _)| k == name) {
            Some((_, v)) => {
                if v != value {
                    value.clone_into(v);
                }
            }
            None => self.0.push((name.to_owned(), value.to_owned())),
        }
    }

    /// Forgets a parameter's value: one compared with it differs.
    pub fn forget(&mut self, name: &str) {
        self.0.retain(|(k, _)| k != name);
    }

    /// Takes `other`'s values for the parameters it names (a server being put into a
    /// client's parameters: what is sent next is compared with these).
    pub fn take_values(&mut self, other: &ParamSet) {
        for (name, value) in other.iter() {
            self.set(name, value);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when this set holds exactly `base` with `over`'s values set on top of it, in
    /// whatever order: the check without building that set (and its strings).
    pub fn is_overlay(&self, base: &ParamSet, over: &ParamSet) -> bool {
        let added = over.iter().filter(|(k, _)| base.get(k).is_none()).count();
        self.len() == base.len() + added
            && self
                .iter()
                .all(|(k, v)| over.get(k).or_else(|| base.get(k)) == Some(v))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Parses a ParameterStatus body and records it (a new name only while the set holds
    /// fewer than [`MAX_REPORTED`]); returns the name when it is a tracked one.
    pub fn apply_status(&mut self, body: &[u8]) -> Option<&'static str> {
        let mut parts = body.split(|b| *b == 0);
        let name = std::str::from_utf8(parts.next()?).ok()?;
        let value = std::str::from_utf8(parts.next()?).ok()?;
        if self.0.len() >= MAX_REPORTED && self.get(name).is_none() {
            return None;
        }
        self.set(name, value);
        tracked_name(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay() {
        let mut base = ParamSet::default();
        base.set("TimeZone", "UTC");
        base.set("application_name", "");
        let mut over = ParamSet::default();
        over.set("application_name", "app");
        over.set("DateStyle", "ISO");
        let mut built = base.clone();
        for (k, v) in over.iter() {
            built.set(k, v);
        }
        assert!(built.is_overlay(&base, &over));
        let mut reordered = ParamSet::default();
        reordered.set("DateStyle", "ISO");
        reordered.set("application_name", "app");
        reordered.set("TimeZone", "UTC");
        assert!(reordered.is_overlay(&base, &over));
        assert!(!base.is_overlay(&base, &over));
        let mut other = built.clone();
        other.set("TimeZone", "Asia/Tokyo");
        assert!(!other.is_overlay(&base, &over));
        other = built.clone();
        other.set("IntervalStyle", "iso_8601");
        assert!(!other.is_overlay(&base, &over));
    }

    #[test]
    fn set_and_apply_status() {
        let mut p = ParamSet::default();
        p.set("TimeZone", "UTC");
        assert_eq!(
            p.apply_status(b"TimeZone\0Europe/Paris\0"),
            Some("TimeZone")
        );
        assert_eq!(p.get("TimeZone"), Some("Europe/Paris"));
        assert_eq!(p.apply_status(b"server_version\x0015.1\0"), None);
        assert_eq!(p.get("server_version"), Some("15.1"));
        assert_eq!(p.apply_status(b"\xff\0x\0"), None);
    }

    #[test]
    fn a_server_cannot_grow_the_set_without_bound() {
        let mut p = ParamSet::default();
        for i in 0..10_000 {
            p.apply_status(format!("p{i}\0v\0").as_bytes());
        }
        assert_eq!(p.len(), MAX_REPORTED);
        // Known names are still updated, tracked ones reported, when it is full.
        assert_eq!(p.apply_status(b"p7\0w\0"), None);
        assert_eq!(p.get("p7"), Some("w"));
        let mut p = ParamSet::default();
        p.set("TimeZone", "UTC");
        for i in 0..10_000 {
            p.apply_status(format!("p{i}\0v\0").as_bytes());
        }
        assert_eq!(p.apply_status(b"TimeZone\0Asia/Tokyo\0"), Some("TimeZone"));
        assert_eq!(p.get("TimeZone"), Some("Asia/Tokyo"));
    }

    #[test]
    fn tracked_names_are_case_insensitive() {
        assert_eq!(tracked_name("datestyle"), Some("DateStyle"));
        assert_eq!(tracked_name("search_path"), None);
    }
}
