//! Narad's HTTP API as a Cloudflare Worker, its state in an R2 bucket.
//!
//! Only `wasm32` builds have a body: a native build of the workspace compiles an empty
//! library here.
#![cfg(target_arch = "wasm32")]

mod r2;

pub use r2::R2Store;
