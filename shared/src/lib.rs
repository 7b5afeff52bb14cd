//! Narad's core library: a pull-based message broker whose only state lives in
//! S3-compatible object storage.
//!
//! Data flows one way, and each module only calls the ones after it
//! (docs/design.md §9 has the full map):
//!
//! 1. [`http`]: the axum router shared by `narad serve` and the Lambda function: parse,
//!    call one broker operation, render; [`http::error`] maps errors to statuses.
//! 2. [`broker`]: one file per operation (topics, produce, consume, replay, settle,
//!    dead letters, long polling, metrics).
//! 3. [`commit`]: the per-partition group-commit queue: one segment PUT and one manifest
//!    CAS per batch, typed submits.
//! 4. [`partition`]: the manifest model and the pure transitions (produce, lease,
//!    settle, compaction swap, one batch), unit-tested in place.
//! 5. [`cas`]: the one conditional-write loop, for every object changed in place.
//! 6. [`store`]: the storage trait and its backends (file, memory, S3, metered).
//!
//! Beside the flow: [`access`] (users, password hashes, per-topic grants), [`maintenance`] (gc and compaction, through the broker's API),
//! [`topic`], [`segment`], [`objects`] (reading segments and index objects through the caches), [`cache`], [`receipt`], [`payload`], [`settings`], [`keys`], [`clock`],
//! [`config`] (configuration from the environment), [`formats`] (versions of stored formats), [`gate`] (which formats the fleet may write) and [`error`].

pub mod access;
pub mod broker;
pub mod cache;
pub mod cas;
pub mod clock;
pub mod commit;
pub mod config;
pub mod error;
pub mod formats;
pub mod gate;
pub mod http;
pub mod keys;
pub mod maintenance;
pub mod objects;
pub mod partition;
pub mod payload;
pub mod receipt;
pub mod segment;
pub mod settings;
pub mod store;
pub mod subscription;
pub mod topic;
