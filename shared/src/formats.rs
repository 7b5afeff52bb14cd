//! Versions of stored formats, and what a build does with one newer than it reads
//! (docs/upgrades.md, docs/formats.md).
//!
//! Every stored object says which version of its format it is: a JSON record in a field
//! (`format`, `layout`), a binary object in the last of its four magic bytes (`NSG2`,
//! `NIX1`, `NDK1`: three letters for the kind, one digit for the version). An object of a
//! version above the one this build knows is [`Newer`], not corrupt: a newer build wrote
//! it, and this build answers 503 `upgrade_required` for it and never rewrites, repairs,
//! compacts or deletes it.

/// A fleet level: which formats the builds sharing a store may write (docs/formats.md).
/// Every build reads every format of every level it knows; a build writes a format only
/// once the store's fleet record ([`crate::gate`]) is at that format's level, so no
/// process of a build that cannot read it is still running.
///
/// | level | what it adds |
/// |---|---|
/// | 1 | the formats of every build before the gate (main at commit c3661c8 and earlier): manifest formats 1–5, topic layouts 1–2, segments `NSG1`/`NSG2`, index objects `NIX1`, key chunks `NDK1`, receipt handles `v1` |
/// | 2 | segments `NSG3`: a segment's body compressed (LZ4) when that saves an eighth or more |
/// | 3 | intents (settles and lease requests any process commits, `…-i{op}` under `segments/`) and manifest format 6 (`decided`, `decided_floor`) |
/// | 4 | combinable segment ids tagged with their topic incarnation (`…-t{tag}`): commits land only their own incarnation's, so a combinable segment's write need not confirm the topic record first |
/// | 5 | subscriptions: `subscriptions` in topic records, their ledgers `topics/{t}/subs/{s}/{id}/{p}.json`, receipt handles `v2` (they name the subscription) |
/// | 6 | intents of subscriptions' ledgers (`topics/{t}/subs/{s}/{id}/{p}/{id}`) and ledger format 2 (`combined_through`, `decided`, `decided_floor`) |
/// | 7 | segments written beside the manifest write that names them undecided (manifest format 7, `beside`), each decided by the object at its key: the segment, or an `NSG4` void marker ([`crate::partition::beside`]) |
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Level(pub u32);

impl Level {
    /// The formats of every build before the gate: a store without a fleet record.
    pub const BEFORE_GATE: Level = Level(1);
    /// The highest level this build runs at.
    pub const NEWEST: Level = Level(7);

    /// True when segments may be written compressed (`NSG3`).
    pub fn compresses_segments(self) -> bool {
        self >= Level(2)
    }

    /// True when settles and lease requests may be written as intents, and manifests
    /// may record their outcomes (format 6; [`crate::partition::intent`]).
    pub fn writes_intents(self) -> bool {
        self >= Level(3)
    }

    /// True when a commit may write its segment beside the manifest write that names it
    /// undecided (manifest format 7, `NSG4` void markers;
    /// [`crate::partition::beside`]).
    pub fn writes_beside(self) -> bool {
        self >= Level(7)
    }

    /// True when combinable segment ids may carry their topic incarnation's tag, which
    /// every build at this level honours ([`crate::partition::combine::tag`]).
    pub fn tags_segments(self) -> bool {
        self >= Level(4)
    }

    /// True when topics may have subscriptions besides the default one: every build at
    /// this level serves them (an older one would refuse their consumes and handles).
    pub fn has_subscriptions(self) -> bool {
        self >= Level(5)
    }

    /// True when settles and lease requests of a subscription may be written as intents
    /// under its ledger's prefix, and its ledgers may record their outcomes (format 2;
    /// [`crate::partition::subscription::apply_landing`]).
    pub fn combines_ledgers(self) -> bool {
        self >= Level(6)
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A manifest write id as this build records it: its newest level first, `g2-…`. Builds
/// before the gate record bare ids, so `narad upgrade` can tell every recent write of a
/// build that cannot read a level ([`write_stamp`]).
pub fn stamp_write(write_id: &str) -> String {
    format!("g{}-{write_id}", Level::NEWEST.0)
}

/// The write time of a write id (a UUIDv7 at its end, as [`crate::clock::RandomIds`]
/// makes them), if it has one.
pub fn write_time(id: &str) -> Option<u64> {
    let hex = id.get(id.len().checked_sub(32)?..)?;
    let v = u128::from_str_radix(hex, 16).ok()?;
    let version = (v >> 76) & 0xf;
    (version == 7).then_some((v >> 80) as u64)
}

/// The newest level the writer of `id` reads, from its stamp; `None` for a bare id (a
/// build before the gate).
pub fn write_stamp(id: &str) -> Option<Level> {
    let (stamp, _) = id.strip_prefix('g')?.split_once('-')?;
    let plain = !stamp.is_empty() && stamp.len() <= 4 && stamp.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| stamp.parse().ok().map(Level)).flatten()
}

/// An object in a format newer than this build knows: which version field says so, the
/// version found and the newest this build reads. Such an object is answered 503
/// `upgrade_required` and never rewritten, repaired, compacted or deleted by this build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newer {
    /// The version field, e.g. `manifest format`.
    pub what: &'static str,
    /// The version the object has.
    pub found: u64,
    /// The newest version this build reads.
    pub known: u64,
}

