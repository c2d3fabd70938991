//! Replays the fuzz targets' seed corpus and every input a fuzzer ever crashed on
//! (fuzz/corpus/<target>, fuzz/regressions/<target>) through the same entry points the
//! targets call, on stable and in a second: a parser that panics on one of them fails
//! here. See fuzz/README in the main README's "Fuzzing" section.

use std::path::Path;

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .map(|e| e.expect("read corpus dir").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let data = std::fs::read(&p).expect("read corpus file");
            (p.display().to_string(), data)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn corpus_and_regressions_replay_without_panics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for (name, target) in weir::fuzzing::TARGETS {
        let seeds = inputs(&root.join("corpus").join(name));
        assert!(!seeds.is_empty(), "no seed corpus for {name}");
        let regressions = inputs(&root.join("regressions").join(name));
        for (path, data) in seeds.iter().chain(&regressions) {
            let outcome = std::panic::catch_unwind(|| target(data));
            assert!(outcome.is_ok(), "{name} panicked on {path}");
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} inputs");
}

#[test]
fn every_target_is_built_by_the_fuzz_crate() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/Cargo.toml"))
            .expect("fuzz/Cargo.toml");
    for (name, _) in weir::fuzzing::TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
    }
}
