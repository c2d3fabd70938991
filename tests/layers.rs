//! The layers of src/ (issue 25): the top-level modules (a file or folder directly under
//! src/) use one another in one direction only, bottom to top, and no file is over
//! `MAX_LINES` lines. Read from the source text, so that it needs no build of the crate:
//! comments, string literals and `#[cfg(test)]` items are left out, then every
//! `crate::x...` path (including `use crate::{a, b::c}` groups) and every `super::` path
//! that climbs to the crate root is counted against `LAYERS`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Bottom to top. A module may use a module of a lower layer, or one of its own layer
/// listed before it; never one above. Every top-level module is listed exactly once.
const LAYERS: &[(&str, u8)] = &[
    // 0: base: clocks and runtimes, sockets, buffers, the wire protocol
    ("timers", 0),
    ("workers", 0),
    ("stream", 0),
    ("bufpool", 0),
    ("params", 0),
    ("tcp_options", 0),
    ("systemd", 0),
    ("logging", 0),
    ("fd_limit", 0),
    ("cli", 0),
    ("protocol", 0),
    // 1: SQL recognition, session settings, TLS settings, PAM and LDAP checks
    ("sql", 1),
    ("gucs", 1),
    ("login_notice", 1),
    ("tls", 1),
    ("external_auth", 1),
    // 2: who is connected, counters, connection log lines
    ("registry", 2),
    ("stats", 2),
    ("conn_log", 2),
    // 3: prepared statements
    ("prepared", 3),
    // 4: server connections
    ("server", 4),
    // 5: pools, routing between them, the shared state (configuration snapshot, pools)
    ("split", 5),
    ("pool", 5),
    ("app", 5),
    ("host_check", 5),
    // 6: the client session
    ("listen", 6),
    ("auth_query", 6),
    ("cancel", 6),
    ("client", 6),
    // 7: listeners
    ("listener", 7),
    // 8: the process: online restart
    ("takeover", 8),
    // 9: the admin console and HTTP
    ("admin", 9),
    ("idle_pools", 9),
    ("metrics_http", 9),
    // 10: fuzz entry points
    ("fuzzing", 10),
];

const MAX_LINES: usize = 800;

#[derive(Debug, Clone, PartialEq)]
struct Ref {
    to: String,
    line: usize,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The text with comments and the contents of string and char literals blanked out;
/// newlines are kept so that line numbers stay right.
fn blank_comments_and_literals(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let prev_ident = i > 0 && ident(b[i - 1]);
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (0, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !prev_ident && (b[i] == b'r' || b[i..].starts_with(b"br")) && {
            let k = i + if b[i] == b'b' { 2 } else { 1 };
            let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
            b.get(k + hashes) == Some(&b'"')
        } {
            // Raw string: r"...", r#"..."#, br"..."
            let k = i + if b[i] == b'b' { 2 } else { 1 };
            let hashes = b[k..].iter().take_while(|&&c| c == b'#').count();
            let start = k + hashes + 1;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let mut j = start;
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            blank(&mut out, start, j);
            i = j + close.len();
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}', '"'); a lifetime ('a) is left alone.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|n| i + 2 + n)
            } else {
                let len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match end {
                Some(e) => {
                    blank(&mut out, i + 1, e);
                    i = e + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Blanks every item under `#[cfg(test)]` (a `mod tests { }`, a `use`, a function...),
/// up to its `;` or its closing brace. Returns the names of test-only `mod x;` files.
fn blank_cfg_test(code: &mut String) -> Vec<String> {
    let mut test_mods = Vec::new();
    loop {
        let squeezed: Vec<(usize, char)> = code
            .char_indices()
            .filter(|(_, c)| !c.is_whitespace())
            .collect();
        let text: String = squeezed.iter().map(|&(_, c)| c).collect();
        let Some(at) = text.find("#[cfg(test)]") else {
            break;
        };
        let start = squeezed[at].0;
        let after = squeezed[at + "#[cfg(test)]".len() - 1].0 + 1;
        let bytes = code.as_bytes();
        let (mut depth, mut j) = (0i32, after);
        while j < bytes.len() {
            match bytes[j] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let item: Vec<&str> = code[after..j]
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';'))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(p) = item.iter().position(|w| *w == "mod") {
            if let Some(name) = item.get(p + 1).and_then(|n| n.strip_suffix(';')) {
                test_mods.push(name.to_owned());
            }
        }
        let blanked: String = code[start..j]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        code.replace_range(start..j, &blanked);
    }
    test_mods
}

/// Identifiers, `::` and single punctuation characters, with their line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = code.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !(d.is_alphanumeric() || d == '_') {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            out.push((code[i..end].to_owned(), line));
        } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
            chars.next();
            out.push(("::".to_owned(), line));
        } else if !c.is_whitespace() {
            out.push((c.to_string(), line));
        }
    }
    out
}

