//! Binding the control socket: a live broker's socket is never taken over, a stale one (left by
//! a broker that died) is removed, and the new one gets the configured mode and group.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio_seqpacket::UnixSeqpacketListener;
use tracing::info;

use crate::config::BrokerConfig;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("another gpushared is already serving on {0}")]
    AlreadyRunning(PathBuf),
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    #[error("cannot create the socket directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the socket's directory {0} does not exist: create it, or give --socket a path in an existing directory"
    )]
    NoDirectory(PathBuf),
    #[error("cannot remove stale socket {path}: {source}")]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set permissions of {path}: {source}")]
    Permissions {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("unknown socket group `{0}`")]
    UnknownGroup(String),
}

/// Whether something accepts connections on `path` right now.
fn socket_is_live(path: &Path) -> bool {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let Ok(addr) = UnixAddr::new(path) else {
        return false;
    };
    connect(fd.as_raw_fd(), &addr).is_ok()
}

/// Binds the control socket: refuses to steal a live broker's socket, removes a stale one.
pub fn bind(config: &BrokerConfig) -> Result<UnixSeqpacketListener, BindError> {
    let path = &config.socket;
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        // The default directory is the broker's own (systemd's RuntimeDirectory makes it
        // too). Any other is the user's choice, and a typo in it must not become a directory
        // nobody looks in.
        if Path::new(gpushare_protocol::DEFAULT_SOCKET_PATH).parent() != Some(dir) {
            return Err(BindError::NoDirectory(dir.into()));
        }
        std::fs::create_dir_all(dir).map_err(|source| BindError::Directory {
            path: dir.into(),
            source,
        })?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket(path.clone()));
        }
        if socket_is_live(path) {
            return Err(BindError::AlreadyRunning(path.clone()));
        }
        std::fs::remove_file(path).map_err(|source| BindError::RemoveStale {
            path: path.clone(),
            source,
        })?;
        info!(socket = %path.display(), "removed stale socket left by an earlier broker");
    }
    let listener = UnixSeqpacketListener::bind(path).map_err(|source| BindError::Bind {
        path: path.clone(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(config.socket_mode)).map_err(
        |source| BindError::Permissions {
            path: path.clone(),
            source,
        },
    )?;
    if let Some(group) = &config.socket_group {
        let gid = nix::unistd::Group::from_name(group)
            .ok()
            .flatten()
            .ok_or_else(|| BindError::UnknownGroup(group.clone()))?
            .gid;
        nix::unistd::chown(path, None, Some(gid)).map_err(|e| BindError::Permissions {
            path: path.clone(),
            source: e.into(),
        })?;
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, socket};

    fn config_at(path: PathBuf) -> BrokerConfig {
        BrokerConfig {
            socket: path,
            socket_mode: 0o600,
            ..BrokerConfig::default()
        }
    }

    /// Leaves a socket file at `path` that nobody listens on, as a broker that died does.
    fn stale_socket(path: &Path) {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        let addr = UnixAddr::new(path).expect("socket path");
        nix::sys::socket::bind(fd.as_raw_fd(), &addr).expect("bind");
        drop(fd);
        assert!(path.exists(), "closing a bound socket leaves its file");
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_by_a_live_one_with_the_configured_mode() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gpushare.sock");
        stale_socket(&path);
        assert!(!socket_is_live(&path));

        let _listener = bind(&config_at(path.clone())).expect("a stale socket is replaced");
        assert!(socket_is_live(&path), "the new socket accepts connections");
        let mode = std::fs::metadata(&path)
            .expect("socket file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn a_live_brokers_socket_is_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gpushare.sock");
        let _first = bind(&config_at(path.clone())).expect("first broker binds");

        match bind(&config_at(path.clone())) {
            Err(BindError::AlreadyRunning(p)) => assert_eq!(p, path),
            other => panic!("expected AlreadyRunning, got {:?}", other.map(|_| ())),
        }
        assert!(socket_is_live(&path), "the first broker still serves");
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_not_removed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gpushare.sock");
        std::fs::write(&path, b"precious").expect("write");

        match bind(&config_at(path.clone())) {
            Err(BindError::NotASocket(p)) => assert_eq!(p, path),
            other => panic!("expected NotASocket, got {:?}", other.map(|_| ())),
        }
        assert_eq!(std::fs::read(&path).expect("still there"), b"precious");
    }

    #[tokio::test]
    async fn a_socket_in_a_missing_directory_is_refused_not_created() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("run/gpushare");
        let path = missing.join("gpushare.sock");

        match bind(&config_at(path.clone())) {
            Err(e @ BindError::NoDirectory(_)) => {
                assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}")
            }
            other => panic!("expected NoDirectory, got {:?}", other.map(|_| ())),
        }
        assert!(!dir.path().join("run").exists(), "nothing was created");
    }

    #[tokio::test]
    async fn an_unknown_socket_group_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = BrokerConfig {
            socket_group: Some("gpushare-no-such-group".into()),
            ..config_at(dir.path().join("gpushare.sock"))
        };

        match bind(&config) {
            Err(e @ BindError::UnknownGroup(_)) => {
                assert_eq!(
                    e.to_string(),
                    "unknown socket group `gpushare-no-such-group`"
                )
            }
            other => panic!("expected UnknownGroup, got {:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn nothing_at_a_path_is_not_live() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(!socket_is_live(&dir.path().join("absent.sock")));
    }
}
