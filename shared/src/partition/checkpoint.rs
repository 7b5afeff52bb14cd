//! When a manifest leaves a checkpoint (a copy written after its write lands: the way
//! back from a corrupt manifest, docs/design.md §7), and which two it keeps.

use serde::{Deserialize, Serialize};

/// A manifest write leaves a checkpoint at least every this many versions.
pub(crate) const CHECKPOINT_EVERY: u64 = 16;

/// Where a manifest's checkpoints stand (copies of the manifest written after their write
/// lands: the way back from a corrupt manifest, docs/design.md §7), as of the newest write
/// that was to leave one. Two are kept. Stored as the array `[version, at_ms, previous,
/// delete]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "[u64; 4]", into = "[u64; 4]")]
pub struct Checkpoints {
    /// The version of the newest write marked to leave one (0: none yet).
    pub version: u64,
    /// When that write was made (ms).
    pub at_ms: u64,
    /// The version of the checkpoint before it (0: none), kept with it.
    pub previous: u64,
    /// The version of the checkpoint to delete once the newest is written (0: none).
    pub delete: u64,
}

impl Checkpoints {
    /// Whether no write was ever marked (then the field is not stored).
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Marks the write of `version`, at `now_ms`, to leave a checkpoint when the last one
    /// is [`CHECKPOINT_EVERY`] versions or half of `retention_ms` old, or there is none;
    /// true if it does. (Half the retention: segments committed after the newest
    /// checkpoint are then never old enough for retention, so a rebuild finds them all.)
    pub fn mark(&mut self, version: u64, now_ms: u64, retention_ms: u64) -> bool {
        let last = *self;
        let due = last.version == 0
            || version >= last.version + CHECKPOINT_EVERY
            || now_ms.saturating_sub(last.at_ms) > retention_ms / 2;
        if due {
            *self = Checkpoints {
                version,
                at_ms: now_ms,
                previous: last.version,
                delete: last.previous,
            };
        }
        due
    }

    /// Whether the write of `version` was marked to leave a checkpoint: `Some(v)`, where
    /// `v` (0: none) is the checkpoint version to delete once it is written.
    pub fn wanted(&self, version: u64) -> Option<u64> {
        (self.version == version && version > 0).then_some(self.delete)
    }
}

impl From<[u64; 4]> for Checkpoints {
    fn from([version, at_ms, previous, delete]: [u64; 4]) -> Self {
        Self {
            version,
            at_ms,
            previous,
            delete,
        }
    }
}

impl From<Checkpoints> for [u64; 4] {
    fn from(c: Checkpoints) -> Self {
        [c.version, c.at_ms, c.previous, c.delete]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::Manifest;

    #[test]
    fn checkpoints_are_stored_as_the_array_they_always_were() {
        let c = Checkpoints {
            version: 32,
            at_ms: 5,
            previous: 16,
            delete: 0,
        };
        assert_eq!(serde_json::to_string(&c).unwrap(), "[32,5,16,0]");
        let back: Checkpoints = serde_json::from_str("[32,5,16,0]").unwrap();
        assert_eq!(back, c);
        let mut m = Manifest::empty("i");
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains("checkpoint"), "{text}");
        m.version = 1;
        assert!(m.mark_checkpoint(100, 1_000));
        m.version = 17;
        assert!(m.mark_checkpoint(200, 1_000));
        assert_eq!(
            m.checkpoint,
            Checkpoints {
                version: 17,
                at_ms: 200,
                previous: 1,
                delete: 0
            }
        );
        m.version = 33;
        assert!(m.mark_checkpoint(300, 1_000));
        assert_eq!(m.wants_checkpoint(), Some(1), "the oldest of three goes");
    }
}
