//! What a client is shown once logged in: the server's session parameters (cached by
//! the pool, which owns the servers that reported them), as
//! ParameterStatus messages encoded once per pool rather than once per login.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use crate::params::{tracked_name, ParamSet};
use crate::protocol::messages;

pub struct Welcome {
    params: ParamSet,
    /// One ParameterStatus per parameter of `params`, back to back, in the same order.
    wire: Bytes,
    /// Where each of those messages ends in `wire`.
    ends: Vec<usize>,
    /// The tracked parameters among them: a new client's starting point.
    tracked: Arc<ParamSet>,
    /// The distinct sets clients ended up with after asking for their own values at
    /// startup (most ask for the same few, e.g. one application_name): shared, not copied
    /// into every client.
    interned: Mutex<Vec<Arc<ParamSet>>>,
}

/// Beyond this many distinct sets, clients get their own copy.
const MAX_INTERNED: usize = 64;

impl Welcome {
    pub fn new(params: ParamSet) -> Welcome {
        let mut wire = BytesMut::new();
        let mut ends = Vec::new();
        let mut tracked = ParamSet::default();
        for (k, v) in params.iter() {
            messages::parameter_status(&mut wire, k, v);
            ends.push(wire.len());
            if tracked_name(k).is_some() {
                tracked.set(k, v);
            }
        }
        Welcome {
            params,
            wire: wire.freeze(),
            ends,
            tracked: Arc::new(tracked),
            interned: Mutex::new(Vec::new()),
        }
    }

    /// Writes the ParameterStatus messages of a welcome (the client's own value where it
    /// asked for one at startup) and returns the tracked parameters the client now has.
    pub fn write(&self, requested: &ParamSet, out: &mut BytesMut) -> Arc<ParamSet> {
        if requested.is_empty() {
            out.extend_from_slice(&self.wire);
            return self.tracked.clone();
        }
        let mut start = 0;
        for ((k, v), &end) in self.params.iter().zip(&self.ends) {
            match requested.get(k) {
                Some(mine) if mine != v => messages::parameter_status(out, k, mine),
                _ => out.extend_from_slice(&self.wire[start..end]),
            }
            start = end;
        }
        for (k, v) in requested.iter() {
            if self.params.get(k).is_none() {
                messages::parameter_status(out, k, v);
            }
        }
        self.intern(requested)
    }

    /// The shared set of the tracked parameters with the client's own values: found
    /// without building it (a dozen strings per login) unless it is new.
    fn intern(&self, requested: &ParamSet) -> Arc<ParamSet> {
        let mut interned = self.interned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(shared) = interned
            .iter()
            .find(|s| s.is_overlay(&self.tracked, requested))
        {
            return shared.clone();
        }
        let mut set = (*self.tracked).clone();
        for (k, v) in requested.iter() {
            set.set(k, v);
        }
        let set = Arc::new(set);
        if interned.len() < MAX_INTERNED {
            interned.push(set.clone());
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> ParamSet {
        let mut p = ParamSet::default();
        p.set("server_version", "15.1");
        p.set("TimeZone", "UTC");
        p.set("application_name", "");
        p
    }

    fn encode(pairs: &[(&str, &str)]) -> BytesMut {
        let mut b = BytesMut::new();
        for (k, v) in pairs {
            messages::parameter_status(&mut b, k, v);
        }
        b
    }

    #[test]
    fn server_values_unless_the_client_asked() {
        let w = Welcome::new(server());
        let mut out = BytesMut::new();
        let wanted = w.write(&ParamSet::default(), &mut out);
        assert_eq!(
            out,
            encode(&[
                ("server_version", "15.1"),
                ("TimeZone", "UTC"),
                ("application_name", "")
            ])
        );
        assert_eq!(wanted.get("TimeZone"), Some("UTC"));
        assert_eq!(wanted.get("server_version"), None);

        let mut requested = ParamSet::default();
        requested.set("application_name", "app");
        requested.set("DateStyle", "ISO, DMY");
        let mut out = BytesMut::new();
        let wanted = w.write(&requested, &mut out);
        assert_eq!(
            out,
            encode(&[
                ("server_version", "15.1"),
                ("TimeZone", "UTC"),
                ("application_name", "app"),
                ("DateStyle", "ISO, DMY")
            ])
        );
        assert_eq!(wanted.get("application_name"), Some("app"));
        assert_eq!(wanted.get("DateStyle"), Some("ISO, DMY"));
        assert_eq!(wanted.get("TimeZone"), Some("UTC"));
        // A second client asking the same shares the set.
        let again = w.write(&requested, &mut BytesMut::new());
        assert!(Arc::ptr_eq(&wanted, &again));
    }
}
