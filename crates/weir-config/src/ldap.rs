//! LDAP options, as PgBouncer takes them from `auth_ldap_options` (auth_type ldap) and from
//! the options of an hba `ldap` line: PostgreSQL's names (`ldapserver`, `ldapport`,
//! `ldapscheme`, `ldaptls`, `ldapprefix`, `ldapsuffix`, `ldapbasedn`, `ldapbinddn`,
//! `ldapbindpasswd`, `ldapsearchattribute`, `ldapsearchfilter`, `ldapurl`). PgBouncer
//! reads them at each login and fails that login on a bad one; here they are read at load,
//! so a mistake is refused where it was made, with PgBouncer's words.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    Base,
    One,
    #[default]
    Sub,
}

#[derive(Clone, PartialEq, Eq, Default)]
pub struct LdapOptions {
    /// `ldaps`: TLS from the first byte.
    pub ldaps: bool,
    /// Tried in order until one answers.
    pub servers: Vec<String>,
    /// None: 389, or 636 for ldaps.
    pub port: Option<u16>,
    /// `ldaptls=1`: StartTLS before anything else is sent.
    pub starttls: bool,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub basedn: Option<String>,
    pub binddn: Option<String>,
    pub bindpasswd: Option<String>,
    pub search_attribute: Option<String>,
    pub search_filter: Option<String>,
    pub scope: Scope,
}

impl fmt::Debug for LdapOptions {
    // The bind password stays out of logs and panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LdapOptions")
            .field("ldaps", &self.ldaps)
            .field("servers", &self.servers)
            .field("port", &self.port)
            .field("starttls", &self.starttls)
            .field("prefix", &self.prefix)
            .field("suffix", &self.suffix)
            .field("basedn", &self.basedn)
            .field("binddn", &self.binddn)
            .field("bindpasswd", &self.bindpasswd.as_ref().map(|_| "..."))
            .field("search_attribute", &self.search_attribute)
            .field("search_filter", &self.search_filter)
            .field("scope", &self.scope)
            .finish()
    }
}

impl LdapOptions {
    /// `auth_ldap_options`: the same `key=value` words as an hba line, quoted alike.
    pub fn parse_str(text: &str) -> Result<LdapOptions, String> {
        let words: Vec<String> = crate::hba::fields(text)
            .into_iter()
            .flatten()
            .map(|item| item.text)
            .collect();
        LdapOptions::parse(&words)
    }

