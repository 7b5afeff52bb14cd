//! The README's walkthrough works when pasted: every fenced `sh` block of README.md, in
//! order, runs in one bash (`set -euo pipefail`) against a fresh `narad serve`, with only
//! the address and the credentials of its `export` line replaced, and the `PATH` a user
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sh_block_of_the_readme_runs_in_order_against_a_fresh_server() {
    if narad_tests::skip_in_external_mode("a narad serve process of its own") {
        return;
    }
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(readme).unwrap();
    let blocks = sh_blocks(&text);
    assert!(blocks.len() >= 5, "the README lost its walkthrough blocks");
    assert!(
        blocks[0].contains("export NARAD=http://127.0.0.1:8080 AUTH=me:secret"),
        "the first block sets NARAD and AUTH"
    );
    let (url, _dir) = test_store_url();
    let server = Process::start(&url, free_port(), &[]).await;
    let script = blocks
        .join("\n")
        .replace("http://127.0.0.1:8080", &server.base)
        .replace("AUTH=me:secret", &format!("AUTH={USER}:{PASS}"));
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("readme.sh");
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
    server.kill().await;
    assert!(
        out.status.success(),
        "the README's sh blocks failed:\n--- stdout\n{}\n--- stderr (trace)\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "{} README blocks ran; output:\n{}",
        blocks.len(),
        String::from_utf8_lossy(&out.stdout)
    );
}
