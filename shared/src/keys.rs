//! Every object key Narad uses, built in one place.
//!
//! Layout (relative to the store's root or prefix):
//!
//! | key | what |
//! |---|---|
//! | `topics/{topic}/topic.json` | topic settings, created with put-if-absent |
//! | `topics/{topic}/{partition}.manifest.json` | the partition's mutable state, replaced by CAS (`topics/{topic}/{partition}/manifest.json` in topics of layout 1) |
//! | `topics/{topic}/{partition}/segments/{id}` | an immutable batch of messages |
//! | `topics/{topic}/{partition}/indexes/{id}` | an immutable list of older segments (or of lower indexes) |
//! | `topics/{topic}/{partition}/dedup/{id}` | an immutable chunk of remembered idempotency keys |
//! | `system/receipt-key.json` | the generated receipt-signing key, when none is configured |
//! | `system/fleet.json` | the fleet level: the formats every running build may write ([`crate::gate`]) |
//! | `system/processes/{id}.json` | one running process: its build and the newest level it reads; expires unless renewed |
//!
//! Topic names are validated by [`validate_topic`] before any key is built from them.

/// Prefix of every topic's objects.
pub const TOPICS_PREFIX: &str = "topics/";
/// Where a generated receipt-signing key is kept.
pub const RECEIPT_KEY: &str = "system/receipt-key.json";
/// The fleet record ([`crate::gate::FleetRecord`]).
pub const FLEET: &str = "system/fleet.json";
/// Where process records are listed.
pub const PROCESSES_PREFIX: &str = "system/processes/";

/// `system/processes/{id}.json`: the record of one running process.
pub fn process(id: &str) -> String {
    format!("{PROCESSES_PREFIX}{id}.json")
}

