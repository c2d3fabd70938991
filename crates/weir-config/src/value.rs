//! Parsers for the scalar value types used in pgbouncer.ini.
//!
//! They follow libusual's `cf_set_*` functions, which PgBouncer uses:
//! integers go through `strtol(value, &end, 0)`, so `0x1F` is hex and a
//! leading `0` means octal (that is how `unix_socket_mode = 0777` works, and
//! it also means `max_client_conn = 0100` is 64 in PgBouncer as here).

use std::path::PathBuf;
use std::time::Duration;

/// A type that a `[pgbouncer]` option can hold.
pub(crate) trait OptionValue: Sized {
    fn parse_value(raw: &str) -> Result<Self, String>;
}

/// Parses an integer the way C's `strtol(s, &end, 0)` does when the whole
/// string must be consumed.
pub(crate) fn parse_int(raw: &str) -> Result<i64, String> {
    let invalid = || format!("invalid integer value \"{raw}\"");
    let s = raw.trim_start();
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (radix, digits) = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (16, hex)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(invalid());
    }
    let magnitude = i128::from_str_radix(digits, radix).map_err(|_| invalid())?;
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value).map_err(|_| format!("integer value \"{raw}\" is out of range"))
}

fn parse_unsigned<T: TryFrom<i64>>(raw: &str) -> Result<T, String> {
    let value = parse_int(raw)?;
    if value < 0 {
        return Err(format!("value \"{raw}\" must not be negative"));
    }
    T::try_from(value).map_err(|_| format!("integer value \"{raw}\" is out of range"))
}

/// PgBouncer stores its boolean options as C ints (any non-zero integer is
/// true); the words are accepted on top of that for convenience.
pub(crate) fn parse_bool(raw: &str) -> Result<bool, String> {
    match raw.to_ascii_lowercase().as_str() {
        "yes" | "on" | "true" => Ok(true),
        "no" | "off" | "false" => Ok(false),
        _ => parse_int(raw)
            .map(|v| v != 0)
            .map_err(|_| format!("invalid boolean value \"{raw}\"")),
    }
}

/// Parses a time. PgBouncer writes seconds, fractions allowed (`0.5`), and
/// truncates to microseconds. A unit suffix (`us`, `ms`, `s`, `min`, `h`,
/// `d`) may follow the number.
pub(crate) fn parse_duration(raw: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid time value \"{raw}\"");
    let s = raw.trim();
    let split = s
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number = number.trim_end();
    let micros_per_unit: f64 = match unit {
        "" | "s" => 1e6,
        "us" => 1.0,
        "ms" => 1e3,
        "min" => 60e6,
        "h" => 3600e6,
        "d" => 86400e6,
        _ => return Err(invalid()),
    };
    // Rust's float parser would also take "inf"/"nan"; only plain decimals are valid here.
    if number.is_empty()
        || !number
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
    {
        return Err(invalid());
    }
    let value: f64 = number.parse().map_err(|_| invalid())?;
    if value < 0.0 {
        return Err(format!("time value \"{raw}\" must not be negative"));
    }
    let micros = value * micros_per_unit;
    if !micros.is_finite() || micros >= u64::MAX as f64 {
        return Err(format!("time value \"{raw}\" is out of range"));
    }
    Ok(Duration::from_micros(micros as u64))
}

