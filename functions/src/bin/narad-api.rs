//! `narad-api`: Narad's HTTP API as an AWS Lambda function behind an API Gateway HTTP API
//! (or a Lambda function URL, or `cargo lambda watch`).
//!
//! It serves the very router `narad serve` serves ([`narad_shared::http::router`]), through
//! `lambda_http`. Everything that can be built once is built once per cold start: the
//! configuration (from the environment, see `narad_shared::config`), the store client, and
//! the broker with its caches. Logs are JSON lines on stdout, which Lambda ships to
//! CloudWatch Logs.
//!
//! Unlike `narad serve`, the function never generates credentials: `NARAD_AUTH` must be set
//! (in AWS from a secret, see `infra/template.yaml`), or the cold start fails with a message
//! naming the variable.

use std::process::ExitCode;
use std::sync::Arc;
use tokio::time::Instant;

use narad_functions::{handle, init_tracing, require_users, FUNCTION_NAME};
use narad_shared::broker::Broker;
use narad_shared::config::Config;
use narad_shared::http;

#[tokio::main]
async fn main() -> ExitCode {
    let started = Instant::now();
    init_tracing();
    match run(started).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{FUNCTION_NAME}: cold start failed");
            eprintln!("{FUNCTION_NAME}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(started: Instant) -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let users = require_users(&cfg)?;
    if cfg.test_clock_file.is_some() {
        tracing::warn!("NARAD_TEST_CLOCK_FILE is set: time comes from a file (tests only)");
    }
    let broker = Broker::from_config(&cfg)
        .await
        .map_err(|e| format!("cannot start on store {}: {e}", cfg.store))?;
    let described = broker.store_description();
    let app = http::router(Arc::new(broker), users, &cfg.http);
    tracing::info!(
        store = %described,
        init_ms = started.elapsed().as_millis() as u64,
        max_wait_ms = cfg.broker.max_wait.as_millis() as u64,
        "{FUNCTION_NAME} initialised"
    );
    // Sequential in a classic Lambda execution environment; concurrent invocations when
    // AWS_LAMBDA_MAX_CONCURRENCY > 1 (Lambda Managed Instances), which suits long polls.
    lambda_http::run_concurrent(lambda_http::service_fn(move |req: lambda_http::Request| {
        handle(app.clone(), req)
    }))
    .await
    .map_err(|e| format!("lambda runtime error: {e}"))
}