/// Why a topic name was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid topic name: {0}")]
pub struct InvalidTopic(pub &'static str);

/// Checks a topic name: 1–200 characters from `[A-Za-z0-9._-]`, not starting with `.`. Every
/// store accepts every name this accepts (the one rule for all stores).
pub fn validate_topic(name: &str) -> Result<(), InvalidTopic> {
    if name.is_empty() || name.len() > 200 {
        return Err(InvalidTopic("must be 1 to 200 characters"));
    }
    // A leading dot would name hidden files and the file store's own `.tmp` and `.lock`.
    if name.starts_with('.') {
        return Err(InvalidTopic("must not start with '.'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(InvalidTopic(
            "may contain only letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// `topics/{topic}/`: every object of the topic.
pub fn topic_prefix(topic: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/")
}

/// `topics/{topic}/topic.json`.
pub fn topic_settings(topic: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/topic.json")
}

/// The manifest layout of topics created since the idle watch: every manifest directly
/// under the topic, beside `topic.json`, so that one delimited listing of the topic shows
/// every partition's manifest ETag (docs/design.md §2).
pub const LAYOUT_FLAT: u32 = 2;

/// A partition's manifest: `topics/{topic}/{partition}.manifest.json` in
/// [`LAYOUT_FLAT`], `topics/{topic}/{partition}/manifest.json` in layout 1 (topics
/// created before it).
pub fn manifest(topic: &str, layout: u32, partition: u32) -> String {
    if layout >= LAYOUT_FLAT {
        format!("{TOPICS_PREFIX}{topic}/{partition}.manifest.json")
    } else {
        format!("{TOPICS_PREFIX}{topic}/{partition}/manifest.json")
    }
}

/// The partition whose manifest `key` is, if it is a [`LAYOUT_FLAT`] manifest of `topic`.
pub fn partition_of_manifest(topic: &str, key: &str) -> Option<u32> {
    key.strip_prefix(TOPICS_PREFIX)?
        .strip_prefix(topic)?
        .strip_prefix('/')?
        .strip_suffix(".manifest.json")?
        .parse()
        .ok()
}

/// `topics/{topic}/subs/`: every subscription's ledgers.
pub fn subscriptions_prefix(topic: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/subs/")
}

/// `topics/{topic}/subs/{subscription}/{id}/`: the ledgers of one creation of a
/// subscription (its id): those of a deleted one are never written again, so they can be
/// deleted without racing a new subscription of the same name.
pub fn subscription_prefix(topic: &str, subscription: &str, id: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/subs/{subscription}/{id}/")
}

/// `topics/{topic}/subs/{subscription}/{id}/{partition}.json`: a subscription's ledger on
/// one partition ([`crate::partition::subscription`]).
pub fn subscription_ledger(topic: &str, subscription: &str, id: &str, partition: u32) -> String {
    format!("{TOPICS_PREFIX}{topic}/subs/{subscription}/{id}/{partition}.json")
}

/// `topics/{topic}/subs/{subscription}/{id}/{partition}/`: the intents of a subscription's
/// ledger on one partition ([`crate::partition::intent`]).
pub fn ledger_intents(topic: &str, subscription: &str, id: &str, partition: u32) -> String {
    format!("{TOPICS_PREFIX}{topic}/subs/{subscription}/{id}/{partition}/")
}

/// An object of one creation of a subscription, as its key names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionObject<'a> {
    /// The subscription's name.
    pub name: &'a str,
    /// The creation's id.
    pub id: &'a str,
    /// The intent's id, for an intent of one of its ledgers; `None` for a ledger.
    pub intent: Option<&'a str>,
}

/// What `key` is, if it is a subscription's ledger or ledger intent under `topic`.
pub fn subscription_object<'a>(topic: &str, key: &'a str) -> Option<SubscriptionObject<'a>> {
    let rest = key
        .strip_prefix(TOPICS_PREFIX)?
        .strip_prefix(topic)?
        .strip_prefix("/subs/")?;
    let mut parts = rest.split('/');
    let (name, id, file) = (parts.next()?, parts.next()?, parts.next()?);
    let intent = match (parts.next(), parts.next()) {
        (None, None) if file.ends_with(".json") => None,
        (Some(intent), None) if !intent.is_empty() => Some(intent),
        _ => return None,
    };
    Some(SubscriptionObject { name, id, intent })
}

/// `topics/{topic}/{partition}/segments/{id}`.
pub fn segment(topic: &str, partition: u32, id: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/{partition}/segments/{id}")
}

/// `topics/{topic}/{partition}/segments/`: where a partition's segments are listed.
pub fn segments_prefix(topic: &str, partition: u32) -> String {
    format!("{TOPICS_PREFIX}{topic}/{partition}/segments/")
}

/// `topics/{topic}/{partition}/indexes/{id}`: an immutable index object (ids as
/// [`segment_id`]).
pub fn index(topic: &str, partition: u32, id: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/{partition}/indexes/{id}")
}

/// `topics/{topic}/{partition}/checkpoints/{version}`: an immutable copy of the manifest
/// as of `version` (20 digits, so keys sort by version), kept as the way back from a
/// corrupt manifest (docs/design.md §7).
pub fn checkpoint(topic: &str, partition: u32, version: u64) -> String {
    format!("{}{version:020}", checkpoints_prefix(topic, partition))
}

/// `topics/{topic}/{partition}/checkpoints/`: where a partition's checkpoints are listed.
pub fn checkpoints_prefix(topic: &str, partition: u32) -> String {
    format!("{TOPICS_PREFIX}{topic}/{partition}/checkpoints/")
}

/// The manifest version a checkpoint key names.
pub fn checkpoint_version(key: &str) -> Option<u64> {
    key.rsplit_once('/')?.1.parse().ok()
}

/// `topics/{topic}/{partition}/dedup/{id}`: an immutable chunk of remembered idempotency
/// keys (ids as [`segment_id`]).
pub fn dedup_chunk(topic: &str, partition: u32, id: &str) -> String {
    format!("{TOPICS_PREFIX}{topic}/{partition}/dedup/{id}")
}

/// A segment id: the write time (ms, 13 digits, so ids sort by age) and a unique part.
/// Garbage collection reads the age back with [`segment_time`].
pub fn segment_id(now_ms: u64, unique: &str) -> String {
    format!("{now_ms:013}-{unique}")
}

/// When the segment with this id was written, if the id carries a time.
pub fn segment_time(id: &str) -> Option<u64> {
    id.split_once('-').and_then(|(t, _)| t.parse().ok())
}

/// The topic name in a key `topics/{topic}/topic.json`, if that is what `key` is.
pub fn topic_of_settings_key(key: &str) -> Option<&str> {
    key.strip_prefix(TOPICS_PREFIX)?
        .strip_suffix("/topic.json")
        .filter(|t| !t.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_keys_sort_by_version() {
        let k = checkpoint("orders", 2, 48);
        assert_eq!(k, "topics/orders/2/checkpoints/00000000000000000048");
        assert!(k.starts_with(&checkpoints_prefix("orders", 2)));
        assert_eq!(checkpoint_version(&k), Some(48));
        assert!(checkpoint("o", 0, 9) < checkpoint("o", 0, 10));
    }

    #[test]
    fn keys_are_pinned() {
        assert_eq!(topic_settings("orders"), "topics/orders/topic.json");
        assert_eq!(manifest("orders", 1, 3), "topics/orders/3/manifest.json");
        assert_eq!(
            manifest("orders", LAYOUT_FLAT, 3),
            "topics/orders/3.manifest.json"
        );
        assert_eq!(
            partition_of_manifest("orders", "topics/orders/3.manifest.json"),
            Some(3)
        );
        assert_eq!(
            partition_of_manifest("orders", "topics/orders.x/3.manifest.json"),
            None
        );
        assert_eq!(
            partition_of_manifest("orders", "topics/orders/topic.json"),
            None
        );
        assert_eq!(segment("orders", 0, "abc"), "topics/orders/0/segments/abc");
        assert_eq!(index("orders", 0, "abc"), "topics/orders/0/indexes/abc");
        assert_eq!(dedup_chunk("orders", 0, "abc"), "topics/orders/0/dedup/abc");
        assert_eq!(topic_prefix("orders"), "topics/orders/");
        assert_eq!(segment_id(1_795_953_600_000, "abc"), "1795953600000-abc");
        assert_eq!(segment_time("1795953600000-abc"), Some(1_795_953_600_000));
        assert_eq!(segment_time("abc"), None);
        assert_eq!(
            topic_of_settings_key("topics/orders/topic.json"),
            Some("orders")
        );
        assert_eq!(topic_of_settings_key("topics/orders/0/manifest.json"), None);
    }

    #[test]
    fn topic_names() {
        for ok in [
            "a",
            "orders",
            "A.b_c-1",
            &"x".repeat(200),
            "a..",
            "_x",
            "-x",
        ] {
            assert!(validate_topic(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "...",
            ".tmp",
            ".tmp-x",
            ".lock",
            ".hidden",
            "a/b",
            "a b",
            &"x".repeat(201),
            "é",
            "a%2F",
        ] {
            assert!(validate_topic(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_subscriptions_ledgers_and_their_intents_are_told_apart() {
        let ledger = subscription_ledger("t", "s", "id1", 3);
        let intent = format!(
            "{}1700000000000-abc-ia1.2",
            ledger_intents("t", "s", "id1", 3)
        );
        fn of(k: &str) -> Option<SubscriptionObject<'_>> {
            subscription_object("t", k)
        }
        assert_eq!(
            of(&ledger),
            Some(SubscriptionObject {
                name: "s",
                id: "id1",
                intent: None
            })
        );
        assert_eq!(
            of(&intent).and_then(|o| o.intent),
            Some("1700000000000-abc-ia1.2")
        );
        assert_eq!(of(&ledger).map(|o| o.id), of(&intent).map(|o| o.id));
        for other in [
            "topics/t/subs/s/id1/3",
            "topics/t/subs/s/id1/3/",
            "topics/t/subs/s/id1/3/x/y",
            "topics/t/0/manifest.json",
            "topics/u/subs/s/id1/3.json",
        ] {
            assert_eq!(of(other), None, "{other}");
        }
    }
}
