//! The structure of every crate, checked by every test run: no import cycle between the
//! top-level modules of a crate or between the files of one folder, and every production
//! file over 500 lines and every function over 80 named in design.md §9 ("Long files and
//! functions") with the reason it is kept. A split made only to get under a number is worse
//! than none, so the limit is a place to look, and the map says what was found there.
//!
//! It reads text (rustfmt's layout assumed), as `../shared/tools/structure.py` does: test
//! code (`#[cfg(test)]` items wherever they stand, `testing/` folders, `tests.rs` files and
//! the `tests` crate) is left out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE: usize = 500;
const MAX_FN: usize = 80;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// The source folder of every crate but the tests' own.
fn crate_roots() -> Vec<PathBuf> {
    let root = root();
    let mut roots: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file() && p.join("src").is_dir())
        .filter(|p| !p.ends_with("tests") && !p.ends_with("target"))
        .map(|p| p.join("src"))
        .collect();
    roots.sort();
    roots
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` outside `#[cfg(test)]` items, wherever they are in the file: an
/// item that ends on its line (`mod tests;`) is left out with its attribute, and a block
/// (`mod tests { … }`) up to the brace that closes it.
fn production_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if !l.trim_start().starts_with("#[cfg(test)]") {
            out.push(l);
            continue;
        }
        let mut depth = 0i64;
        let mut opened = false;
        for item in lines.by_ref() {
            let code = code_of(item);
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            opened |= code.contains('{');
            let attribute = item.trim_start().starts_with("#[");
            if (opened && depth <= 0) || (!opened && !attribute && code.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

/// A line without its `//` comment and the contents of its string and char literals, for
/// counting braces.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '/') if chars.peek() == Some(&'/') => break,
            (None, '"') => quote = Some('"'),
            (None, '\'') if chars.clone().nth(1) == Some('\'') => {
                chars.next();
                chars.next();
            }
            (None, c) => out.push(c),
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The lower-case identifiers `body` names after `prefix` (`crate::` or `super::`), either
/// directly (`crate::x`) or in a group (`use crate::{x, y::Z}`: every lower-case word of it).
fn references(body: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in body.match_indices(prefix) {
        // `super::super::x` names a file one folder up, not a sibling.
        if body[..at].ends_with(|c: char| is_ident(c) || c == ':') {
            continue;
        }
        let rest = &body[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for word in group.split(|c: char| !is_ident(c)) {
                if word.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') {
                    out.insert(word.to_owned());
                }
            }
        } else {
            let word: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if word.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') {
                out.insert(word);
            }
        }
    }
    out
}

/// A function's name when `line` opens one with a body: `pub(crate) async fn name(`.
fn fn_name(line: &str) -> Option<&str> {
    if line.trim_end().ends_with(';') {
        return None;
    }
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = match r.strip_prefix('(') {
            Some(r) => r.split_once(')')?.1,
            None => r,
        };
        if !rest.starts_with(' ') {
            return None;
        }
        rest = rest.trim_start();
    }
    for qualifier in ["async ", "const ", "unsafe "] {
        if let Some(r) = rest.strip_prefix(qualifier) {
            rest = r.trim_start();
        }
    }
    let rest = rest.strip_prefix("fn ")?.trim_start();
    let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Every function of `lines` longer than `max`: (first line, 1-based; name; length).
fn long_functions(lines: &[&str], max: usize) -> Vec<(usize, String, usize)> {
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let ind = indent(line);
        if let Some(j) = (i + 1..lines.len())
            .find(|&j| indent(lines[j]) == ind && lines[j][ind..].starts_with('}'))
        {
            if j - i + 1 > max {
                out.push((i + 1, name.to_owned(), j - i + 1));
            }
        }
    }
    out
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn strong(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.strong(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.out.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> = edges
        .iter()
        .flat_map(|(k, vs)| std::iter::once(k.as_str()).chain(vs.iter().map(String::as_str)))
        .collect();
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.strong(v);
        }
    }
    walk.out
}

/// What the check finds: cycles, and long files and functions with the path a doc names
/// them by (relative to `shared/src` for the core crate, to the repository otherwise).
#[derive(Default)]
struct Report {
    cycles: Vec<String>,
    long: Vec<Long>,
    other: Vec<String>,
}

