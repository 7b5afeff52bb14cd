//! The conformance suite every [`Store`] backend must pass.
//!
//! Call [`run_all`] with a store and a prefix no other test uses; every check writes
//! only below that prefix. Each check panics with a message naming the broken rule, so
//! the suite is meant to be called from a `#[tokio::test]`.
//!
//! The suite ends with a race: `WRITERS` tasks each CAS-increment one counter until
//! they have landed `INCREMENTS` writes; the counter must end at exactly the number of
//! successful writes, which proves that `put_if_match` is a real compare-and-swap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use bytes::Bytes;

use crate::store::{DynStore, ETag, Store, StoreError};

/// Concurrent writers in the race check.
pub const WRITERS: usize = 8;
/// Successful increments each writer lands in the race check.
pub const INCREMENTS: usize = 10;

/// Runs every conformance check against `store`, using keys under `prefix`.
pub async fn run_all(store: DynStore, prefix: &str) {
    let p = prefix.trim_end_matches('/');
    get_missing_is_none(&*store, p).await;
    put_if_absent_creates_once(&*store, p).await;
    put_if_match_is_compare_and_swap(&*store, p).await;
    put_if_match_on_missing_is_not_found(&*store, p).await;
    get_if_changed_is_conditional(&*store, p).await;
    delete_is_idempotent(&*store, p).await;
    list_by_prefix(&*store, p).await;
    binary_content_round_trips(&*store, p).await;
    cas_race(store.clone(), p).await;
    create_race(store, p).await;
}

async fn get_missing_is_none(s: &dyn Store, p: &str) {
    let got = s.get(&format!("{p}/missing/key")).await.unwrap();
    assert!(got.is_none(), "get of a missing key must be None");
}

async fn put_if_absent_creates_once(s: &dyn Store, p: &str) {
    let key = format!("{p}/absent/a.json");
    let etag = s
        .put_if_absent(&key, Bytes::from_static(b"one"))
        .await
        .unwrap();
    let got = s
        .get(&key)
        .await
        .unwrap()
        .expect("created object must be readable");
    assert_eq!(&got.data[..], b"one");
    assert_eq!(got.etag, etag, "get must return the ETag put returned");
    let again = s.put_if_absent(&key, Bytes::from_static(b"two")).await;
    assert!(
        matches!(again, Err(StoreError::Conflict)),
        "second put_if_absent must be Conflict, got {again:?}"
    );
    let got = s.get(&key).await.unwrap().unwrap();
    assert_eq!(
        &got.data[..],
        b"one",
        "a failed put_if_absent must not change the object"
    );
}

async fn put_if_match_is_compare_and_swap(s: &dyn Store, p: &str) {
    let key = format!("{p}/cas/m.json");
    let e1 = s
        .put_if_absent(&key, Bytes::from_static(b"v1"))
        .await
        .unwrap();
    let e2 = s
        .put_if_match(&key, Bytes::from_static(b"v2"), &e1)
        .await
        .unwrap();
    assert_ne!(e1, e2, "different content must get a different ETag");
    let stale = s.put_if_match(&key, Bytes::from_static(b"v3"), &e1).await;
    assert!(
        matches!(stale, Err(StoreError::Conflict)),
        "put_if_match with a stale ETag must be Conflict, got {stale:?}"
    );
    let got = s.get(&key).await.unwrap().unwrap();
    assert_eq!(&got.data[..], b"v2");
    assert_eq!(got.etag, e2);
    let bogus = s
        .put_if_match(&key, Bytes::from_static(b"v4"), &ETag::new("\"nonsense\""))
        .await;
    assert!(
        matches!(bogus, Err(StoreError::Conflict)),
        "put_if_match with an unknown ETag must be Conflict, got {bogus:?}"
    );
}

async fn put_if_match_on_missing_is_not_found(s: &dyn Store, p: &str) {
    let key = format!("{p}/cas/never-created.json");
    let r = s
        .put_if_match(&key, Bytes::from_static(b"x"), &ETag::new("abc"))
        .await;
    assert!(
        matches!(r, Err(StoreError::NotFound)),
        "put_if_match on a missing key must be NotFound, got {r:?}"
    );
    assert!(
        s.get(&key).await.unwrap().is_none(),
        "it must not create the key"
    );
}

async fn get_if_changed_is_conditional(s: &dyn Store, p: &str) {
    use crate::store::Fetched;
    let key = format!("{p}/cond/x");
    assert!(matches!(
        s.get_if_changed(&key, &ETag::new("abc")).await.unwrap(),
        Fetched::Missing
    ));
    let e1 = s
        .put_if_absent(&key, Bytes::from_static(b"1"))
        .await
        .unwrap();
    assert!(
        matches!(
            s.get_if_changed(&key, &e1).await.unwrap(),
            Fetched::Unchanged
        ),
        "same ETag must be Unchanged"
    );
    let e2 = s
        .put_if_match(&key, Bytes::from_static(b"2"), &e1)
        .await
        .unwrap();
    match s.get_if_changed(&key, &e1).await.unwrap() {
        Fetched::Object(o) => {
            assert_eq!(&o.data[..], b"2");
            assert_eq!(o.etag, e2);
        }
        other => panic!("a changed object must be returned, got {other:?}"),
    }
}

