//! Turns the items of pgbouncer.ini into a [`Config`], section by section,
//! in file order, the way libusual's `cf_load_file` drives PgBouncer.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::database::Database;
use crate::error::ConfigError;
use crate::general::{canonical_name, General, KEPT_ON_SECTION_RESTART};
use crate::implemented::{
    option_is_implemented, IMPLEMENTED_DATABASE_PARAMS, IMPLEMENTED_USER_PARAMS,
};
use crate::ini::{self, Item, Location};
use crate::peer::Peer;
use crate::user::User;
use crate::Config;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Section {
    General,
    Databases,
    Users,
    Peers,
}

pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
    from_items(ini::read(path)?, path)
}

/// As `load`, from the text of a file that includes none (see `ini::read_str`).
pub(crate) fn load_str(text: &str, path: &Path) -> Result<Config, ConfigError> {
    from_items(ini::read_str(text, path)?, path)
}

fn from_items(items: Vec<(Location, Item)>, path: &Path) -> Result<Config, ConfigError> {
    let mut loader = Loader::default();
    for (position, (location, item)) in items.into_iter().enumerate() {
        loader.item(position, &location, item)?;
    }
    if !loader.seen_general {
        return Err(ConfigError::new(
            path,
            None,
            "main section [pgbouncer] missing from config file",
        ));
    }
    Ok(loader.finish())
}

#[derive(Default)]
struct Loader {
    general: General,
    databases: Vec<(String, Database)>,
    /// Where each name is in `databases`: a scan per entry made 40,000 entries take 5 s.
    database_at: HashMap<String, usize>,
    fallback_database: Option<Database>,
    users: HashMap<String, User>,
    peers: Vec<(u32, Peer)>,
    section: Option<Section>,
    seen_general: bool,
    /// Where each `[pgbouncer]` option was last set; notices are decided at
    /// the end, against the final value.
    general_set: HashMap<&'static str, (usize, Location)>,
    /// Notices with their position in the file order.
    notices: Vec<(usize, String)>,
    /// Entry parameters already reported, so each is reported once.
    reported: HashSet<(Section, &'static str)>,
}

impl Loader {
    fn item(&mut self, position: usize, at: &Location, item: Item) -> Result<(), ConfigError> {
        match item {
            Item::Section(name) => self.section(position, at, &name),
            Item::Entry { key, value } => match self.section {
                None => Err(at.error("value without section").with_option(&key)),
                Some(Section::General) => self.general_option(position, at, &key, &value),
                Some(Section::Databases) => self.database(position, at, &key, &value),
                Some(Section::Users) => self.user(position, at, &key, &value),
                Some(Section::Peers) => self.peer(at, &key, &value),
            },
        }
    }

    fn section(&mut self, position: usize, at: &Location, name: &str) -> Result<(), ConfigError> {
        let section = match name {
            "pgbouncer" => Section::General,
            "databases" => Section::Databases,
            "users" => Section::Users,
            "peers" => Section::Peers,
            _ => return Err(at.error(format!("invalid section \"{name}\""))),
        };
        if section == Section::General {
            if self.seen_general {
                self.restart_general(position, at);
            }
            self.seen_general = true;
        }
        self.section = Some(section);
        Ok(())
    }

    /// PgBouncer fills in defaults every time a `[pgbouncer]` header is read
    /// (options whose default is NULL excepted), so a second header, e.g. in
    /// an included file, undoes what the first one set.
    fn restart_general(&mut self, position: usize, at: &Location) {
        let previous = std::mem::take(&mut self.general);
        for name in KEPT_ON_SECTION_RESTART {
            self.general.copy_option(&previous, name);
        }
        let before = self.general_set.len();
        self.general_set
            .retain(|name, _| KEPT_ON_SECTION_RESTART.contains(name));
        if self.general_set.len() != before {
            self.notices.push((
                position,
                format!(
                    "{}: section [pgbouncer] appears again; as in PgBouncer, options set before this line are reset to their defaults",
                    at.prefix()
                ),
            ));
        }
    }

    fn general_option(
        &mut self,
        position: usize,
        at: &Location,
        key: &str,
        value: &str,
    ) -> Result<(), ConfigError> {
        let unknown = || at.error("unknown option").with_option(key);
        let name = canonical_name(key).ok_or_else(unknown)?;
        match self.general.set_option(name, value) {
            Some(Ok(())) => {
                self.general_set.insert(name, (position, at.clone()));
                Ok(())
            }
            Some(Err(message)) => Err(at.error(message).with_option(key)),
            None => Err(unknown()),
        }
    }

    fn database(
        &mut self,
        position: usize,
        at: &Location,
        name: &str,
        connstr: &str,
    ) -> Result<(), ConfigError> {
        if name == "pgbouncer" {
            return Err(at
                .error("database name \"pgbouncer\" is reserved for the admin console")
                .with_option(name));
        }
        let (db, given) = Database::parse(connstr).map_err(|m| at.error(m).with_option(name))?;
        self.report_params(
            position,
            at,
            Section::Databases,
            &given,
            IMPLEMENTED_DATABASE_PARAMS,
        );
        if name == "*" {
            self.fallback_database = Some(db);
        } else if let Some(&i) = self.database_at.get(name) {
            self.databases[i].1 = db;
        } else {
            self.database_at
                .insert(name.to_owned(), self.databases.len());
            self.databases.push((name.to_owned(), db));
        }
        Ok(())
    }

    fn user(
        &mut self,
        position: usize,
        at: &Location,
        name: &str,
        settings: &str,
    ) -> Result<(), ConfigError> {
        let (user, given) = User::parse(settings).map_err(|m| at.error(m).with_option(name))?;
        self.report_params(
            position,
            at,
            Section::Users,
            &given,
            IMPLEMENTED_USER_PARAMS,
        );
        self.users.insert(name.to_owned(), user);
        Ok(())
    }

    fn peer(&mut self, at: &Location, key: &str, connstr: &str) -> Result<(), ConfigError> {
        let fail = |m: String| at.error(m).with_option(key);
        let id = Peer::parse_id(key).map_err(fail)?;
        let peer = Peer::parse(connstr).map_err(fail)?;
        if let Some(entry) = self.peers.iter_mut().find(|(i, _)| *i == id) {
            entry.1 = peer;
        } else {
            self.peers.push((id, peer));
        }
        Ok(())
    }

    fn report_params(
        &mut self,
        position: usize,
        at: &Location,
        section: Section,
        given: &[&'static str],
        implemented: &[&str],
    ) {
        let section_name = match section {
            Section::Users => "users",
            _ => "databases",
        };
        for param in given {
            if !implemented.contains(param) && self.reported.insert((section, param)) {
                self.notices.push((
                    position,
                    format!(
                        "{}: [{section_name}] parameter {param} is not implemented yet and is ignored",
                        at.prefix()
                    ),
                ));
            }
        }
    }

    fn finish(mut self) -> Config {
        for (name, (position, at)) in &self.general_set {
            if !self.general.is_default(name) && !option_is_implemented(name, &self.general) {
                self.notices.push((
                    *position,
                    format!(
                        "{}: option {name} is not implemented yet and is ignored",
                        at.prefix()
                    ),
                ));
            }
        }
        self.notices.sort_by_key(|(position, _)| *position);
        Config {
            general: self.general,
            databases: self.databases,
            fallback_database: self.fallback_database,
            users: self.users,
            peers: self.peers,
            notices: self.notices.into_iter().map(|(_, n)| n).collect(),
        }
    }
}