struct Long {
    path: String,
    function: Option<String>,
    line: String,
}

fn check() -> Report {
    let root = root();
    let mut report = Report::default();
    for src in crate_roots() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        let top = |f: &Path| -> String {
            let first = f.strip_prefix(&src).unwrap().components().next().unwrap();
            let first = first.as_os_str().to_string_lossy();
            first.strip_suffix(".rs").unwrap_or(&first).to_owned()
        };
        let modules: BTreeSet<String> = files
            .iter()
            .map(|f| top(f))
            .filter(|m| m != "lib" && m != "main")
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut siblings: BTreeMap<PathBuf, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let prod = production_lines(&text);
            let body: String = prod
                .iter()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let m = top(f);
            if m != "lib" && m != "main" {
                for other in references(&body, "crate::") {
                    if other != m && modules.contains(&other) {
                        edges.entry(m.clone()).or_default().insert(other);
                    }
                }
            }
            let folder = f.parent().unwrap().to_path_buf();
            let name = f.file_stem().unwrap().to_string_lossy().into_owned();
            if !["mod", "lib", "main"].contains(&name.as_str()) {
                let sibs: BTreeSet<String> = std::fs::read_dir(&folder)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
                    .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
                    .collect();
                for other in references(&body, "super::") {
                    if other != name && other != "mod" && sibs.contains(&other) {
                        let folder_edges = siblings.entry(folder.clone()).or_default();
                        folder_edges.entry(name.clone()).or_default().insert(other);
                    }
                }
            }
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let named = rel.strip_prefix("shared/src/").unwrap_or(&rel).to_owned();
            if rel.contains("/testing/") || rel.ends_with("/tests.rs") {
                continue;
            }
            if prod.len() > MAX_FILE {
                report.long.push(Long {
                    path: named.clone(),
                    function: None,
                    line: format!("{rel}: {} production lines (> {MAX_FILE})", prod.len()),
                });
            }
            for (at, function, length) in long_functions(&prod, MAX_FN) {
                report.long.push(Long {
                    path: named.clone(),
                    line: format!("{rel}:{at}: fn {function} is {length} lines (> {MAX_FN})"),
                    function: Some(function),
                });
            }
            if body.contains("too_many_arguments") {
                report
                    .other
                    .push(format!("{rel}: allows clippy::too_many_arguments"));
            }
        }
        let crate_name = src.parent().unwrap().file_name().unwrap().to_string_lossy();
        for c in cycles(&edges) {
            report
                .cycles
                .push(format!("import cycle in {crate_name}: {}", c.join(" <-> ")));
        }
        for (folder, es) in &siblings {
            for c in cycles(es) {
                let folder = folder.strip_prefix(&root).unwrap().display();
                report.cycles.push(format!(
                    "import cycle between files of {folder}: {}",
                    c.join(" <-> ")
                ));
            }
        }
    }
    report
}

/// design.md §9's paragraph on long files and functions.
fn long_paragraph() -> String {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let from = design
        .find("**Long files and functions.**")
        .expect("design.md §9 has a paragraph on long files and functions");
    let rest = &design[from..];
    let end = rest[2..].find("\n**").map_or(rest.len(), |e| e + 2);
    rest[..end].to_owned()
}

fn backticked(text: &str) -> BTreeSet<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

