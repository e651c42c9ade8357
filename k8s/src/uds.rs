//! gRPC over Unix sockets, as the kubelet speaks it: a client channel to a socket path, and a
//! socket a server listens on (a stale file from an earlier run removed first).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the gRPC server on `path`. The URI is a placeholder that gRPC requires; the
/// connection goes to the socket.
pub async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    Endpoint::from_static("http://[::1]:1")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Listens on `path`, replacing whatever socket file is there (the kubelet's restart removes
/// it; an earlier run of ours may have left it).
pub fn listen(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}
