//! Narad's core library: a pull-based message broker whose only state lives in
//! S3-compatible object storage.
//!
//! Data flows one way, and each module only calls the ones after it
//! (docs/design.md §9 has the full map):
//!
//! 1. [`http`]: the axum router shared by `narad serve` and the Lambda function: parse,
//!    call one broker operation, render; `http/error.rs` maps errors to statuses.
//! 2. [`broker`]: one file per operation (topics, produce, consume, replay, settle,
//!    dead letters, long polling, metrics); [`broker::Housekeeping`] for maintenance.
//! 3. `commit`: the per-partition group-commit queue: one segment PUT and one manifest
//!    CAS per batch, typed submits.
//! 4. `partition`: the manifest model and the pure transitions (produce, lease,
//!    settle, compaction swap, one batch), unit-tested in place.
//! 5. `cas`: the one conditional-write loop, for every object changed in place.
//! 6. [`store`]: the storage trait and its backends (file, memory, S3, metered).
//!
//! Beside the flow: [`access`] (users, password hashes, per-topic grants),
//! [`maintenance`] (gc and compaction, through [`broker::Housekeeping`]), `topic`,
//! `segment`, `objects` (reading segments and index objects through the caches), `cache`,
//! `receipt`, `payload`, [`settings`], `keys`, [`clock`], `runtime` (the one place the
//! core spawns, sleeps and reads a monotonic clock), `dispatch` (the broker's background
//! tasks, stopped together), [`config`] (configuration from
//! the environment), [`formats`] (versions of stored formats), [`gate`] (which formats
//! the fleet may write), [`error`], and [`stored`] (the stored objects, for tools).
//! Modules without a link are private to this crate.

// The floors and helpers the broker is built from: private, reached through the modules
// below. docs/design.md §9 ("The crate's surface") says what each public module is for.
mod cache;
mod cas;
mod commit;
mod dispatch;
mod keys;
mod objects;
mod partition;
mod payload;
mod receipt;
mod repair;
mod runtime;
mod segment;
mod topic;

// The surface other crates use, on purpose: the broker and its HTTP router (served by
// `narad serve` and the Lambda functions), configuration, the store seam and its
// backends, maintenance, the fleet's format gate, and the stored objects for tools.
pub mod access;
pub mod broker;
pub mod clock;
pub mod config;
pub mod error;
pub mod formats;
pub mod gate;
pub mod http;
pub mod maintenance;
pub mod settings;
pub mod store;
pub mod subscription;

/// The bucket as Narad lays it out (docs/design.md §2, docs/formats.md), for tools and
/// tests that read it, or write what another version would. Clients use the HTTP API.
pub mod stored {
    pub use crate::cas::{open_json, seal_json, Invalid};
    pub use crate::partition::combine::Combinable;
    pub use crate::partition::intent::{Ask, Intent};
    pub use crate::partition::rebuild::VERSION_JUMP;
    pub use crate::receipt::{shared_key, Claims, ReceiptError, Receipts};
    pub use crate::segment::Segment;

    /// Every object's key (docs/design.md §2).
    pub mod keys {
        pub use crate::keys::*;
    }
}