#[test]
fn no_import_cycles_and_every_long_file_and_function_is_named_in_the_map() {
    let report = check();
    for line in report.cycles.iter().chain(&report.other) {
        println!("{line}");
    }
    for long in &report.long {
        println!("{}", long.line);
    }
    assert!(report.cycles.is_empty(), "{}", report.cycles.join("\n"));
    assert!(report.other.is_empty(), "{}", report.other.join("\n"));
    let paragraph = long_paragraph();
    let names = backticked(&paragraph);
    let unnamed: Vec<&str> = report
        .long
        .iter()
        .filter(|long| {
            !names.contains(long.path.as_str())
                || long.function.as_ref().is_some_and(|f| {
                    !names
                        .iter()
                        .any(|n| *n == f || n.ends_with(&format!("::{f}")))
                })
        })
        .map(|long| long.line.as_str())
        .collect();
    // And nothing named there that is no longer long: a function the paragraph names
    // (`name` or `Type::name`) is one the check lists.
    let long_fns: BTreeSet<&str> = report
        .long
        .iter()
        .filter_map(|l| l.function.as_deref())
        .collect();
    let stale: Vec<&str> = names
        .iter()
        .filter_map(|n| {
            let f = n.rsplit("::").next().unwrap_or(n);
            let is_fn = !f.is_empty()
                && f.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !f.starts_with(|c: char| c.is_ascii_digit());
            (is_fn && !long_fns.contains(f)).then_some(*n)
        })
        .collect();
    assert!(
        stale.is_empty(),
        "design.md §9 (\"Long files and functions\") names functions that are no longer long: {stale:?}"
    );
    assert!(
        unnamed.is_empty(),
        "split these along a real seam, or name each in design.md §9 (\"Long files and \
         functions\") with the reason it is kept:\n{}",
        unnamed.join("\n")
    );
}

#[test]
fn the_check_finds_what_it_looks_for() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, vs)| (k.to_owned(), vs.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(cycles(&edges), vec![vec!["a", "b", "c"]]);
    let refs = references(
        "use crate::{cas::x, store::{Store, dyn_store}};\nlet y = crate::partition::f();\nnotcrate::z",
        "crate::",
    );
    assert!(refs.contains("cas") && refs.contains("store") && refs.contains("partition"));
    assert!(!refs.contains("z"));
    let up = references(
        "use super::super::batch::X;\nuse super::known::Y;",
        "super::",
    );
    assert_eq!(up, BTreeSet::from(["known".to_owned(), "super".to_owned()]));
    assert_eq!(fn_name("    pub(crate) async fn run(&self) {"), Some("run"));
    assert_eq!(fn_name("fn f();"), None);
    assert_eq!(fn_name("    let function = 1;"), None);
    let body: Vec<String> = std::iter::once("fn long() {".to_owned())
        .chain((0..MAX_FN).map(|i| format!("    let x{i} = {i};")))
        .chain(["}".to_owned(), "fn short() {".to_owned(), "}".to_owned()])
        .collect();
    let lines: Vec<&str> = body.iter().map(String::as_str).collect();
    assert_eq!(
        long_functions(&lines, MAX_FN),
        vec![(1, "long".to_owned(), MAX_FN + 2)]
    );
    assert_eq!(production_lines("a\n#[cfg(test)]\nmod tests {}"), vec!["a"]);
    // Test items anywhere in a file are left out, and what follows them is counted.
    let text = "a\n#[cfg(test)]\nmod tests;\nb\n#[cfg(test)]\n#[allow(x)]\nfn t() {\n  let s = \"}\";\n  if x { '{' }\n}\nc";
    assert_eq!(production_lines(text), vec!["a", "b", "c"]);
}

/// What only the runtime seam may call (docs/design.md §9, "The runtime seam").
const RUNTIME_CALLS: [&str; 6] = [
    "tokio::spawn",
    "tokio::time::",
    "tokio::task::",
    "SystemTime::now",
    "Instant::now",
    "process::id",
];

/// The files of `shared/src` that may call them: the seam itself, the wall clock, the
/// HTTP server's accept loop, and the stores that only native builds have (the file
/// store, the S3 store and the latency decorator of benchmarks). The metered store and
/// the traits a Worker's store serves under use the seam.
fn may_call_runtime(rel: &str) -> bool {
    [
        "runtime.rs",
        "clock.rs",
        "http/serve.rs",
        "store/file.rs",
        "store/latency.rs",
    ]
    .contains(&rel)
        || rel.starts_with("store/s3/")
}

/// Production lines of `shared/src` (outside the files allowed) that call the runtime
/// directly: `path:line: text`.
fn runtime_calls_outside_the_seam() -> Vec<String> {
    let src = root().join("shared/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if may_call_runtime(&rel) || rel.ends_with("tests.rs") || rel.contains("testing/") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for l in production_lines(&text) {
            let code = l.split("//").next().unwrap_or("");
            if RUNTIME_CALLS.iter().any(|c| code.contains(c)) {
                found.push(format!("shared/src/{rel}: {}", l.trim()));
            }
        }
    }
    found
}