async fn delete_is_idempotent(s: &dyn Store, p: &str) {
    let key = format!("{p}/del/x");
    s.put_if_absent(&key, Bytes::from_static(b"x"))
        .await
        .unwrap();
    s.delete(&key).await.unwrap();
    assert!(
        s.get(&key).await.unwrap().is_none(),
        "deleted key must be gone"
    );
    s.delete(&key).await.unwrap();
    s.put_if_absent(&key, Bytes::from_static(b"y"))
        .await
        .expect("a deleted key can be created again");
}

async fn list_by_prefix(s: &dyn Store, p: &str) {
    for k in ["b/2", "a/1", "a/2", "ab/3", "c"] {
        s.put_if_absent(&format!("{p}/list/{k}"), Bytes::from_static(b"."))
            .await
            .unwrap();
    }
    let got = s.list(&format!("{p}/list/a/")).await.unwrap();
    assert_eq!(got, vec![format!("{p}/list/a/1"), format!("{p}/list/a/2")]);
    let got = s.list(&format!("{p}/list/")).await.unwrap();
    let want: Vec<String> = ["a/1", "a/2", "ab/3", "b/2", "c"]
        .iter()
        .map(|k| format!("{p}/list/{k}"))
        .collect();
    assert_eq!(
        got, want,
        "list must return every key under the prefix, sorted"
    );
    assert!(s.list(&format!("{p}/nothing/")).await.unwrap().is_empty());
    list_after_pages(s, p).await;
}

/// `list_after`: strictly after the given key, in order, at most `max`, only the prefix.
async fn list_after_pages(s: &dyn Store, p: &str) {
    let pre = format!("{p}/list/a/");
    assert_eq!(
        s.list_after(&pre, "1", 10).await.unwrap(),
        vec![format!("{p}/list/a/2")],
        "list_after must start strictly after the key and stay within the prefix"
    );
    assert_eq!(
        s.list_after(&pre, "", 1).await.unwrap(),
        vec![format!("{p}/list/a/1")],
        "list_after must return at most max keys, the first ones"
    );
    assert!(s.list_after(&pre, "2", 10).await.unwrap().is_empty());
    let list = format!("{p}/list/");
    let gone = format!("{p}/list/gone/x");
    s.put_if_absent(&gone, Bytes::from_static(b"."))
        .await
        .unwrap();
    s.delete(&gone).await.unwrap();
    // Without this a store may keep listing the emptied folder for a while (SeaweedFS).
    s.delete_folders(&format!("{p}/list/gone/"), std::slice::from_ref(&gone))
        .await
        .unwrap();
    assert_eq!(
        s.list_dirs(&list, "", 10).await.unwrap(),
        vec!["a", "ab", "b"],
        "list_dirs: the names with keys below them, not plain objects nor deleted folders"
    );
    assert_eq!(s.list_dirs(&list, "a", 10).await.unwrap(), vec!["ab", "b"]);
    assert_eq!(s.list_dirs(&list, "", 1).await.unwrap(), vec!["a"]);
    assert!(s.list_dirs(&list, "b", 10).await.unwrap().is_empty());
    assert!(s
        .list_dirs(&format!("{p}/nothing/"), "", 10)
        .await
        .unwrap()
        .is_empty());
    // A folder that still holds a key stays.
    s.delete_folders(&list, &[format!("{p}/list/a/9")])
        .await
        .unwrap();
    assert_eq!(
        s.list_dirs(&list, "", 10).await.unwrap(),
        vec!["a", "ab", "b"]
    );
    list_files_with_etags(s, p).await;
    assert_eq!(
        s.list_after(&format!("{p}/list/"), "a/2", 10)
            .await
            .unwrap(),
        vec![
            format!("{p}/list/ab/3"),
            format!("{p}/list/b/2"),
            format!("{p}/list/c")
        ]
    );
}

/// `list_files`: only the objects directly under the prefix, with the ETags `get` answers
/// (the idle watch compares them with cached ones).
async fn list_files_with_etags(s: &dyn Store, p: &str) {
    let list = format!("{p}/list/");
    let d = format!("{p}/list/d");
    s.put_if_absent(&d, Bytes::from_static(b"one"))
        .await
        .unwrap();
    let files = s.list_files(&list).await.unwrap();
    let keys: Vec<&str> = files.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![format!("{p}/list/c"), d.clone()],
        "list_files: the objects directly under the prefix, in order, nothing deeper"
    );
    for f in &files {
        let got = s.get(&f.key).await.unwrap().unwrap();
        assert_eq!(
            f.etag, got.etag,
            "list_files must answer the ETag get answers"
        );
    }
    let before = files[1].etag.clone();
    s.put_if_match(&d, Bytes::from_static(b"two"), &before)
        .await
        .unwrap();
    let after = s.list_files(&list).await.unwrap();
    assert_ne!(after[1].etag, before, "a changed object lists a new ETag");
    s.delete(&d).await.unwrap();
    assert_eq!(s.list_files(&list).await.unwrap().len(), 1);
    assert!(s
        .list_files(&format!("{p}/nothing/"))
        .await
        .unwrap()
        .is_empty());
}

