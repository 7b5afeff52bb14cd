//! Injectable time and ids, so lease logic is tested without sleeping.
//!
//! Production code uses [`SystemClock`] and [`RandomIds`]; tests use [`ManualClock`]
//! (time moves only when the test says so) and [`SequentialIds`]. [`FileClock`] lets a
//! test move time in another process (an external server or a Lambda emulator).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
#[cfg(not(target_arch = "wasm32"))]
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since 1970-01-01T00:00:00Z.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    // The one read of the system clock (clippy.toml disallows it everywhere else).
    #[allow(clippy::disallowed_methods)]
    #[cfg(not(target_arch = "wasm32"))]
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    // On wasm32 the host's: `SystemTime::now` panics there (no platform clock).
    #[cfg(target_arch = "wasm32")]
    fn now_ms(&self) -> u64 {
        let ms = js_sys::Date::now();
        if ms.is_finite() && ms > 0.0 {
            ms as u64
        } else {
            0
        }
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock set to `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the time.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock read from a file, for tests that drive time in another process.
///
/// Every [`Clock::now_ms`] reads the file and parses its content (surrounding whitespace
/// ignored) as milliseconds since the Unix epoch. If the file is missing or does not hold
/// a whole number, it falls back to the system clock. Test-only: enabled by
/// `NARAD_TEST_CLOCK_FILE` (see [`crate::config::Config::test_clock_file`]).
#[derive(Debug, Clone)]
pub struct FileClock {
    /// The file holding the time.
    pub path: std::path::PathBuf,
}

impl FileClock {
    /// A clock that reads `path`.
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

impl Clock for FileClock {
    fn now_ms(&self) -> u64 {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| SystemClock.now_ms())
    }
}

/// A source of unique ids (segment names, write ids).
pub trait IdSource: Send + Sync + 'static {
    /// A new id, unique across processes sharing a store. Only `[A-Za-z0-9-]`.
    fn new_id(&self) -> String;
}

/// UUIDv7 ids: unique, and sortable by creation time.
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn new_id(&self) -> String {
        uuid::Uuid::now_v7().simple().to_string()
    }
}

/// Predictable ids `id-000001`, `id-000002`, … for tests.
#[derive(Debug, Default)]
pub struct SequentialIds(AtomicU64);

impl IdSource for SequentialIds {
    fn new_id(&self) -> String {
        format!("id-{:06}", self.0.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

/// 32 hex digits unique among every process: a random number drawn once per process, then
/// a counter, so a hot path (request ids, temporary file names) pays no random draw.
pub fn process_unique_hex() -> String {
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let process = PROCESS.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    format!(
        "{process:016x}{:016x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_clock_reads_the_file_every_time_and_falls_back_to_system_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("now");
        let clock = FileClock::new(&path);
        let before = SystemClock.now_ms();
        assert!(clock.now_ms() >= before, "missing file: system time");
        std::fs::write(&path, "1795953600000\n").unwrap();
        assert_eq!(clock.now_ms(), 1_795_953_600_000);
        std::fs::write(&path, "1795953601000").unwrap();
        assert_eq!(clock.now_ms(), 1_795_953_601_000);
        std::fs::write(&path, "garbage").unwrap();
        assert!(clock.now_ms() >= before, "unparsable: system time");
    }
}
