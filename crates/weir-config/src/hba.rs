//! `auth_hba_file` (pg_hba.conf format, as PgBouncer reads it) and `auth_ident_file`
//! (pg_ident.conf format, for `map=`).
//!
//! Record types local, host, hostssl, hostnossl; databases `all`, `sameuser`, `replication`
//! (physical replication, which nothing else matches, as in PostgreSQL), `@file` and
//! names; users `all`, `@file` and names; both as comma-separated lists; addresses
//! IPv4/IPv6 with a prefix length or a separate mask, `all`; methods trust, reject, md5,
//! password, scram-sha-256, cert, peer, ldap (with its options, see `ldap`); the option
//! `map=`. A quoted name is a name even when it spells a keyword. `pam` is refused, as
//! PgBouncer refuses it in this file.

use std::net::IpAddr;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnType {
    Local,
    Host,
    HostSsl,
    HostNoSsl,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Trust,
    Reject,
    Md5,
    Password,
    ScramSha256,
    Cert,
    Peer,
    Ldap,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    All,
    SameUser,
    /// PostgreSQL's `replication`: physical replication connections, which no other
    /// database name (not even `all`) matches.
    Replication,
    Is(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Address {
    All,
    Net(IpAddr, u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub line: usize,
    conn: ConnType,
    databases: Vec<Name>,
    users: Vec<Name>,
    address: Option<Address>,
    pub method: Method,
    /// `map=` (a map of auth_ident_file).
    pub map: Option<String>,
    /// The options of an `ldap` line.
    pub ldap: Option<std::sync::Arc<crate::ldap::LdapOptions>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hba {
    rules: Vec<Rule>,
}

/// Who is connecting, for matching.
#[derive(Debug, Clone, Copy)]
pub struct Conn<'a> {
    /// None over the Unix socket.
    pub addr: Option<IpAddr>,
    pub tls: bool,
    pub database: &'a str,
    pub user: &'a str,
    /// `replication=true` (a physical walsender, bound to no database): only the
    /// `replication` keyword matches it. A logical one (`replication=database`) is
    /// matched by its database, as in PostgreSQL.
    pub physical_replication: bool,
}

impl Hba {
    pub fn load(path: &Path) -> Result<Hba, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Hba::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .map_err(|e| format!("{}:{e}", path.display()))
    }

    /// `dir` is where `@file` names are looked up.
    pub fn parse(text: &str, dir: &Path) -> Result<Hba, String> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let fields = fields(line);
            if fields.is_empty() {
                continue;
            }
            rules.push(rule(i + 1, &fields, dir).map_err(|e| format!("{}: {e}", i + 1))?);
        }
        Ok(Hba { rules })
    }

    /// The first rule that matches, as PostgreSQL picks it; None: no rule, the client is
    /// refused.
    pub fn find(&self, c: &Conn<'_>) -> Option<&Rule> {
        self.rules.iter().find(|r| r.matches(c))
    }
}

impl Rule {
    fn matches(&self, c: &Conn<'_>) -> bool {
        let conn = match self.conn {
            ConnType::Local => c.addr.is_none(),
            ConnType::Host => c.addr.is_some(),
            ConnType::HostSsl => c.addr.is_some() && c.tls,
            ConnType::HostNoSsl => c.addr.is_some() && !c.tls,
        };
        let name_in = |names: &[Name], name: &str| {
            names.iter().any(|n| match n {
                Name::All => true,
                Name::SameUser => c.database == c.user,
                Name::Replication => false,
                Name::Is(s) => s == name,
            })
        };
        let database = if c.physical_replication {
            self.databases.contains(&Name::Replication)
        } else {
            name_in(&self.databases, c.database)
        };
        let addr = match (&self.address, c.addr) {
            (None, _) | (Some(Address::All), _) => true,
            (Some(Address::Net(net, bits)), Some(ip)) => in_net(ip, *net, *bits),
            (Some(_), None) => false,
        };
        conn && addr && database && name_in(&self.users, c.user)
    }
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    // An IPv4 client on an IPv6 socket comes as ::ffff:a.b.c.d.
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits))
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits))
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// A name or word of a line, and whether any of it was quoted: a quoted name is never a
/// keyword.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    pub(crate) text: String,
    quoted: bool,
}