/// The module path of a file: src/client/relay.rs is ["client", "relay"],
/// src/client/mod.rs ["client"], src/lib.rs [].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

/// Every path that names an item at the crate root: `crate::x`, `crate::{x, y::z}`,
/// and `super::...::x` once the supers climb to the root. Gives `x` and its line.
fn root_refs(here: &[String], code: &str) -> Vec<Ref> {
    let toks = tokens(code);
    let is_ident = |t: &str| {
        t.chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    let at = |k: usize| toks.get(k).map_or("", |t| t.0.as_str());
    let mut out = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        let t = at(k);
        if (t == "crate" || t == "super") && at(k.wrapping_sub(1)) != "::" && at(k + 1) == "::" {
            let mut base: Option<usize> = Some(if t == "crate" {
                0
            } else {
                here.len().saturating_sub(1)
            });
            let mut j = k + 2;
            if t == "super" && here.is_empty() {
                base = None; // super:: at the root does not compile anyway
            }
            while at(j) == "super" && at(j + 1) == "::" {
                base = base.and_then(|d| d.checked_sub(1));
                j += 2;
            }
            if base == Some(0) {
                if at(j) == "{" {
                    // A group: the first segment of each of its items.
                    let (mut depth, mut expect) = (0, true);
                    while j < toks.len() {
                        match at(j) {
                            "{" => {
                                depth += 1;
                                expect = depth == 1;
                            }
                            "}" => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            "," if depth == 1 => expect = true,
                            s if depth == 1 && expect && is_ident(s) => {
                                out.push(Ref {
                                    to: s.to_owned(),
                                    line: toks[j].1,
                                });
                                expect = false;
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                } else if is_ident(at(j)) {
                    out.push(Ref {
                        to: at(j).to_owned(),
                        line: toks[k].1,
                    });
                }
            }
            k = j.max(k + 1);
            continue;
        }
        k += 1;
    }
    out
}

struct Source {
    rel: PathBuf,
    lines: usize,
    /// The top-level module the file belongs to; None for lib.rs and main.rs.
    top: Option<String>,
    refs: Vec<Ref>,
}

fn read_sources() -> Vec<Source> {
    let root = src_dir();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut test_only = Vec::new();
    let mut sources = Vec::new();
    for path in files {
        let rel = path.strip_prefix(&root).unwrap().to_path_buf();
        let text = fs::read_to_string(&path).unwrap();
        let mut code = blank_comments_and_literals(&text);
        for m in blank_cfg_test(&mut code) {
            // `#[cfg(test)] mod tests;` in a/mod.rs is a/tests.rs; in a/b.rs, a/b/tests.rs.
            let dir = if rel
                .file_name()
                .is_some_and(|f| f == "mod.rs" || f == "lib.rs")
            {
                rel.parent().unwrap().to_path_buf()
            } else {
                rel.with_extension("")
            };
            test_only.push(dir.join(format!("{m}.rs")));
        }
        let here = module_path(&rel);
        sources.push(Source {
            lines: text.lines().count(),
            top: here.first().cloned(),
            refs: root_refs(&here, &code),
            rel,
        });
    }
    for s in &mut sources {
        if test_only.contains(&s.rel) {
            s.refs.clear();
        }
    }
    sources
}

#[test]
fn top_level_modules_use_only_lower_layers() {
    let rank: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .map(|(i, (m, _))| (*m, i))
        .collect();
    assert_eq!(
        rank.len(),
        LAYERS.len(),
        "a module is listed twice in LAYERS"
    );
    assert!(
        LAYERS.windows(2).all(|w| w[0].1 <= w[1].1),
        "LAYERS must go bottom to top"
    );
    let sources = read_sources();
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for s in &sources {
        let Some(top) = s.top.as_deref() else {
            continue;
        };
        seen.insert(top.to_owned());
        let Some(&from) = rank.get(top) else {
            problems.push(format!(
                "src/{}: module `{top}` is not in LAYERS",
                s.rel.display()
            ));
            continue;
        };
        for r in &s.refs {
            if r.to == top || r.to == "self" {
                continue;
            }
            // Items of lib.rs itself (none today) are the root's: nothing may use them.
            let Some(&to) = rank.get(r.to.as_str()) else {
                problems.push(format!(
                    "src/{}:{}: `crate::{}` is not a module in LAYERS",
                    s.rel.display(),
                    r.line,
                    r.to
                ));
                continue;
            };
            if to >= from {
                problems.push(format!(
                    "src/{}:{}: {top} (layer {}) uses {} (layer {})",
                    s.rel.display(),
                    r.line,
                    LAYERS[from].1,
                    r.to,
                    LAYERS[to].1
                ));
            }
        }
    }
    for (m, _) in LAYERS {
        if !seen.contains(*m) {
            problems.push(format!("LAYERS names `{m}`, which is not in src/"));
        }
    }
    assert!(
        problems.is_empty(),
        "{} layering problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn no_source_file_is_over_the_limit() {
    let sources = read_sources();
    let problems: Vec<String> = sources
        .iter()
        .filter(|s| s.lines > MAX_LINES)
        .map(|s| format!("src/{}: {} lines", s.rel.display(), s.lines))
        .collect();
    assert!(
        problems.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        problems.join("\n")
    );
}

/// The reader itself, on a made-up file.
#[test]
fn reader_sees_groups_inline_paths_and_supers_but_not_tests_or_comments() {
    let text = r#"
use crate::{pool::Pool, server::{self, ServerConn}};
use super::stats; // crate::admin in a comment
fn f() { let s = "crate::app"; crate::timers::sleep(); let c = '{'; }
fn g<'a>(x: &'a str) -> &'a str { super::super::tls::x(); x }
#[cfg(test)]
mod tests { use crate::client::Session; }
#[cfg(test)]
fn helper() { crate::takeover::moving(); }
"#;
    let mut code = blank_comments_and_literals(text);
    assert!(blank_cfg_test(&mut code).is_empty());
    // As if in src/admin/show.rs: `super::` is admin, `super::super::` the root.
    let here = vec!["admin".to_owned(), "show".to_owned()];
    let got: Vec<(String, usize)> = root_refs(&here, &code)
        .into_iter()
        .map(|r| (r.to, r.line))
        .collect();
    let want = [("pool", 2), ("server", 2), ("timers", 4), ("tls", 5)];
    assert_eq!(got, want.map(|(m, l)| (m.to_owned(), l)));
    // As if in src/app.rs: `super::stats` is the crate's stats.
    let got: Vec<String> = root_refs(&["app".to_owned()], &code)
        .into_iter()
        .map(|r| r.to)
        .collect();
    assert_eq!(got, ["pool", "server", "stats", "timers"]);
}
