//! Fails the build, in plain words, when libclang is missing.
//!
//! The pg_query crate (read/write splitting parses SQL with PostgreSQL's own parser)
//! generates its bindings with bindgen, which loads libclang at build time; pg_query has
//! no option to skip that. Without libclang its build script panics after compiling
//! libpg_query's C, about `LIBCLANG_PATH`, without saying what to install. A build script
//! here cannot run before pg_query's (Cargo orders only dependencies with `links` before
//! it), but it runs while pg_query still compiles its C, so its error is usually the first
//! one printed, and it asks the very loader bindgen uses, so its verdict is bindgen's.

use std::process::ExitCode;

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    let Err(why) = clang_sys::load() else {
        return ExitCode::SUCCESS;
    };
    eprintln!(
        "\nWeir's build needs libclang: the pg_query crate generates its bindings to \
         libpg_query with bindgen, which loads it.\n\nInstall it with:\n\n    {}\n\n\
         (or, on Debian and Ubuntu, scripts/install-deps, which also installs what the \
         tests need). If libclang is installed in a directory the search misses, set \
         LIBCLANG_PATH to that directory.\n\nThe search said: {why}\n",
        install_command()
    );
    ExitCode::FAILURE
}

/// The one command that installs libclang and the headers bindgen needs, for this system.
fn install_command() -> &'static str {
    if cfg!(target_os = "macos") {
        return "xcode-select --install";
    }
    if cfg!(target_os = "freebsd") {
        return "pkg install llvm";
    }
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let ids: Vec<&str> = release
        .lines()
        .filter_map(|l| l.strip_prefix("ID=").or_else(|| l.strip_prefix("ID_LIKE=")))
        .flat_map(|v| v.trim_matches('"').split_whitespace())
        .collect();
    let is = |id: &str| ids.contains(&id);
    if is("alpine") {
        "apk add clang-dev"
    } else if is("arch") {
        "pacman -S clang"
    } else if is("suse") || is("opensuse") {
        "zypper install clang-devel"
    } else if is("fedora") || is("rhel") || is("centos") {
        "dnf install clang-devel"
    } else {
        "apt-get install libclang-dev"
    }
}