/// A field: one item, or the list that commas join.
pub(crate) type Field = Vec<Item>;

/// The fields of a line: blank-separated, `"..."` quoted (`""` inside for a quote), `#`
/// starting a comment outside quotes. A comma joins the items on either side into one
/// field's list whatever blanks surround it, as PgBouncer reads `a , b` (PostgreSQL ends
/// the list at a blank before a comma); commas with nothing between them are one.
pub(crate) fn fields(line: &str) -> Vec<Field> {
    let mut reader = LineReader::default();
    let mut in_quotes = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quotes && chars.peek() == Some(&'"') => {
                reader.item.push('"');
                chars.next();
            }
            '"' => {
                in_quotes = !in_quotes;
                reader.quoted = true;
            }
            _ if in_quotes => reader.item.push(c),
            '#' => break,
            ',' => reader.comma(),
            c if c.is_whitespace() => reader.end_item(),
            c => reader.item.push(c),
        }
    }
    reader.end_item();
    reader.fields
}

#[derive(Default)]
struct LineReader {
    fields: Vec<Field>,
    item: String,
    quoted: bool,
    /// A comma came after the last item: the next one joins its field.
    joined: bool,
}

impl LineReader {
    fn end_item(&mut self) {
        if self.item.is_empty() && !self.quoted {
            return;
        }
        let item = Item {
            text: std::mem::take(&mut self.item),
            quoted: std::mem::take(&mut self.quoted),
        };
        let joined = std::mem::take(&mut self.joined);
        match self.fields.last_mut() {
            Some(field) if joined => field.push(item),
            _ => self.fields.push(vec![item]),
        }
    }

    fn comma(&mut self) {
        self.end_item();
        self.joined = !self.fields.is_empty();
    }
}

/// A field that must be one word: the connection type, an address, a mask, the method,
/// an option.
fn single(field: &Field) -> Result<&Item, String> {
    match field.as_slice() {
        [item] => Ok(item),
        _ => {
            let list: Vec<&str> = field.iter().map(|i| i.text.as_str()).collect();
            Err(format!("unexpected list \"{}\"", list.join(",")))
        }
    }
}

fn word(field: &Field) -> Result<&str, String> {
    single(field).map(|item| item.text.as_str())
}

fn names(field: &Field, dir: &Path, database: bool) -> Result<Vec<Name>, String> {
    let mut out = Vec::new();
    for Item { text, quoted } in field {
        if *quoted {
            out.push(Name::Is(text.clone()));
            continue;
        }
        match text.as_str() {
            "all" => out.push(Name::All),
            "sameuser" if database => out.push(Name::SameUser),
            "replication" if database => out.push(Name::Replication),
            "samerole" | "samegroup" if database => {
                return Err(format!("database \"{text}\" is not supported"))
            }
            i if i.starts_with('+') => {
                return Err(format!("group names (\"{i}\") are not supported"))
            }
            i if i.starts_with('@') => out.extend(name_file(&dir.join(&i[1..]))?),
            i => out.push(Name::Is(i.to_owned())),
        }
    }
    if out.is_empty() {
        return Err("empty name list".into());
    }
    Ok(out)
}

/// The names an `@file` lists, any number to a line, all of them names (no keywords).
fn name_file(path: &Path) -> Result<Vec<Name>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(text
        .lines()
        .flat_map(fields)
        .flatten()
        .map(|item| Name::Is(item.text))
        .collect())
}

