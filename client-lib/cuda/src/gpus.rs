//! The GPUs a program sees and the one its work runs on. Under `gpushare run --gpus N`
//! (`GPUSHARE_GPUS`: gpushared's indices, in the program's device order) a process sees N
//! devices: each answers queries (name, attributes, PCI bus, UUID) and peer questions, and
//! the process runs its work on one, its local rank's as launchers of one process per GPU
//! set it (torchrun's and Accelerate's `LOCAL_RANK`, Slurm's `SLURM_LOCALID`, Open MPI's
//! `OMPI_COMM_WORLD_LOCAL_RANK`, MPICH's `MPI_LOCALRANKID`), else the first. That is how a
//! data-parallel job (PyTorch DDP, one process per GPU) uses them; the other devices'
//! primary contexts answer for their device and take peer access, and refuse work
//! (`CUDA_ERROR_INVALID_DEVICE`, said once: `crate::context`).
//! Otherwise a program sees one device, the GPU gpushared serves it on.

use gpushare_conn::env::GPUS_ENV;
use gpushare_protocol::control::DeviceInfo;

/// The devices a program sees, by ordinal, and the one it runs on.
#[derive(Debug, Clone)]
pub struct Gpus {
    pub visible: Vec<DeviceInfo>,
    /// The ordinal of the device the process's work runs on.
    pub bound: usize,
    /// Pairs of gpushared's GPU indices where the first reaches the second's memory.
    pub peers: Vec<(u32, u32)>,
    /// Whether the process is one rank of a job of one process per GPU (its launcher set a
    /// local rank): its peer access needs nothing of gpushared (`crate::peer`).
    pub rank: bool,
}

impl Gpus {
    /// One device, the GPU the session runs on.
    pub fn one(device: DeviceInfo) -> Gpus {
        Gpus {
            visible: vec![device],
            bound: 0,
            peers: Vec::new(),
            rank: false,
        }
    }

    /// The device the process runs its work on (`bound` is always one it sees).
    pub fn bound_device(&self) -> &DeviceInfo {
        &self.visible[self.bound]
    }

    /// The device with ordinal `dev`, if the program sees it.
    pub fn get(&self, dev: i32) -> Option<&DeviceInfo> {
        usize::try_from(dev).ok().and_then(|i| self.visible.get(i))
    }

    /// Whether a program on device `dev` may map memory of device `peer` (both seen, not the
    /// same): peer access as the program is told of it (`cuDeviceCanAccessPeer`, the P2P
    /// attribute, `cuCtxEnablePeerAccess`).
    pub fn reaches(&self, dev: i32, peer: i32) -> bool {
        match (self.get(dev), self.get(peer)) {
            (Some(a), Some(b)) if dev != peer => self.peers.contains(&(a.index, b.index)),
            _ => false,
        }
    }
}

/// `GPUSHARE_GPUS` naming two or more GPUs: gpushared's indices, in order.
pub fn listed() -> Option<Result<Vec<u32>, String>> {
    let text = std::env::var(GPUS_ENV).ok()?;
    let parsed: Result<Vec<u32>, _> = text.split(',').map(|s| s.trim().parse::<u32>()).collect();
    Some(match parsed {
        Ok(list) if list.len() >= 2 => Ok(list),
        Ok(_) => return None,
        Err(_) => Err(format!("{GPUS_ENV}={text:?} is not a list of GPU indices")),
    })
}

/// The launchers' local rank variables, the first set wins.
const LOCAL_RANK: [&str; 4] = [
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
];

/// The process's local rank, as its launcher set it (name and value).
pub fn local_rank() -> Option<(&'static str, usize)> {
    LOCAL_RANK.iter().find_map(|&name| {
        let v = std::env::var(name).ok()?;
        v.trim().parse().ok().map(|r| (name, r))
    })
}

/// Which of `count` devices a process of local rank `rank` runs on, and why there.
pub fn choose(count: usize, rank: Option<(&str, usize)>) -> (usize, String) {
    match rank {
        Some((name, r)) if r < count => (r, format!("{name}={r}")),
        Some((name, r)) => (
            0,
            format!("{name}={r} names no device of the {count} it sees: the first"),
        ),
        None => (0, "no local rank set: the first".into()),
    }
}

/// The devices of `list` among gpushared's GPUs, and which reach which; the process runs on
/// device `bound` of them.
pub fn resolve(socket: &std::path::Path, list: &[u32], bound: usize) -> Result<Gpus, String> {
    let report = gpushare_conn::ControlSocket::monitor(socket)
        .and_then(|(monitor, _)| monitor.status(1))
        .map_err(|e| format!("cannot ask gpushared for its GPUs: {e}"))?;
    let visible = list
        .iter()
        .map(|&i| {
            report
                .devices
                .iter()
                .find(|d| d.index == i)
                .cloned()
                .ok_or_else(|| format!("gpushared has no GPU {i}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Gpus {
        visible,
        bound,
        peers: report.peers,
        rank: local_rank().is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_runs_on_its_local_ranks_device_else_the_first() {
        assert_eq!(choose(2, Some(("LOCAL_RANK", 1))).0, 1);
        assert_eq!(choose(2, Some(("SLURM_LOCALID", 0))).0, 0);
        let (dev, why) = choose(2, Some(("LOCAL_RANK", 5)));
        assert_eq!(dev, 0);
        assert!(why.contains("names no device"), "{why}");
        assert_eq!(choose(3, None).0, 0);
    }
}
