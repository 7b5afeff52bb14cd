//! Admission of request bodies: a process-wide budget of body bytes, and a deadline for
//! receiving each body (docs/design.md §1, "Limits").
//!
//! Every request that carries a body reserves its size from one budget
//! (`NARAD_MAX_BODY_BUFFER_BYTES`) before anything reads it, and holds the reservation
//! until its response is ready: the declared `Content-Length`, or for a chunked body the
//! most any route accepts. A request the budget cannot hold now gets 503
//! `server_busy` with `Retry-After`, so many large bodies at once cost a retry, never
//! unbounded memory. A body that does not arrive within `NARAD_BODY_TIMEOUT_MS` fails its
//! read (the handler answers 408), so a slow sender cannot hold a reservation for long.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Semaphore;

use super::limits::MAX_BATCH_BODY;
use super::ApiError;

/// Budget accounting unit: reservations are rounded up to whole KiB.
const UNIT: usize = 1024;

/// The process-wide body budget and the body deadline.
#[derive(Clone)]
pub(super) struct Admission {
    budget: Arc<Semaphore>,
    /// The budget in units.
    total: usize,
    /// The most a chunked body (no `Content-Length`) is reserved for.
    chunked: usize,
    timeout: Duration,
}

impl Admission {
    /// A budget of `bytes`, bodies due within `timeout`; a chunked body reserves
    /// `largest` (the most any route reads).
    pub(super) fn new(bytes: usize, timeout: Duration, largest: usize) -> Self {
        let total = (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Self {
            budget: Arc::new(Semaphore::new(total)),
            total,
            chunked: largest.max(MAX_BATCH_BODY),
            timeout,
        }
    }

    /// Bytes `req` must reserve: 0 when it carries no body.
    fn wanted(&self, req: &Request) -> usize {
        let h = req.headers();
        match h
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            // A body over every route's limit is refused (413) before it is read.
            Some(n) => (n.min(self.chunked as u64 + 1)) as usize,
            None if h.contains_key(header::TRANSFER_ENCODING) => self.chunked,
            None => 0,
        }
    }
}

/// Reserves the request's body from the budget for the whole request, and puts a deadline
/// on receiving it.
pub(super) async fn admit(a: &Admission, req: Request, next: Next) -> Response {
    let bytes = a.wanted(&req);
    if bytes == 0 {
        return next.run(req).await;
    }
    let units = bytes.div_ceil(UNIT).min(a.total) as u32;
    let Ok(permit) = a.budget.clone().try_acquire_many_owned(units) else {
        tracing::warn!(bytes, "request body budget exhausted; answering 503");
        return ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                "too many request bodies in flight; retry later",
            )
        }
        .into_response();
    };
    let (parts, body) = req.into_parts();
    let body = Body::new(Deadline {
        inner: body,
        sleep: Box::pin(crate::runtime::sleep(a.timeout)),
    });
    let response = next.run(Request::from_parts(parts, body)).await;
    drop(permit);
    response
}

/// The error a body read fails with after the deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub(super) struct BodyTimeout;

/// Whether `e` (a body read's error, possibly wrapped) is a [`BodyTimeout`].
pub(super) fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<BodyTimeout>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A body that fails with [`BodyTimeout`] once its deadline passes.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<crate::runtime::Sleep>>,
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimeout)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
