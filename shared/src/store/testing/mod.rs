//! Test support that every backend and the broker's fault tests share, compiled only with
//! the `testing` cargo feature (dev-dependencies turn it on): it never ships in a
//! production build.
//!
//! * [`conformance`]: the suite every [`crate::store::Store`] backend must pass.
//! * [`fault`]: a store decorator that injects errors, lost responses, spurious
//!   conflicts and latency, from a seed.
//! * [`freeze`]: a store decorator for an instance that stops mid-operation forever.
//! * [`hook`]: a store decorator whose conditional replaces a test's closure decides.
//! * [`lost`]: a store decorator that loses one write's answer and holds the writer's
//!   recovery read.

pub mod conformance;
pub mod fault;
pub mod freeze;
pub mod hook;
pub mod lost;