impl std::fmt::Display for Newer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} is newer than this build of Narad reads ({})",
            self.what, self.found, self.known
        )
    }
}

impl Newer {
    /// `Some` when `found` is above `known`.
    pub fn check(what: &'static str, found: u64, known: u64) -> Option<Newer> {
        (found > known).then_some(Newer { what, found, known })
    }
}

/// Why an immutable binary object (a segment, an index object, a key chunk) cannot be
/// read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// The bytes are damaged or are not such an object.
    #[error("{0}")]
    Corrupt(String),
    /// A newer build wrote it.
    #[error("{0}")]
    Newer(Newer),
}

/// The magic of one kind of binary object: three letters, then the version digit.
#[derive(Debug, Clone, Copy)]
pub struct Magic {
    /// The three letters of the kind, e.g. `NSG`.
    pub kind: &'static [u8; 3],
    /// The version field's name in messages, e.g. `segment format`.
    pub what: &'static str,
    /// The newest version this build reads.
    pub known: u8,
}

impl Magic {
    /// The four magic bytes of `version`.
    pub fn bytes(&self, version: u8) -> [u8; 4] {
        let [a, b, c] = *self.kind;
        [a, b, c, b'0' + version]
    }

    /// The version `data` says it is (1 to [`Magic::known`]) and the bytes after the magic.
    ///
    /// Errors: [`Unreadable::Newer`] for a version digit above `known`,
    /// [`Unreadable::Corrupt`] for anything else that is not this kind's magic.
    pub fn open<'a>(&self, data: &'a [u8]) -> Result<(u8, &'a [u8]), Unreadable> {
        let bad = || Unreadable::Corrupt("bad magic".into());
        let rest = data.strip_prefix(self.kind.as_slice()).ok_or_else(bad)?;
        let (&digit, body) = rest.split_first().ok_or_else(bad)?;
        if !(b'1'..=b'9').contains(&digit) {
            return Err(bad());
        }
        let version = digit - b'0';
        match Newer::check(self.what, version.into(), self.known.into()) {
            Some(newer) => Err(Unreadable::Newer(newer)),
            None => Ok((version, body)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_ids_tell_their_time() {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
        let t = write_time(&id).unwrap();
        assert!(t <= now && now - t < 5000, "{t} {now}");
        assert_eq!(write_time(&format!("repair-{id}")), Some(t));
        assert_eq!(write_time(&stamp_write(&id)), Some(t));
        assert_eq!(write_time("id-000001"), None);
        assert_eq!(write_time(&uuid::Uuid::new_v4().simple().to_string()), None);
    }

    #[test]
    fn write_ids_carry_the_level_of_their_writer() {
        let uuid = "01a231a5253773409371a411e14bb806";
        let stamped = stamp_write(uuid);
        assert_eq!(stamped, format!("g{}-{uuid}", Level::NEWEST));
        assert_eq!(write_stamp(&stamped), Some(Level::NEWEST));
        assert_eq!(write_stamp(&format!("g2-{uuid}")), Some(Level(2)));
        assert_eq!(
            write_stamp(&stamp_write(&format!("repair-{uuid}"))),
            Some(Level::NEWEST)
        );
        // Bare ids: builds before the gate (UUIDv7 hex never starts with `g`).
        assert_eq!(write_stamp(uuid), None);
        assert_eq!(write_stamp("repair-x"), None);
        assert_eq!(write_stamp("g-x"), None);
        assert_eq!(write_stamp("gx-y"), None);
    }

    const SEG: Magic = Magic {
        kind: b"NSG",
        what: "segment format",
        known: 2,
    };

    #[test]
    fn a_higher_version_digit_is_newer_and_anything_else_is_corrupt() {
        assert_eq!(SEG.bytes(2), *b"NSG2");
        assert_eq!(SEG.open(b"NSG1abc").unwrap(), (1, &b"abc"[..]));
        assert_eq!(SEG.open(b"NSG2").unwrap(), (2, &b""[..]));
        match SEG.open(b"NSG3abc") {
            Err(Unreadable::Newer(n)) => {
                assert_eq!((n.what, n.found, n.known), ("segment format", 3, 2))
            }
            other => panic!("{other:?}"),
        }
        for bad in [&b"NSG0"[..], b"NSGx", b"NSG", b"", b"NIX1", b"nsg1"] {
            assert!(
                matches!(SEG.open(bad), Err(Unreadable::Corrupt(_))),
                "{bad:?}"
            );
        }
    }
}