    /// `key=value` words (quotes already taken off).
    pub fn parse(words: &[String]) -> Result<LdapOptions, String> {
        let mut o = LdapOptions::default();
        for w in words {
            let Some((key, value)) = w.split_once('=') else {
                return Err(format!("invalid LDAP key parameter: \"{w}\""));
            };
            let value = value.to_owned();
            match key {
                "ldaptls" => o.starttls = value == "1",
                "ldapscheme" => match value.as_str() {
                    "ldap" => o.ldaps = false,
                    "ldaps" => o.ldaps = true,
                    _ => return Err(format!("invalid ldapscheme value: \"{value}\"")),
                },
                "ldapport" => match value.parse::<u16>() {
                    Ok(p) if p != 0 => o.port = Some(p),
                    _ => return Err(format!("invalid LDAP port number: \"{value}\"")),
                },
                "ldapserver" => {
                    o.servers = value.split_whitespace().map(str::to_owned).collect();
                }
                "ldapbinddn" => o.binddn = Some(value),
                "ldapbindpasswd" => o.bindpasswd = Some(value),
                "ldapsearchattribute" => o.search_attribute = Some(value),
                "ldapsearchfilter" => o.search_filter = Some(value),
                "ldapbasedn" => o.basedn = Some(value),
                "ldapprefix" => o.prefix = Some(value),
                "ldapsuffix" => o.suffix = Some(value),
                "ldapurl" => o.url(&value)?,
                _ => return Err(format!("invalid LDAP key parameter: \"{key}\"")),
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// `ldap[s]://host[:port]/basedn[?[attribute][?[scope][?[filter]]]]` (RFC 4516), as
    /// PostgreSQL reads it: the first attribute only, the scope `base` unless given.
    fn url(&mut self, url: &str) -> Result<(), String> {
        let bad = || format!("could not parse LDAP URL \"{url}\"");
        let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
        self.ldaps = match scheme.to_ascii_lowercase().as_str() {
            "ldap" => false,
            "ldaps" => true,
            other => return Err(format!("unsupported LDAP URL scheme: {other}")),
        };
        let (hostport, rest) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && !p.contains(']') => {
                (h, Some(p.parse::<u16>().map_err(|_| bad())?))
            }
            _ => (hostport, None),
        };
        if !host.is_empty() {
            self.servers = vec![decode(host).ok_or_else(bad)?];
        }
        self.port = port.filter(|p| *p != 0);
        let mut parts = rest.split('?');
        let dn = decode(parts.next().unwrap_or("")).ok_or_else(bad)?;
        if !dn.is_empty() {
            self.basedn = Some(dn);
        }
        if let Some(attrs) = parts.next().filter(|a| !a.is_empty()) {
            let first = attrs.split(',').next().unwrap_or(attrs);
            self.search_attribute = Some(decode(first).ok_or_else(bad)?);
        }
        self.scope = match parts.next().unwrap_or("") {
            "" | "base" => Scope::Base,
            "one" => Scope::One,
            "sub" => Scope::Sub,
            _ => return Err(bad()),
        };
        if let Some(filter) = parts.next().filter(|f| !f.is_empty()) {
            self.search_filter = Some(decode(filter).ok_or_else(bad)?);
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), String> {
        // Either a direct bind (prefix and suffix around the user name) or a search for
        // the user's entry, then a bind as it; never a mix.
        if self.prefix.is_some() || self.suffix.is_some() {
            if self.basedn.is_some()
                || self.binddn.is_some()
                || self.bindpasswd.is_some()
                || self.search_attribute.is_some()
                || self.search_filter.is_some()
            {
                return Err("cannot use ldapbasedn, ldapbinddn, ldapbindpasswd, \
                            ldapsearchattribute, ldapsearchfilter, or ldapurl together \
                            with ldapprefix"
                    .into());
            }
        } else if self.basedn.is_none() {
            return Err(
                "authentication method \"ldap\" requires argument \"ldapbasedn\", \
                        \"ldapprefix\", or \"ldapsuffix\" to be set"
                    .into(),
            );
        }
        if self.search_attribute.is_some() && self.search_filter.is_some() {
            return Err("cannot use ldapsearchattribute together with ldapsearchfilter".into());
        }
        // OpenLDAP finds servers through DNS SRV records of the base DN's domain when none
        // is named; Weir does not.
        if self.servers.is_empty() {
            return Err("LDAP server not specified (ldapserver or the host of ldapurl)".into());
        }
        Ok(())
    }
}

/// RFC 3986 percent-decoding; None for a bad escape or bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbouncers_suite_forms_parse() {
        let o = LdapOptions::parse_str(
            r#"ldapserver=127.0.0.1 ldapport=3890 ldapprefix="uid=" ldapsuffix=",dc=example,dc=net""#,
        )
        .expect("simple bind");
        assert_eq!(o.servers, vec!["127.0.0.1"]);
        assert_eq!(o.port, Some(3890));
        assert_eq!(o.prefix.as_deref(), Some("uid="));
        assert_eq!(o.suffix.as_deref(), Some(",dc=example,dc=net"));

        let o = LdapOptions::parse_str(
            r#"ldapurl="ldap://127.0.0.1:3890/dc=example,dc=net??sub?(|(uid=$username)(mail=$username))""#,
        )
        .expect("url with a filter");
        assert_eq!(o.basedn.as_deref(), Some("dc=example,dc=net"));
        assert_eq!(o.scope, Scope::Sub);
        assert_eq!(
            o.search_filter.as_deref(),
            Some("(|(uid=$username)(mail=$username))")
        );
        assert_eq!(o.search_attribute, None);

        // PgBouncer's "hba format" case: a quoted key, a comma before the next option.
        let o = LdapOptions::parse_str(
            r#"ldapserver=127.0.0.1 "ldapport"=3890 ldapbasedn="dc=example,dc=net" ,ldapsearchfilter="uid=$username""#,
        )
        .expect("hba format");
        assert_eq!(o.port, Some(3890));
        assert_eq!(o.search_filter.as_deref(), Some("uid=$username"));

        let o = LdapOptions::parse_str("ldapurl=ldaps://h/dc=x%2Cdc=y?uid").expect("ldaps");
        assert!(o.ldaps);
        assert_eq!(o.basedn.as_deref(), Some("dc=x,dc=y"));
        assert_eq!(o.scope, Scope::Base);
        assert_eq!(o.search_attribute.as_deref(), Some("uid"));
    }

    #[test]
    fn mistakes_are_refused_with_pgbouncers_words() {
        for (text, error) in [
            ("ldapserver=h ldapfoo=1", "invalid LDAP key parameter: \"ldapfoo\""),
            ("ldapserver=h ldapscheme=x ldapbasedn=d", "invalid ldapscheme value: \"x\""),
            ("ldapserver=h ldapport=0 ldapbasedn=d", "invalid LDAP port number: \"0\""),
            ("ldapurl=http://h/d", "unsupported LDAP URL scheme: http"),
            (
                "ldapserver=h",
                "authentication method \"ldap\" requires argument \"ldapbasedn\", \"ldapprefix\", or \"ldapsuffix\" to be set",
            ),
            (
                "ldapserver=h ldapbasedn=d ldapsearchattribute=a ldapsearchfilter=f",
                "cannot use ldapsearchattribute together with ldapsearchfilter",
            ),
        ] {
            assert_eq!(LdapOptions::parse_str(text).err().as_deref(), Some(error), "{text}");
        }
        let mixed = LdapOptions::parse_str("ldapserver=h ldapprefix=uid= ldapbasedn=d");
        assert!(mixed.is_err_and(|e| e.starts_with("cannot use ldapbasedn")));
    }
}