fn address(a: &str, mask: Option<&str>) -> Result<Address, String> {
    if a == "all" {
        return Ok(Address::All);
    }
    if a == "samehost" || a == "samenet" || a.starts_with('.') {
        return Err(format!("address \"{a}\" is not supported"));
    }
    let (ip, bits) = match a.split_once('/') {
        Some((ip, bits)) => {
            let ip: IpAddr = ip.parse().map_err(|_| format!("invalid address \"{a}\""))?;
            let bits: u8 = bits
                .parse()
                .map_err(|_| format!("invalid prefix length in \"{a}\""))?;
            (ip, bits)
        }
        None => {
            let ip: IpAddr = a
                .parse()
                .map_err(|_| format!("invalid address \"{a}\" (host names are not supported)"))?;
            let Some(mask) = mask else {
                return Err(format!("address \"{a}\" needs a prefix length or a mask"));
            };
            let m: IpAddr = mask
                .parse()
                .map_err(|_| format!("invalid mask \"{mask}\""))?;
            let bits = match m {
                IpAddr::V4(m) => mask_bits(u128::from(u32::from(m)) << 96)?,
                IpAddr::V6(m) => mask_bits(u128::from(m))?,
            };
            (ip, bits)
        }
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return Err(format!("prefix length {bits} too long for \"{a}\""));
    }
    Ok(Address::Net(ip, bits))
}

fn mask_bits(m: u128) -> Result<u8, String> {
    let bits = m.leading_ones();
    if m.checked_shl(bits).unwrap_or(0) != 0 {
        return Err("mask is not contiguous".into());
    }
    Ok(bits as u8)
}

fn method(m: &str) -> Result<Method, String> {
    Ok(match m {
        "trust" => Method::Trust,
        "reject" => Method::Reject,
        "md5" => Method::Md5,
        "password" => Method::Password,
        "scram-sha-256" => Method::ScramSha256,
        "cert" => Method::Cert,
        "peer" => Method::Peer,
        "ldap" => Method::Ldap,
        "pam" => {
            return Err("authentication method \"pam\" is not supported in the HBA file".into())
        }
        other => {
            return Err(format!(
                "authentication method \"{other}\" is not supported"
            ))
        }
    })
}

fn rule(line: usize, f: &[Field], dir: &Path) -> Result<Rule, String> {
    let need = |n: usize| {
        f.get(n)
            .ok_or_else(|| "end-of-line before authentication method".to_string())
    };
    let conn = match word(need(0)?)? {
        "local" => ConnType::Local,
        "host" => ConnType::Host,
        "hostssl" => ConnType::HostSsl,
        "hostnossl" => ConnType::HostNoSsl,
        other => return Err(format!("invalid connection type \"{other}\"")),
    };
    let databases = names(need(1)?, dir, true)?;
    let users = names(need(2)?, dir, false)?;
    let mut at = 3;
    let address = if conn == ConnType::Local {
        None
    } else {
        let a = word(need(3)?)?;
        // A separate mask follows an address without a prefix length.
        let mask = match f.get(4) {
            Some(m) if !a.contains('/') && a != "all" => Some(word(m)?),
            _ => None,
        };
        at = if mask.is_some() { 5 } else { 4 };
        Some(address(a, mask)?)
    };
    let method = method(word(need(at)?)?)?;
    if method == Method::Peer && conn != ConnType::Local {
        return Err("peer authentication is only supported on local sockets".into());
    }
    let mut map = None;
    let mut ldap = None;
    if method == Method::Ldap {
        // PostgreSQL's LDAP options; a comma may join them, as PgBouncer reads the line.
        let words: Vec<String> = f[at + 1..]
            .iter()
            .flatten()
            .map(|i| i.text.clone())
            .collect();
        ldap = Some(std::sync::Arc::new(crate::ldap::LdapOptions::parse(
            &words,
        )?));
    } else {
        for opt in &f[at + 1..] {
            let opt = word(opt)?;
            match opt.split_once('=') {
                Some(("map", m)) => map = Some(m.to_owned()),
                // What PostgreSQL checks itself (clientcert) the TLS settings decide here.
                Some(("clientcert", _)) => {}
                _ => return Err(format!("invalid authentication option \"{opt}\"")),
            }
        }
    }
    Ok(Rule {
        line,
        conn,
        databases,
        users,
        address,
        method,
        map,
        ldap,
    })
}

