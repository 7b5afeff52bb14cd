//! Narad's core library: a pull-based message broker whose only state lives in
//! S3-compatible object storage.
//!
//! * [`store`]: the storage trait, its backends (file, memory, S3) and their conformance suite.
//! * [`keys`]: every object key, built in one place.
//! * [`manifest`]: a partition's state and the one read → apply → CAS → retry protocol.
//! * [`segment`]: immutable message batches.
//! * [`receipt`]: signed receipt handles.
//! * [`payload`]: how payload bytes appear in JSON responses.
//! * [`settings`]: topic settings and their limits.
//! * [`engine`]: the broker operations on top of all that.
//! * [`api`]: the HTTP router shared by `narad serve` and the Lambda function.
//! * [`config`]: configuration from the environment.
//! * [`clock`]: injectable time and ids.

pub mod api;
pub mod clock;
pub mod commit;
pub mod config;
pub mod engine;
pub mod gc;
pub mod keys;
pub mod manifest;
pub mod payload;
pub mod receipt;
pub mod segment;
pub mod settings;
pub mod store;