/// Splits a comma-separated list, trimming blanks and dropping empty items.
pub(crate) fn parse_list(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

impl OptionValue for u16 {
    fn parse_value(raw: &str) -> Result<Self, String> {
        parse_unsigned(raw)
    }
}

impl OptionValue for u32 {
    fn parse_value(raw: &str) -> Result<Self, String> {
        parse_unsigned(raw)
    }
}

impl OptionValue for bool {
    fn parse_value(raw: &str) -> Result<Self, String> {
        parse_bool(raw)
    }
}

impl OptionValue for Duration {
    fn parse_value(raw: &str) -> Result<Self, String> {
        parse_duration(raw)
    }
}

impl OptionValue for String {
    fn parse_value(raw: &str) -> Result<Self, String> {
        Ok(raw.to_owned())
    }
}

/// An empty value means "not set", as it does for PgBouncer's string options.
impl OptionValue for Option<String> {
    fn parse_value(raw: &str) -> Result<Self, String> {
        Ok((!raw.is_empty()).then(|| raw.to_owned()))
    }
}

impl OptionValue for Option<PathBuf> {
    fn parse_value(raw: &str) -> Result<Self, String> {
        Ok((!raw.is_empty()).then(|| PathBuf::from(raw)))
    }
}

impl OptionValue for Vec<String> {
    fn parse_value(raw: &str) -> Result<Self, String> {
        Ok(parse_list(raw))
    }
}

/// How an option's value reads in PgBouncer's `SHOW CONFIG` (libusual's
/// `cf_get_*`): integers and booleans in decimal (`0`/`1`), times as seconds
/// with `%g`, lists joined with commas. `None` is SQL NULL (an unset string).
pub(crate) trait ShowValue {
    fn show_value(&self) -> Option<String>;
}

/// C's `printf("%g", v)`: six significant digits, trailing zeros removed.
pub(crate) fn format_g(v: f64) -> String {
    if v == 0.0 {
        return "0".to_owned();
    }
    let exp = v.abs().log10().floor() as i32;
    if !(-5..6).contains(&exp) {
        let s = format!("{:.5e}", v);
        let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = trim_fraction(mantissa);
        let e: i32 = e.parse().unwrap_or(0);
        let sign = if e < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", e.abs());
    }
    let decimals = (5 - exp).max(0) as usize;
    trim_fraction(&format!("{:.*}", decimals, v)).to_owned()
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

impl ShowValue for u16 {
    fn show_value(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl ShowValue for u32 {
    fn show_value(&self) -> Option<String> {
        Some(self.to_string())
    }
}

impl ShowValue for bool {
    fn show_value(&self) -> Option<String> {
        Some(if *self { "1" } else { "0" }.to_owned())
    }
}

impl ShowValue for Duration {
    fn show_value(&self) -> Option<String> {
        Some(format_g(self.as_micros() as f64 / 1e6))
    }
}

impl ShowValue for String {
    fn show_value(&self) -> Option<String> {
        Some(self.clone())
    }
}

impl ShowValue for Option<String> {
    fn show_value(&self) -> Option<String> {
        self.clone()
    }
}

impl ShowValue for Option<PathBuf> {
    fn show_value(&self) -> Option<String> {
        self.as_ref().map(|p| p.display().to_string())
    }
}

impl ShowValue for Vec<String> {
    fn show_value(&self) -> Option<String> {
        Some(self.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_follow_strtol_base_zero() {
        assert_eq!(parse_int("42"), Ok(42));
        assert_eq!(parse_int("-7"), Ok(-7));
        assert_eq!(parse_int("+7"), Ok(7));
        assert_eq!(parse_int("0x1F"), Ok(31));
        assert_eq!(parse_int("0777"), Ok(0o777));
        assert_eq!(parse_int("0"), Ok(0));
        assert!(parse_int("08").is_err());
        assert!(parse_int("abc").is_err());
        assert!(parse_int("12abc").is_err());
        assert!(parse_int("").is_err());
        assert!(parse_int("0x").is_err());
        assert!(parse_int("99999999999999999999999").is_err());
    }

    #[test]
    fn unsigned_rejects_negative_and_overflow() {
        assert_eq!(u32::parse_value("100"), Ok(100));
        assert!(u32::parse_value("-1").is_err());
        assert!(u16::parse_value("70000").is_err());
        assert_eq!(u16::parse_value("6432"), Ok(6432));
    }

    #[test]
    fn bools_accept_words_and_ints() {
        for t in ["1", "yes", "on", "true", "TRUE", "On", "2"] {
            assert_eq!(parse_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "no", "off", "false", "NO"] {
            assert_eq!(parse_bool(f), Ok(false), "{f}");
        }
        assert!(parse_bool("maybe").is_err());
        assert!(parse_bool("").is_err());
    }

    #[test]
    fn durations_are_seconds_with_optional_units() {
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3600.0"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1e2"), Ok(Duration::from_secs(100)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("250 ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3min"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("0.0000015"), Ok(Duration::from_micros(1)));
        for bad in ["", "abc", "-1", "5m", "inf", "nan", "1x", "s", "1e400"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn show_values_read_like_pgbouncer() {
        assert_eq!(format_g(3600.0), "3600");
        assert_eq!(format_g(0.5), "0.5");
        assert_eq!(format_g(120.0), "120");
        assert_eq!(format_g(1e6), "1e+06");
        assert_eq!(format_g(0.000001), "1e-06");
        assert_eq!(
            Duration::from_millis(1500).show_value().as_deref(),
            Some("1.5")
        );
        assert_eq!(true.show_value().as_deref(), Some("1"));
        assert_eq!(Option::<String>::None.show_value(), None);
    }

    #[test]
    fn lists_split_on_commas() {
        assert_eq!(parse_list("a, b ,c"), vec!["a", "b", "c"]);
        assert_eq!(parse_list(""), Vec::<String>::new());
        assert_eq!(parse_list("*"), vec!["*"]);
        assert_eq!(parse_list("a,,b,"), vec!["a", "b"]);
    }

    #[test]
    fn optional_strings_treat_empty_as_unset() {
        assert_eq!(Option::<String>::parse_value(""), Ok(None));
        assert_eq!(Option::<String>::parse_value("x"), Ok(Some("x".to_owned())));
        assert_eq!(
            Option::<PathBuf>::parse_value("users.txt"),
            Ok(Some(PathBuf::from("users.txt")))
        );
        assert_eq!(Option::<PathBuf>::parse_value(""), Ok(None));
    }
}