#[test]
fn the_core_spawns_sleeps_and_reads_the_time_only_through_the_runtime_seam() {
    let found = runtime_calls_outside_the_seam();
    assert!(
        found.is_empty(),
        "call crate::runtime (or crate::dispatch for background work) instead:\n{}",
        found.join("\n")
    );
    // The check sees what it looks for, and not in test code.
    let text =
        "let t = Instant::now();\n#[cfg(test)]\nmod tests {\n  fn f() { tokio::spawn(x); }\n}";
    let prod = production_lines(text);
    assert_eq!(prod, vec!["let t = Instant::now();"]);
    assert!(RUNTIME_CALLS.iter().any(|c| prod[0].contains(c)));
    assert!(may_call_runtime("store/s3/mod.rs") && !may_call_runtime("commit/mod.rs"));
    assert!(!may_call_runtime("store/metered.rs"));
}

/// Modules every file may call without naming them in design.md §9's "may call" column:
/// the leaves at the end of the map, which call nothing of the flow.
const LEAVES: [&str; 7] = [
    "error", "keys", "clock", "runtime", "settings", "formats", "config",
];

/// The files a §9 cell names: `a/b.rs`, or `a/{b,c}.rs` for several.
fn expand(cell: &str) -> Vec<String> {
    let mut out = Vec::new();
    for name in backticked(cell) {
        match (name.find('{'), name.find('}')) {
            (Some(open), Some(close)) if name.ends_with(".rs") => {
                for part in name[open + 1..close].split(',') {
                    out.push(format!("{}{part}{}", &name[..open], &name[close + 1..]));
                }
            }
            _ if name.ends_with(".rs") => out.push(name.to_owned()),
            _ => {}
        }
    }
    out
}

/// The words of a "may call" cell, lower-cased.
fn words(cell: &str) -> BTreeSet<String> {
    cell.split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Each file of design.md §9's map with the modules it calls that its "may call" cell does
/// not name: `path: calls x, y; the map says "…"`.
fn calls_the_map_does_not_name() -> Vec<String> {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let from = design.find("## §9 Map of the code").unwrap();
    let src = root().join("shared/src");
    let mut out = Vec::new();
    for row in design[from..].lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let (Some(first), Some(may)) = (cells.first(), cells.last()) else {
            continue;
        };
        let may = may.trim_end_matches('|').trim();
        let allowed = words(may);
        if allowed.contains("everything") || allowed.contains("tests") {
            continue;
        }
        for file in expand(first) {
            let path = src.join(&file);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let body: String = production_lines(&text)
                .iter()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let folder = path.parent().unwrap();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            let mut called: BTreeSet<String> = references(&body, "crate::")
                .into_iter()
                .filter(|m| src.join(format!("{m}.rs")).is_file() || src.join(m).is_dir())
                .collect();
            for m in references(&body, "super::") {
                let sibling = folder.join(format!("{m}.rs")).is_file() || folder.join(&m).is_dir();
                if sibling && m != stem {
                    called.insert(m);
                }
            }
            // A file's own top-level module is its own layer.
            let own = file.split('/').next().unwrap().trim_end_matches(".rs");
            let missing: Vec<String> = called
                .into_iter()
                .filter(|m| m != own && !LEAVES.contains(&m.as_str()) && !allowed.contains(m))
                .collect();
            if !missing.is_empty() {
                out.push(format!(
                    "{file}: calls {}; the map says \"{may}\"",
                    missing.join(", ")
                ));
            }
        }
    }
    out
}

#[test]
fn what_each_file_calls_is_what_the_map_says_it_may_call() {
    let found = calls_the_map_does_not_name();
    assert!(
        found.is_empty(),
        "design.md §9's \"may call\" column leaves out what these files call (name it there, \
         or call something else):\n{}",
        found.join("\n")
    );
    assert_eq!(
        expand("`partition/{produce,lease}.rs`"),
        vec!["partition/produce.rs", "partition/lease.rs"]
    );
}
