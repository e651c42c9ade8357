//! The `/metrics` endpoint: hyper's HTTP/1 server (request parsing, keep-alive, header limits
//! and timeouts are what hyper gets right and a hand-written parser would have to relearn),
//! with a cap on connections and on each connection's life.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpushare_protocol::stats::StatusReport;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::exposition::CONTENT_TYPE_TEXT;
use super::render;

/// Connections served at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 32;
/// Read buffer per connection, which bounds a request's head (hyper's minimum is 8 KiB).
const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// A client must send a request's head within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed after this, keep-alive or not, so none holds a slot forever.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// Serves `/metrics` on `addr` until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    snapshot: impl Fn() -> StatusReport + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    serve_on(listener, move || render(&snapshot()), shutdown).await
}

/// Serves `/metrics` on a bound listener (bind first to report a busy address at start-up,
/// or to test on port 0); `body` renders the page for each scrape.
pub async fn serve_on(
    listener: TcpListener,
    body: impl Fn() -> String + Send + Sync + 'static,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let body = Arc::new(body);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            slot = slots.clone().acquire_owned() => {
                // The semaphore is never closed, so this only fails if that changes.
                let Ok(slot) = slot else { break };
                let (stream, peer) = tokio::select! {
                    () = &mut shutdown => break,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors and the like: wait rather than spin.
                            warn!(error = %e, "metrics endpoint cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                let body = body.clone();
                connections.spawn(async move {
                    let _slot = slot;
                    let service = hyper::service::service_fn(move |req| {
                        let body = body.clone();
                        async move { Ok::<_, Infallible>(respond(&req, || body())) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .max_buf_size(MAX_REQUEST_HEAD)
                        .serve_connection(TokioIo::new(stream), service);
                    match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                        Ok(Err(e)) => debug!(%peer, error = %e, "metrics connection failed"),
                        Err(_) => debug!(%peer, "metrics connection closed at its time limit"),
                        Ok(Ok(())) => {}
                    }
                });
            }
        }
    }
    Ok(())
}

fn respond(req: &Request<Incoming>, body: impl FnOnce() -> String) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD are allowed on /metrics\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = Response::new(Full::new(Bytes::from(body())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::testing::{parse, report, value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One request on a fresh connection; the whole response as text.
    async fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn serves_metrics_over_http_and_survives_garbage() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_on(listener, || render(&report()), async {
            let _ = stopped.await;
        }));

        let ok = get(
            addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        let (head, body) = ok.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert_eq!(value(&parse(body), "gpushare_clients", &[]), 2.0);

        // Two requests on one keep-alive connection.
        let two = b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        assert_eq!(get(addr, two).await.matches("HTTP/1.1 200 OK").count(), 2);

        assert!(
            get(
                addr,
                b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .await
            .starts_with("HTTP/1.1 404")
        );
        let post = get(
            addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let head = get(
            addr,
            b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(
            head.starts_with("HTTP/1.1 200") && !head.contains("# HELP"),
            "{head}"
        );

        // Garbage, binary, and a head larger than the limit: an error or a close, never a crash.
        let garbage = get(addr, b"\x00\xff\r\n\r\nnot http at all\r\n\r\n").await;
        assert!(
            garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
            "{garbage}"
        );
        let mut huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
        huge.extend_from_slice(b"\r\n\r\n");
        let big = get(addr, &huge).await;
        assert!(
            big.is_empty() || big.starts_with("HTTP/1.1 431"),
            "{}",
            &big[..big.len().min(200)]
        );
        // A client that connects and says nothing does not block others.
        let _silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let again = get(addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(
            again.starts_with("HTTP/1.0 200") || again.starts_with("HTTP/1.1 200"),
            "{again}"
        );

        let _ = stop.send(());
        let done = tokio::time::timeout(Duration::from_secs(5), server).await;
        assert!(
            matches!(done, Ok(Ok(Ok(())))),
            "server stops on shutdown: {done:?}"
        );
    }
}
