//! The README's walkthrough and the docs' blocks work when pasted: every fenced `sh` block
//! of README.md, then of each page of `docs/` that has them, in order, one bash per page
//! (`set -euo pipefail`), against a fresh `narad serve`, with only the address and the
//! credentials of each page's first `export` line replaced, and the `PATH` a user
//! has: no `narad` on it. The client block then runs `cargo run -q -p narad -- ARGS`, as
//! it says; here `cargo` is a stand-in that checks it was called exactly so and runs the
//! `narad` this test run built (a nested `cargo run` would build the binary again with
//! other features, under the other tests' feet). A block whose curl gets an unexpected
//! status (`curl -f`) or whose check fails fails this test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use narad_tests::{free_port, test_store_url, Process, PASS, USER};

/// The fenced `sh` blocks of `markdown`, in order.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), _) => lines.push(line),
            (None, _) => {}
        }
    }
    blocks
}

/// Every page that has `sh` blocks, README.md first, then `docs/*.md` by name: its path
/// and its blocks.
fn pages_with_blocks() -> Vec<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .filter_map(|p| {
            let blocks = sh_blocks(&std::fs::read_to_string(&p).unwrap());
            let name = p.strip_prefix(&root).unwrap().display().to_string();
            (!blocks.is_empty()).then_some((name, blocks))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sh_block_of_the_readme_and_the_docs_runs_in_order_against_a_fresh_server() {
    if narad_tests::skip_in_external_mode("a narad serve process of its own") {
        return;
    }
    let pages = pages_with_blocks();
    assert_eq!(pages[0].0, "README.md");
    assert!(
        pages[0].1.len() >= 3,
        "the README lost its walkthrough blocks"
    );
    assert!(
        pages.iter().any(|(name, _)| name == "docs/features.md"),
        "docs/features.md lost its blocks"
    );
    let (url, _dir) = test_store_url();
    let server = Process::start(&url, free_port(), &[]).await;
    for (name, blocks) in &pages {
        assert!(
            blocks[0].contains("export NARAD=http://127.0.0.1:8080 AUTH=me:secret"),
            "the first block of {name} sets NARAD and AUTH"
        );
        run_page(name, blocks, &server.base).await;
    }
    server.kill().await;
}

/// Runs one page's blocks, in order, in one bash against the server at `base`.
async fn run_page(name: &str, blocks: &[String], base: &str) {
    let script = blocks
        .join("\n")
        .replace("http://127.0.0.1:8080", base)
        .replace("AUTH=me:secret", &format!("AUTH={USER}:{PASS}"));
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("page.sh");
    std::fs::write(&path, format!("set -euo pipefail\nset -x\n{script}\n")).unwrap();
    // The user's PATH, without any `narad` on it, and `cargo` standing for the build the
    // Quickstart made.
    let shims = work.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let cargo = shims.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/usr/bin/env bash\n\
             # `cargo run -q -p narad -- ARGS`, and nothing else.\n\
             [[ \"$1 $2 $3 $4 $5\" == 'run -q -p narad --' ]] || {{ echo \"unexpected: cargo $*\" >&2; exit 97; }}\n\
             shift 5\n\
             exec '{}' \"$@\"\n",
            narad_tests::narad_binary().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let user_path: Vec<String> = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|dir| !Path::new(dir).join("narad").exists())
        .map(str::to_owned)
        .collect();
    let path_var = format!("{}:{}", shims.display(), user_path.join(":"));
    let out = tokio::process::Command::new("bash")
        .arg(&path)
        .env("PATH", path_var)
        .env_remove("NARAD_URL")
        .env_remove("NARAD_AUTH")
        .current_dir(work.path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the sh blocks of {name} failed:\n--- stdout\n{}\n--- stderr (trace)\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "{} blocks of {name} ran; output:\n{}",
        blocks.len(),
        String::from_utf8_lossy(&out.stdout)
    );
}