/// `auth_ident_file`: map name -> (system or certificate name, database user).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ident {
    entries: Vec<(String, String, String)>,
}

impl Ident {
    pub fn load(path: &Path) -> Result<Ident, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ident::parse(&text).map_err(|e| format!("{}:{e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Ident, String> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let f = fields(line);
            match f.as_slice() {
                [] => {}
                [m, sys, user] => {
                    let line_error = |e| format!("{}: {e}", i + 1);
                    let sys = single(sys).map_err(line_error)?;
                    if sys.text.starts_with('/') && !sys.quoted {
                        return Err(line_error("regular expressions are not supported".into()));
                    }
                    let (m, user) = (
                        word(m).map_err(line_error)?,
                        word(user).map_err(line_error)?,
                    );
                    entries.push((m.to_owned(), sys.text.clone(), user.to_owned()));
                }
                _ => {
                    return Err(format!(
                        "{}: expected MAPNAME SYSTEM-USERNAME PG-USERNAME",
                        i + 1
                    ))
                }
            }
        }
        Ok(Ident { entries })
    }

    /// Whether `map` lets `system` (an OS user, a certificate's name) log in as `user`.
    pub fn allows(&self, map: &str, system: &str, user: &str) -> bool {
        self.entries
            .iter()
            .any(|(m, s, u)| m == map && s == system && (u == user || u == "all"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hba(text: &str) -> Hba {
        Hba::parse(text, Path::new(".")).expect("parse")
    }

    fn conn<'a>(addr: Option<&str>, tls: bool, db: &'a str, user: &'a str) -> Conn<'a> {
        Conn {
            addr: addr.map(|a| a.parse().expect("ip")),
            tls,
            database: db,
            user,
            physical_replication: false,
        }
    }

    #[test]
    fn first_matching_rule_wins() {
        let h = hba("# comment\n\
             local all all peer map=os\n\
             hostssl app alice,bob 10.0.0.0/8 cert\n\
             host all all 127.0.0.1 255.255.255.255 trust # inline\n\
             hostnossl all all ::1/128 reject\n\
             host sameuser all 0.0.0.0/0 scram-sha-256\n\
             host \"all\" all ::/0 md5\n");
        let m = |c: Conn<'_>| h.find(&c).map(|r| (r.line, r.method));
        assert_eq!(m(conn(None, false, "x", "y")), Some((2, Method::Peer)));
        assert_eq!(
            h.find(&conn(None, false, "x", "y"))
                .and_then(|r| r.map.clone()),
            Some("os".into())
        );
        assert_eq!(
            m(conn(Some("10.1.2.3"), true, "app", "bob")),
            Some((3, Method::Cert))
        );
        assert_eq!(m(conn(Some("10.1.2.3"), false, "app", "bob")), None);
        assert_eq!(
            m(conn(Some("127.0.0.1"), false, "x", "y")),
            Some((4, Method::Trust))
        );
        assert_eq!(
            m(conn(Some("::ffff:127.0.0.1"), false, "x", "y")),
            Some((4, Method::Trust))
        );
        assert_eq!(
            m(conn(Some("::1"), false, "x", "y")),
            Some((5, Method::Reject))
        );
        assert_eq!(
            m(conn(Some("192.168.1.1"), true, "u", "u")),
            Some((6, Method::ScramSha256))
        );
        // A quoted "all" is a database named all.
        assert_eq!(
            m(conn(Some("fe80::1"), false, "all", "y")),
            Some((7, Method::Md5))
        );
        assert_eq!(m(conn(Some("fe80::1"), false, "other", "y")), None);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, want) in [
            (
                "host all all 10.0.0.0/8\n",
                "1: end-of-line before authentication method",
            ),
            (
                "hots all all 10.0.0.0/8 trust\n",
                "1: invalid connection type \"hots\"",
            ),
            (
                "\nhost all all example.com trust\n",
                "2: invalid address \"example.com\" (host names are not supported)",
            ),
            (
                "host all all 10.0.0.0/40 trust\n",
                "1: prefix length 40 too long for \"10.0.0.0/40\"",
            ),
            (
                "host all all 10.0.0.0/8 pam\n",
                "1: authentication method \"pam\" is not supported in the HBA file",
            ),
            (
                "host all all 10.0.0.0/8 ldap ldapserver=h\n",
                "1: authentication method \"ldap\" requires argument \"ldapbasedn\", \"ldapprefix\", or \"ldapsuffix\" to be set",
            ),
            (
                "host all +admins 10.0.0.0/8 md5\n",
                "1: group names (\"+admins\") are not supported",
            ),
            (
                "host all all 10.0.0.0 255.0.255.0 md5\n",
                "1: mask is not contiguous",
            ),
        ] {
            assert_eq!(
                Hba::parse(text, Path::new(".")).err().as_deref(),
                Some(want),
                "{text}"
            );
        }
    }

    /// PgBouncer's reading of lists: blanks on either side of a comma do not end the
    /// field, quoted items can be listed, and a list is refused where one word belongs.
    #[test]
    fn lists_with_blanks_around_commas() {
        let h = hba("host all user1,user2 , user3 127.0.0.1/32 md5\n\
             host app, \"Quoted, Name\" ,\"all\" all 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 reject\n");
        let m = |db, user| {
            h.find(&conn(Some("127.0.0.1"), false, db, user))
                .map(|r| r.line)
        };
        for user in ["user1", "user2", "user3"] {
            assert_eq!(m("x", user), Some(1), "{user}");
        }
        assert_eq!(m("x", "user4"), Some(3));
        for db in ["app", "Quoted, Name", "all"] {
            assert_eq!(m(db, "someone"), Some(2), "{db}");
        }
        assert_eq!(m("Quoted", "someone"), Some(3));
        for (text, want) in [
            (
                "host all all 10.0.0.0/8 , 10.1.0.0/16 md5\n",
                "1: unexpected list \"10.0.0.0/8,10.1.0.0/16\"",
            ),
            // A comma before the address takes it into the list, as in PgBouncer.
            (
                "host all a,,b, 127.0.0.1/32 md5\n",
                "1: invalid address \"md5\" (host names are not supported)",
            ),
        ] {
            assert_eq!(
                Hba::parse(text, Path::new(".")).err().as_deref(),
                Some(want),
                "{text}"
            );
        }
    }

    #[test]
    fn ident_maps() {
        let i =
            Ident::parse("# map sys pg\nos root postgres\ncerts \"CN One\" app\n").expect("parse");
        assert!(i.allows("os", "root", "postgres"));
        assert!(!i.allows("os", "root", "app"));
        assert!(i.allows("certs", "CN One", "app"));
        assert!(Ident::parse("m /^(.*)$ \\1\n").is_err());
    }

    #[test]
    fn physical_replication_is_matched_only_by_its_keyword() {
        let h = hba("host replication repl 127.0.0.1/32 md5\n\
             host all all 127.0.0.1/32 trust\n");
        let physical = |user| Conn {
            physical_replication: true,
            ..conn(Some("127.0.0.1"), false, "replication", user)
        };
        assert_eq!(
            h.find(&physical("repl")).map(|r| r.method),
            Some(Method::Md5)
        );
        // `all` does not take a physical walsender, as in PostgreSQL.
        assert!(h.find(&physical("app")).is_none());
        // A logical one (and anyone else) is matched by its database.
        let m = h.find(&conn(Some("127.0.0.1"), false, "replication", "repl"));
        assert_eq!(m.map(|r| r.method), Some(Method::Trust));
    }
}
