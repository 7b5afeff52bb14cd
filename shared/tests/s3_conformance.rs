//! Runs the store conformance suite against a real S3 endpoint (LocalStack in CI).
//!
//! Enabled by `NARAD_TEST_S3=s3://BUCKET[/PREFIX]` together with the usual AWS environment,
//! e.g. after `localstack/start.sh`:
//!
//! ```text
//! NARAD_TEST_S3=s3://narad-test/ci AWS_ENDPOINT_URL=http://127.0.0.1:4566 \
//!   AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
//!   cargo test -p narad-shared --test s3_conformance -- --nocapture
//! ```
//!
//! Without `NARAD_TEST_S3` every test prints that it was skipped and passes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use narad_shared::store::{self, StoreError};

fn target() -> Option<String> {
    match std::env::var("NARAD_TEST_S3") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_string()),
        _ => {
            println!("skipped: NARAD_TEST_S3 not set");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_store_passes_conformance() {
    let Some(url) = target() else { return };
    let store = store::open(&url)
        .await
        .unwrap_or_else(|e| panic!("opening {url} failed: {e}"));
    println!("running conformance against {}", store.describe());
    let prefix = format!("conformance-{}", uuid::Uuid::new_v4());
    store::testing::conformance::run_all(store.clone(), &prefix).await;
    // Leave the bucket tidy; a failure here is not a conformance failure.
    for key in store.list(&format!("{prefix}/")).await.unwrap_or_default() {
        let _ = store.delete(&key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_bucket_fails_clearly() {
    let Some(url) = target() else { return };
    assert!(
        url.starts_with("s3://"),
        "NARAD_TEST_S3 must be an s3:// URL, got {url}"
    );
    let bucket = format!("narad-missing-{}", uuid::Uuid::new_v4().simple());
    let missing = format!("s3://{bucket}/x");
    match store::open(&missing).await {
        Err(StoreError::Other(failure)) => {
            let msg = failure.message();
            println!("missing bucket error: {msg}");
            assert!(
                msg.contains(&bucket),
                "the error must name the bucket: {msg}"
            );
            assert!(
                msg.contains("does not exist"),
                "the error must say why: {msg}"
            );
        }
        Err(e) => panic!("opening a missing bucket must be StoreError::Other, got {e:?}"),
        Ok(s) => panic!("opening a missing bucket must fail, got {}", s.describe()),
    }
}

/// Conditional writes race with exactly one winner, 40 rounds of each kind through
/// Narad's S3 store (SeaweedFS fixed a race among If-None-Match writers in March 2026).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conditional_write_races_have_one_winner() {
    let Some(url) = target() else { return };
    let store = store::open(&url).await.unwrap();
    let prefix = format!("races-{}", uuid::Uuid::new_v4());
    let seen = store::testing::conformance::race_rounds(store.clone(), &prefix, 40).await;
    println!(
        "{}: {} writers per round; put_if_absent: {} of {} rounds with exactly one winner; \
         put_if_match: {} of {}",
        store.describe(),
        store::testing::conformance::WRITERS,
        seen.create_one_winner,
        seen.rounds,
        seen.replace_one_winner,
        seen.rounds
    );
    assert_eq!(seen.create_one_winner, 40, "{seen:?}");
    assert_eq!(seen.replace_one_winner, 40, "{seen:?}");
    for key in store.list(&format!("{prefix}/")).await.unwrap_or_default() {
        let _ = store.delete(&key).await;
    }
}
