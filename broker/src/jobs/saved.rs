//! Grants kept across a restart of gpushared, each kind in a file of its own (root's, mode
//! 0600) written whenever one starts or ends and read back when gpushared starts: the Slurm
//! jobs running here (beside the control socket; a job Slurm says has ended meanwhile is not
//! restored), and Kubernetes containers' shares (in `pods/`, whose directories the containers
//! have mounted: a container's socket comes back in its own directory).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gpushare_protocol::job::{JobGpu, JobStart, PodIdentity};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The file's name, in the control socket's directory.
pub const FILE: &str = "slurm-jobs.toml";
/// The containers' file's name, in `pods/`.
pub const PODS_FILE: &str = "pods.toml";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    #[serde(default)]
    jobs: Vec<JobStart>,
}

/// A Kubernetes container's shares, as kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPod {
    pub job: u64,
    pub gpus: Vec<JobGpu>,
    /// The pod that holds them, once the kubelet plugin said so.
    pub pod: Option<PodIdentity>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedPods {
    #[serde(default)]
    pods: Vec<SavedPod>,
}

/// Where the jobs of the broker listening on `socket` are kept.
pub fn path_for(socket: &Path) -> PathBuf {
    socket.parent().unwrap_or(Path::new("/")).join(FILE)
}

/// Writes `jobs` to `path` whole (a new file renamed over the old one): a reader never sees
/// half of it. No jobs: the file goes.
pub fn save(path: &Path, jobs: Vec<JobStart>) -> std::io::Result<()> {
    let empty = jobs.is_empty();
    write(path, &Saved { jobs }, empty)
}

/// The jobs kept at `path`; none when there is no file. A file that does not read is an error
/// (the caller says so and goes on without it).
pub fn load(path: &Path) -> std::io::Result<Vec<JobStart>> {
    Ok(read::<Saved>(path)?.unwrap_or_default().jobs)
}

/// As [`save`], for containers' shares.
pub fn save_pods(path: &Path, pods: Vec<SavedPod>) -> std::io::Result<()> {
    let empty = pods.is_empty();
    write(path, &SavedPods { pods }, empty)
}

/// As [`load`], for containers' shares.
pub fn load_pods(path: &Path) -> std::io::Result<Vec<SavedPod>> {
    Ok(read::<SavedPods>(path)?.unwrap_or_default().pods)
}

fn write(path: &Path, value: &impl Serialize, empty: bool) -> std::io::Result<()> {
    if empty {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let text = toml::to_string(value).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("toml.new");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn read<T: DeserializeOwned>(path: &Path) -> std::io::Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    toml::from_str(&text)
        .map(Some)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::job::JobGpu;

    use super::*;

    #[test]
    fn jobs_read_back_as_written_and_none_leaves_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = path_for(&dir.path().join("gpushare.sock"));
        assert!(load(&path).expect("no file").is_empty());
        let jobs = vec![
            JobStart {
                job: 12,
                uid: 1000,
                user: "alice".into(),
                gpus: vec![JobGpu {
                    gpu: 0,
                    shards: Some(3),
                }],
                partition: Some("interactive".into()),
                qos: None,
            },
            JobStart {
                job: 13,
                uid: 1001,
                user: "bob".into(),
                gpus: vec![JobGpu {
                    gpu: 1,
                    shards: None,
                }],
                partition: None,
                qos: Some("scavenger".into()),
            },
        ];
        save(&path, jobs.clone()).expect("save");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load(&path).expect("load"), jobs);
        save(&path, Vec::new()).expect("save none");
        assert!(!path.exists());
        std::fs::write(&path, "jobs = 7").expect("write");
        assert!(
            load(&path).is_err(),
            "a file that does not read is an error"
        );
    }

    #[test]
    fn containers_shares_read_back_as_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(PODS_FILE);
        assert!(load_pods(&path).expect("no file").is_empty());
        let pods = vec![
            SavedPod {
                job: 1 << 40,
                gpus: vec![JobGpu {
                    gpu: 0,
                    shards: Some(8),
                }],
                pod: None,
            },
            SavedPod {
                job: (1 << 40) + 1,
                gpus: vec![JobGpu {
                    gpu: 1,
                    shards: Some(2),
                }],
                pod: Some(PodIdentity {
                    namespace: "ml-prod".into(),
                    pod: "trainer-0".into(),
                    container: "main".into(),
                    service_account: Some("trainer".into()),
                }),
            },
        ];
        save_pods(&path, pods.clone()).expect("save");
        assert_eq!(load_pods(&path).expect("load"), pods);
        save_pods(&path, Vec::new()).expect("save none");
        assert!(!path.exists());
    }
}
