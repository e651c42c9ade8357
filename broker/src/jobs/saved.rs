//! Slurm jobs' grants kept across a restart of gpushared: the jobs running here, written to a
//! file beside the control socket (root's, mode 0600) whenever one starts or ends, and read
//! back when gpushared starts. A job Slurm says has ended meanwhile is not restored.
//! (Kubernetes containers' shares are not kept: their sockets go with the broker.)

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gpushare_protocol::job::JobStart;
use serde::{Deserialize, Serialize};

/// The file's name, in the control socket's directory.
pub const FILE: &str = "slurm-jobs.toml";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    #[serde(default)]
    jobs: Vec<JobStart>,
}

/// Where the jobs of the broker listening on `socket` are kept.
pub fn path_for(socket: &Path) -> PathBuf {
    socket.parent().unwrap_or(Path::new("/")).join(FILE)
}

/// Writes `jobs` to `path` whole (a new file renamed over the old one): a reader never sees
/// half of it. No jobs: the file goes.
pub fn save(path: &Path, jobs: Vec<JobStart>) -> std::io::Result<()> {
    if jobs.is_empty() {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let text = toml::to_string(&Saved { jobs }).map_err(std::io::Error::other)?;
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

/// The jobs kept at `path`; none when there is no file. A file that does not read is an error
/// (the caller says so and goes on without it).
pub fn load(path: &Path) -> std::io::Result<Vec<JobStart>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let saved: Saved = toml::from_str(&text).map_err(std::io::Error::other)?;
    Ok(saved.jobs)
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
}
