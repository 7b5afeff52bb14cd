//! The docs match the code: every source path they cite exists, and every module file of
//! the core crate appears in design.md §9, the map a newcomer reads first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (one brace group at a time, nested ones too).
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.to_owned()];
    };
    let close = open + path[open..].find('}').expect("a brace group closes");
    let (head, tail) = (&path[..open], &path[close + 1..]);
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{head}{alt}{tail}")))
        .collect()
}

/// Every `backticked` token of `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Every `.rs` file under `dir`, relative to it, with `/` separators.
fn rust_files(dir: &Path, base: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, base, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(base).unwrap();
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The docs a reader is pointed to: the README and every file of `docs/`.
fn docs() -> Vec<(String, String)> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
        .into_iter()
        .map(|p| {
            let name = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

#[test]
fn every_source_path_the_docs_cite_exists() {
    let root = root();
    // Where a cited path may be relative to: the repository, a crate's sources, the tests.
    let bases = [
        "",
        "shared/src",
        "shared/src/http",
        "cli/src",
        "client/src",
        "functions/src",
        "tests",
        "tests/tests",
    ];
    let mut missing = Vec::new();
    for (doc, text) in docs() {
        for token in backticked(&text) {
            // A path: no spaces, ends in `.rs` (with `::item` or `:line` after it left off).
            let path = token.split("::").next().unwrap_or(token);
            let path = path.split(':').next().unwrap_or(path);
            if path.contains(' ') || !path.ends_with(".rs") || path.contains('*') {
                continue;
            }
            for p in expand(path) {
                if !bases.iter().any(|b| root.join(b).join(&p).is_file()) {
                    missing.push(format!("{doc}: `{p}`"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs cite files that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_module_file_is_in_the_map_of_the_code() {
    let root = root();
    let design = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
    let map = design
        .split("## §9 Map of the code")
        .nth(1)
        .expect("design.md has §9");
    let mut listed: Vec<String> = Vec::new();
    for line in map.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or("");
        for token in backticked(first) {
            listed.extend(expand(token));
        }
    }
    let src = root.join("shared/src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    files.sort();
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| {
            !listed
                .iter()
                .any(|l| *l == **f || (l.ends_with('/') && f.starts_with(l.as_str())))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "module files design.md §9 does not list ({} listed):\n{}",
        listed.len(),
        missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn braces_expand_as_the_docs_write_them() {
    assert_eq!(expand("a/{b,c}.rs"), ["a/b.rs", "a/c.rs"]);
    assert_eq!(
        expand("{x,y}/{b,c}.rs"),
        ["x/b.rs", "x/c.rs", "y/b.rs", "y/c.rs"]
    );
    assert_eq!(expand("plain.rs"), ["plain.rs"]);
    assert_eq!(backticked("a `b` c `d`"), ["b", "d"]);
}

/// The rows of the markdown table that follows `heading` in design.md §9.
fn table_after(heading: &str) -> String {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let map = design
        .split("## §9 Map of the code")
        .nth(1)
        .expect("design.md has §9");
    let from = map
        .find(heading)
        .unwrap_or_else(|| panic!("design.md §9 has {heading:?}"));
    map[from..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_route_storage_key_and_manifest_field_has_its_file_in_the_map() {
    let root = root();
    // Routes: `ROUTES` in http/mod.rs, each as `METHOD /path` in the routes table.
    let http = std::fs::read_to_string(root.join("shared/src/http/mod.rs")).unwrap();
    let routes_src = http
        .split("pub const ROUTES")
        .nth(1)
        .and_then(|r| r.split("];").next())
        .expect("http/mod.rs has ROUTES");
    let routes: Vec<String> = routes_src
        .lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("(\"")?;
            let (method, rest) = l.split_once("\", \"")?;
            Some(format!("{method} {}", rest.split('"').next()?))
        })
        .collect();
    assert!(routes.len() > 20, "ROUTES parsed: {routes:?}");
    let table = table_after("**Where each route is handled.**");
    let named = backticked(&table);
    let missing: Vec<&String> = routes
        .iter()
        .filter(|r| !named.contains(&r.as_str()))
        .collect();
    assert!(missing.is_empty(), "routes §9 does not place: {missing:?}");

    // Storage keys: every function of keys.rs that builds one key (not a prefix, not an
    // id) and every `system/…json` constant, as `keys::NAME` in the keys table.
    let keys = std::fs::read_to_string(root.join("shared/src/keys.rs")).unwrap();
    let mut builders: Vec<String> = keys
        .lines()
        .filter_map(|l| {
            let name = l.strip_prefix("pub fn ")?.split('(').next()?;
            (l.contains("-> String") && !name.ends_with("_prefix") && name != "segment_id")
                .then(|| name.to_owned())
        })
        .collect();
    builders.extend(keys.lines().filter_map(|l| {
        let (name, value) = l.strip_prefix("pub const ")?.split_once(": &str = ")?;
        (value.starts_with("\"system/") && value.contains(".json")).then(|| name.to_owned())
    }));
    assert!(builders.len() >= 10, "keys.rs parsed: {builders:?}");
    let table = table_after("**Where each storage key is handled.**");
    let missing: Vec<&String> = builders
        .iter()
        .filter(|b| !table.contains(&format!("`keys::{b}`")))
        .collect();
    assert!(missing.is_empty(), "keys §9 does not place: {missing:?}");

    // Manifest fields: every field of `struct Manifest`, backticked in the fields table.
    let partition = std::fs::read_to_string(root.join("shared/src/partition/mod.rs")).unwrap();
    let body = partition
        .split("struct Manifest {")
        .nth(1)
        .and_then(|b| b.split("\n}").next())
        .expect("partition/mod.rs has struct Manifest");
    let fields: Vec<&str> = body
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))?;
            Some(l.split(':').next()?.trim())
        })
        .collect();
    assert!(fields.len() >= 15, "Manifest fields parsed: {fields:?}");
    let table = table_after("**Where each manifest field is handled**");
    let named = backticked(&table);
    let missing: Vec<&&str> = fields.iter().filter(|f| !named.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "manifest fields §9 does not place: {missing:?}"
    );
}
