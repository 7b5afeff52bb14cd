//! Test hooks, built only with the `test-hooks` feature (the test run's Worker, never a
//! deployed one): what the project's HTTP suite needs from a server it runs against from
//! outside, as it runs against the Lambda function (tests/src/lib.rs, "external mode").
//!
//! - **The store.** Tests look at and damage stored objects. Against the Lambda function
//!   they open the same S3 bucket; a local R2 is reachable only through a Worker, so
//!   `/_test/store/…` serves the storage contract over HTTP
//!   (`narad_tests::worker_store`): `object?key=K` (GET with an optional `If-None-Match`,
//!   PUT with `If-None-Match: *` or `If-Match`, DELETE), and `keys?prefix=P`,
//!   `after?prefix=P&after=A&max=N`, `dirs?prefix=P&after=A&max=N` and `files?prefix=P`,
//!   each a JSON list. A failed condition answers 412, a replace of a missing key 404.
//! - **The clock.** Tests move the server's time (lease expiry, retention). A Worker reads
//!   no file, so each request may carry `x-narad-test-now` (ms since the epoch), which sets
//!   the time of the object that serves it until the next one says otherwise.
//! - **Another object.** `x-narad-test-object: S` sends a request to the object named as
//!   usual with `#S` appended, so that several objects, each with a broker of its own, serve
//!   one topic at once: what two Worker instances on one bucket would be (two `wrangler dev`
//!   processes cannot share one local R2: docs/edge.md).

use std::sync::Arc;

use bytes::Bytes;
use narad_shared::clock::{Clock, ManualClock, SystemClock};
use narad_shared::store::local::LocalStore;
use narad_shared::store::{ETag, Fetched, StoreError};
use worker::{Env, Request, Response};

use crate::r2::R2Store;

/// The header a test sets the time with.
pub(crate) const NOW_HEADER: &str = "x-narad-test-now";

/// A Durable Object's clock in the test Worker: the wall clock until a request sets it.
pub(crate) fn clock() -> ManualClock {
    ManualClock::new(SystemClock.now_ms())
}

/// Sets `clock` from `req`'s [`NOW_HEADER`], if it has one.
pub(crate) fn set_time(clock: &ManualClock, req: &Request) {
    let now = req
        .headers()
        .get(NOW_HEADER)
        .ok()
        .flatten()
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(ms) = now {
        clock.set(ms);
    }
}

/// The header that picks another object for a request.
pub(crate) const OBJECT_HEADER: &str = "x-narad-test-object";

/// Appends `#S` to `name` when `req` carries [`OBJECT_HEADER`]` S`.
pub(crate) fn choose_object(name: &mut String, req: &Request) {
    if let Some(s) = req.headers().get(OBJECT_HEADER).ok().flatten() {
        if !s.is_empty() {
            name.push('#');
            name.push_str(&s);
        }
    }
}

/// Serves `/_test/store/…`; `None` for any other path.
pub(crate) async fn store(req: &mut Request, env: &Env) -> Option<worker::Result<Response>> {
    let url = req.url().ok()?;
    let op = url.path().strip_prefix("/_test/store/")?.to_owned();
    let q = |name: &str| {
        url.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    let bucket = match env.bucket(crate::BUCKET_BINDING) {
        Ok(b) => b,
        Err(e) => return Some(Err(e)),
    };
    let prefix = env
        .var(crate::PREFIX_VAR)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let store = Arc::new(R2Store::new(bucket, &prefix));
    let max = q("max").parse::<usize>().unwrap_or(1000);
    let headers = req.headers().clone();
    let header = |name: &str| headers.get(name).ok().flatten();
    let answer = match (op.as_str(), req.method()) {
        ("object", worker::Method::Get) => match header("if-none-match") {
            Some(tag) => match store.get_if_changed(&q("key"), &ETag::new(tag)).await {
                Ok(Fetched::Unchanged) => status(304),
                Ok(Fetched::Missing) => status(404),
                Ok(Fetched::Object(o)) => object(o.data, &o.etag),
                Err(e) => Err(e),
            },
            None => match store.get(&q("key")).await {
                Ok(Some(o)) => object(o.data, &o.etag),
                Ok(None) => status(404),
                Err(e) => Err(e),
            },
        },
        ("object", worker::Method::Put) => {
            let body = match req.bytes().await {
                Ok(b) => Bytes::from(b),
                Err(e) => return Some(Err(e)),
            };
            let written = match header("if-match") {
                Some(tag) => store.put_if_match(&q("key"), body, &ETag::new(tag)).await,
                None => store.put_if_absent(&q("key"), body).await,
            };
            written.map(|etag| tagged(200, &etag))
        }
        ("object", worker::Method::Delete) => {
            store.delete(&q("key")).await.map(|()| Answer::Status(204))
        }
        ("keys", worker::Method::Get) => store.list(&q("prefix")).await.map(json),
        ("after", worker::Method::Get) => store
            .list_after(&q("prefix"), &q("after"), max)
            .await
            .map(json),
        ("dirs", worker::Method::Get) => store
            .list_dirs(&q("prefix"), &q("after"), max)
            .await
            .map(json),
        ("files", worker::Method::Get) => store.list_files(&q("prefix")).await.map(|files| {
            json(
                files
                    .into_iter()
                    .map(|l| (l.key, l.etag.as_str().to_owned()))
                    .collect::<Vec<_>>(),
            )
        }),
        _ => status(404),
    };
    Some(respond(answer))
}

/// What a hook answers before it becomes a response: a status, or a body too.
enum Answer {
    Status(u16),
    Body {
        status: u16,
        etag: Option<String>,
        body: Vec<u8>,
    },
}

fn status(s: u16) -> Result<Answer, StoreError> {
    Ok(Answer::Status(s))
}

fn object(data: Bytes, etag: &ETag) -> Result<Answer, StoreError> {
    Ok(Answer::Body {
        status: 200,
        etag: Some(etag.as_str().to_owned()),
        body: data.to_vec(),
    })
}

fn tagged(status: u16, etag: &ETag) -> Answer {
    Answer::Body {
        status,
        etag: Some(etag.as_str().to_owned()),
        body: Vec::new(),
    }
}

fn json(v: impl serde::Serialize) -> Answer {
    Answer::Body {
        status: 200,
        etag: None,
        body: serde_json::to_vec(&v).unwrap_or_default(),
    }
}

/// The store's answer as HTTP: its errors as 412 (conflict), 404 (not found), 503
/// (unavailable) or 500.
fn respond(answer: Result<Answer, StoreError>) -> worker::Result<Response> {
    match answer {
        Ok(Answer::Status(s)) => Ok(Response::empty()?.with_status(s)),
        Ok(Answer::Body { status, etag, body }) => {
            let mut r = Response::from_bytes(body)?.with_status(status);
            if let Some(tag) = etag {
                r.headers_mut().set("etag", &tag)?;
            }
            Ok(r)
        }
        Err(StoreError::Conflict) => Ok(Response::empty()?.with_status(412)),
        Err(StoreError::NotFound) => Ok(Response::empty()?.with_status(404)),
        Err(StoreError::Unavailable(e)) => Response::error(e.to_string(), 503),
        Err(e) => Response::error(e.to_string(), 500),
    }
}
