//! `narad-maintenance`: Narad's scheduled maintenance as an AWS Lambda function.
//!
//! Invoked by an EventBridge schedule (`infra/template.yaml`, every 15 minutes). Each
//! invocation runs one garbage-collection pass ([`narad_shared::maintenance`]): retention on every
//! partition (idle ones too), orphan segments older than the grace period deleted,
//! leftovers of deleted topics deleted. It logs and returns the JSON report. The pass is
//! safe to run concurrently with the API and with itself.
//!
//! Configuration is the API function's (`NARAD_STORE`, `NARAD_RECEIPT_KEY`, …) plus
//! `NARAD_GC_GRACE` (default `30m`): how old an unreferenced segment must be before it is
//! deleted; keep it above the API function's 15-minute maximum lifetime.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use lambda_http::{lambda_runtime, service_fn, LambdaEvent};
use narad_functions::init_tracing;
use narad_shared::broker::Broker;
use narad_shared::config::Config;
use narad_shared::maintenance::{self, DEFAULT_GRACE};

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "narad-maintenance: cold start failed");
            eprintln!("narad-maintenance: {e}");
            ExitCode::FAILURE
        }
    }
}

fn grace() -> Result<Duration, String> {
    match std::env::var("NARAD_GC_GRACE") {
        Err(_) => Ok(DEFAULT_GRACE),
        Ok(v) => humantime::parse_duration(&v).map_err(|e| format!("NARAD_GC_GRACE: {e}")),
    }
}

async fn run() -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let grace = grace()?;
    let broker = Arc::new(
        Broker::from_config(&cfg)
            .await
            .map_err(|e| format!("cannot start on store {}: {e}", cfg.store))?,
    );
    lambda_runtime::run(service_fn(move |_event: LambdaEvent<serde_json::Value>| {
        let broker = broker.clone();
        async move {
            let report = maintenance::gc(&broker, grace, false).await.map_err(|e| format!("gc failed: {e}"))?;
            tracing::info!(report = %serde_json::to_string(&report).unwrap_or_default(), "maintenance pass done");
            serde_json::to_value(&report).map_err(|e| e.to_string())
        }
    }))
    .await
    .map_err(|e| format!("lambda runtime error: {e}"))
}
