//! Serving the router on a TCP listener with connection hygiene (docs/design.md §1,
//! "Limits"): `narad serve`, the benchmark's in-process server and the test servers all
//! run this loop.
//!
//! * **Header and idle timeout** (`NARAD_HEADER_TIMEOUT_MS`): a connection that has not
//!   sent a whole request head within it is closed, whether it is new, sending headers
//!   slowly, or idle between kept-alive requests (hyper starts the timer whenever it waits
//!   for a request head).
//! * **Body deadline** (`NARAD_BODY_TIMEOUT_MS`): see [`super::admission`].
//! * **Connection limit** (`NARAD_MAX_CONNECTIONS`, lowered to half of what the
//!   file-descriptor limit leaves after a reserve, so the store's own files and sockets
//!   always fit): a connection over it is answered 503 with `Retry-After` once its
//!   request begins to arrive (after 100 ms when it sends nothing, as an idle socket
//!   does not) and closed within 200 ms. At most half as many refusals run at once; while they are all busy
//!   the loop stops accepting for a moment (the kernel's backlog holds new connections),
//!   so descriptors never run out, and every connection, a health check included, gets an
//!   answer even while idle sockets fill every slot (the idle timeout closes those).
//! * HTTP/1.1 only: h2c upgrades and prior-knowledge HTTP/2 are not spoken.
//! * Optional TLS ([`super::tls`]): the handshake must finish within the header timeout;
//!   a TLS connection over the limit is closed without an answer (an answer would cost a
//!   handshake).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::ClientAddr;
use crate::config::HttpOptions;

/// File descriptors kept free for the store, logs and the listener itself.
const FD_RESERVE: u64 = 64;

/// How long a refused connection is kept open for its answer to be read.
const REFUSE_WITHIN: Duration = Duration::from_millis(200);
/// How long a refused connection that has sent nothing is waited on before it is closed:
/// long enough for a client that sends its request right after connecting to get it in
/// on a loaded machine (closed with its request unread, it would get a reset instead of
/// the answer), short enough that idle sockets free their refusal slots quickly.
const QUIET_PEER: Duration = Duration::from_millis(100);

/// How long connections may finish their requests after shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);

/// The answer to a connection over the limit.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 84\r\n\r\n{\"error\":{\"code\":\"server_busy\",\"message\":\"too many open connections; retry later\"}}\n";

/// The connection limit: `configured`, lowered to fit the process's file-descriptor
/// limit: each connection may need a second descriptor for the store while it is served,
/// and refusals (half as many) need one each.
pub fn connection_limit(configured: usize) -> usize {
    let fds = fd_limit();
    let fit = (fds.saturating_sub(FD_RESERVE) * 2 / 5).max(1);
    configured.min(usize::try_from(fit).unwrap_or(usize::MAX))
}

/// The soft limit on open files, raised to the hard limit first where allowed.
fn fd_limit() -> u64 {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let mut l = getrlimit(Resource::Nofile);
        if l.current != l.maximum {
            let raised = rustix::process::Rlimit {
                current: l.maximum,
                maximum: l.maximum,
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                l = raised;
            }
        }
        l.current.unwrap_or(u64::MAX)
    }
    #[cfg(not(unix))]
    {
        u64::MAX
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections
/// finish their requests for up to [`DRAIN`].
///
/// Errors: none after startup (accept errors such as running out of descriptors are
/// logged and retried after a pause).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    opts: &HttpOptions,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let limit = connection_limit(opts.max_connections);
    tracing::info!(max_connections = limit, "accepting connections");
    let slots = Arc::new(Semaphore::new(limit));
    let refusals = Arc::new(Semaphore::new((limit / 2).max(1)));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .keep_alive(true);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    let mut last_error_log: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                    tracing::warn!(error = %e, "accept failed; pausing");
                    last_error_log = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Refusals are bounded too: while they are all busy, accepting pauses (the
            // listen backlog holds the rest), so every connection gets an answer.
            if tls.is_none() {
                if let Ok(r) = refusals.clone().acquire_owned().await {
                    tokio::spawn(refuse(stream, r));
                }
            }
            continue;
        };
        // The failed-login throttle counts per client address.
        let app = app.clone().layer(Extension(ClientAddr(peer.ip())));
        let (builder, stop, tls) = (builder.clone(), stop_rx.clone(), tls.clone());
        let handshake = opts.header_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let _ = stream.set_nodelay(true);
            match tls {
                None => connection(TokioIo::new(stream), app, builder, stop).await,
                Some(acceptor) => {
                    if let Ok(Ok(s)) =
                        tokio::time::timeout(handshake, acceptor.accept(stream)).await
                    {
                        connection(TokioIo::new(s), app, builder, stop).await;
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a slot: all slots free means all connections ended.
    let all = u32::try_from(limit).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN, slots.acquire_many(all)).await;
}

/// Serves one connection until it ends, or gracefully once `stop` turns true.
async fn connection<I>(io: I, app: Router, builder: http1::Builder, mut stop: watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// Answers a connection over the limit with 503 and closes it within [`REFUSE_WITHIN`].
/// The answer goes out once the client's request has begun to arrive (or after
/// [`QUIET_PEER`] of silence, as from an idle socket): a client sent an answer before it
/// wrote its request takes it for a broken connection, not a 503. Then what the client
/// sends is drained until it closes, so that it reads the answer rather than a reset.
async fn refuse(mut stream: TcpStream, _slot: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(REFUSE_WITHIN, async {
        let mut buf = [0u8; 1024];
        let sent = matches!(
            tokio::time::timeout(QUIET_PEER, stream.read(&mut buf)).await,
            Ok(Ok(n)) if n > 0
        );
        let _ = stream.write_all(BUSY).await;
        let _ = stream.shutdown().await;
        // A peer that sent nothing (an idle socket) is closed at once: with nothing
        // unread, the close is a clean FIN, and the slot frees for the next refusal. One
        // that sent a request is drained until it closes, so its answer is not lost to a
        // reset.
        if sent {
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        }
    })
    .await;
}