async fn binary_content_round_trips(s: &dyn Store, p: &str) {
    let key = format!("{p}/bin/blob");
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    s.put_if_absent(&key, Bytes::from(data.clone()))
        .await
        .unwrap();
    let got = s.get(&key).await.unwrap().unwrap();
    assert_eq!(
        &got.data[..],
        &data[..],
        "binary content must round-trip exactly"
    );
}

async fn cas_race(store: DynStore, p: &str) {
    let key = Arc::new(format!("{p}/race/counter"));
    store
        .put_if_absent(&key, Bytes::from_static(b"0"))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let store = store.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut landed = 0usize;
            let mut conflicts = 0usize;
            while landed < INCREMENTS {
                let cur = store.get(&key).await.unwrap().unwrap();
                let n: usize = std::str::from_utf8(&cur.data).unwrap().parse().unwrap();
                let next = Bytes::from((n + 1).to_string());
                match store.put_if_match(&key, next, &cur.etag).await {
                    Ok(_) => landed += 1,
                    Err(StoreError::Conflict) => conflicts += 1,
                    Err(e) => panic!("unexpected error in CAS race: {e}"),
                }
            }
            (landed, conflicts)
        }));
    }
    let mut landed = 0;
    for t in tasks {
        landed += t.await.unwrap().0;
    }
    let fin = store.get(&key).await.unwrap().unwrap();
    let n: usize = std::str::from_utf8(&fin.data).unwrap().parse().unwrap();
    assert_eq!(landed, WRITERS * INCREMENTS);
    assert_eq!(
        n, landed,
        "the counter must equal the number of successful CAS writes"
    );
}

async fn create_race(store: DynStore, p: &str) {
    let key = Arc::new(format!("{p}/race/create-once"));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let store = store.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            store
                .put_if_absent(&key, Bytes::from(format!("writer-{i}")))
                .await
        }));
    }
    let mut winners = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(_) => winners.push(i),
            Err(StoreError::Conflict) => {}
            Err(e) => panic!("unexpected error in create race: {e}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one put_if_absent must win, got {winners:?}"
    );
    let got = store.get(&key).await.unwrap().unwrap();
    assert_eq!(got.data, Bytes::from(format!("writer-{}", winners[0])));
}

/// What [`race_rounds`] saw: rounds run, and rounds of each kind with exactly one winner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaceRounds {
    /// Rounds of each kind.
    pub rounds: usize,
    /// `put_if_absent` rounds in which exactly one of the writers created the key.
    pub create_one_winner: usize,
    /// `put_if_match` rounds in which exactly one of the writers replaced the object.
    pub replace_one_winner: usize,
}

/// `rounds` rounds of two races among [`WRITERS`] concurrent writers, each on a fresh key:
/// all create it with `put_if_absent`, then all replace it with `put_if_match` on the same
/// ETag. A round counts when exactly one writer wins, every other one gets `Conflict`, and the
/// object holds the winner's bytes. Panics on any other error; the caller asserts the counts.
pub async fn race_rounds(store: DynStore, prefix: &str, rounds: usize) -> RaceRounds {
    let p = prefix.trim_end_matches('/');
    let mut seen = RaceRounds {
        rounds,
        create_one_winner: 0,
        replace_one_winner: 0,
    };
    for round in 0..rounds {
        let key = Arc::new(format!("{p}/rounds/{round}"));
        let created = race_once(&store, &key, None).await;
        if created.is_some() {
            seen.create_one_winner += 1;
        }
        let current = store.get(&key).await.unwrap().expect("the race created it");
        if race_once(&store, &key, Some(current.etag)).await.is_some() {
            seen.replace_one_winner += 1;
        }
    }
    seen
}

/// One race: [`WRITERS`] tasks write `key` at once (`put_if_absent`, or `put_if_match` on
/// `etag`). `Some(winner)` when exactly one won and the object holds its bytes.
async fn race_once(store: &DynStore, key: &Arc<String>, etag: Option<ETag>) -> Option<usize> {
    let barrier = Arc::new(tokio::sync::Barrier::new(WRITERS));
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let (store, key, etag, barrier) =
            (store.clone(), key.clone(), etag.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let data = Bytes::from(format!("writer-{i}-{}", etag.is_some()));
            barrier.wait().await;
            match &etag {
                None => store.put_if_absent(&key, data).await,
                Some(e) => store.put_if_match(&key, data, e).await,
            }
        }));
    }
    let mut winners = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(_) => winners.push(i),
            Err(StoreError::Conflict) => {}
            Err(e) => panic!("unexpected error in a race on {key}: {e}"),
        }
    }
    let [winner] = winners[..] else {
        println!("race on {key}: winners {winners:?}");
        return None;
    };
    let got = store.get(key).await.unwrap().expect("the winner's object");
    let want = format!("writer-{winner}-{}", etag.is_some());
    (got.data == want.as_bytes()).then_some(winner)
}
