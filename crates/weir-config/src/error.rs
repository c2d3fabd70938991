use std::fmt;
use std::path::{Path, PathBuf};

/// An error in a configuration or auth file, located as precisely as known.
///
/// Displays as `<file>:<line>: <option>: <message>`, leaving out the parts
/// that are not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// The option (or `[databases]`/`[users]`/`[peers]` entry name) at fault.
    pub option: Option<String>,
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(file: &Path, line: Option<usize>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            line,
            option: None,
            message: message.into(),
        }
    }

    pub(crate) fn with_option(mut self, option: &str) -> Self {
        self.option = Some(option.to_owned());
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(option) = &self.option {
            write!(f, ": {option}")?;
        }
        write!(f, ": {}", self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_has_all_known_parts() {
        let e = ConfigError::new(
            Path::new("/etc/weir.ini"),
            Some(7),
            "invalid integer value \"abc\"",
        )
        .with_option("max_client_conn");
        assert_eq!(
            e.to_string(),
            "/etc/weir.ini:7: max_client_conn: invalid integer value \"abc\""
        );
        let e = ConfigError::new(Path::new("a.ini"), None, "boom");
        assert_eq!(e.to_string(), "a.ini: boom");
    }
}
