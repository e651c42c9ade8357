//! Which GPU a consolidated program runs on, decided before it starts so that everything in
//! it agrees: gpushare's CUDA driver asks gpushared for that GPU (`GPUSHARE_GPU`), gpushare's
//! NVML shows only it (`GPUSHARE_GPU_UUIDS`), and `CUDA_VISIBLE_DEVICES` names it by UUID, which
//! is what PyTorch checks its NVML device count against (an index there would name a device
//! NVML no longer shows).
//!
//! The program's ask, first that says: `--gpu N` or `GPUSHARE_GPU` (gpushared's index; a Slurm
//! task prolog sets it), then `CUDA_VISIBLE_DEVICES` (an index in CUDA's order, PCI bus order
//! under `CUDA_DEVICE_ORDER=PCI_BUS_ID`, or a UUID or a unique prefix of one; naming several
//! makes a job of one process per GPU over them, in the order named, as `--gpus` does), else
//! the GPU gpushared would place it on now, the least loaded by measured load.

use std::ffi::OsString;
use std::path::Path;

use gpushare::StatusReport;
use gpushare_conn::env;
use gpushare_protocol::control::DeviceInfo;

use super::EnvChange;

/// Where the program runs, and why there.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// gpushared's index.
    pub gpu: u32,
    pub uuid: String,
    pub why: String,
}

impl Placement {
    /// The program's environment for it.
    pub fn changes(&self) -> Vec<EnvChange> {
        vec![
            EnvChange::Set(env::GPU_ENV, self.gpu.to_string().into()),
            EnvChange::Set(env::GPU_UUIDS_ENV, OsString::from(&self.uuid)),
            EnvChange::Set("CUDA_VISIBLE_DEVICES", OsString::from(&self.uuid)),
        ]
    }
}

/// What the program asked for, read from the command line and the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ask {
    /// gpushared's index (`--gpu`, else `GPUSHARE_GPU`), and how it was asked for.
    pub index: Option<(u32, String)>,
    /// `CUDA_VISIBLE_DEVICES`, when set.
    pub visible: Option<String>,
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    pub pci_order: bool,
}

impl Ask {
    pub fn read(gpu: Option<u32>) -> Result<Ask, String> {
        let index = match gpu {
            Some(g) => Some((g, format!("--gpu {g}"))),
            None => match std::env::var(env::GPU_ENV) {
                Ok(v) if !v.trim().is_empty() => Some((
                    v.trim()
                        .parse()
                        .map_err(|_| format!("{}={v:?} is not a GPU index", env::GPU_ENV))?,
                    format!("{}={}", env::GPU_ENV, v.trim()),
                )),
                _ => None,
            },
        };
        Ok(Ask {
            index,
            visible: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            pci_order: std::env::var("CUDA_DEVICE_ORDER")
                .is_ok_and(|o| o.trim().eq_ignore_ascii_case("PCI_BUS_ID")),
        })
    }
}

impl Ask {
    /// The program's `CUDA_VISIBLE_DEVICES` hides every GPU (empty, `-1`): it runs with none,
    /// as under CUDA, unless a GPU is asked for by index.
    pub fn hides_every_gpu(&self) -> bool {
        self.index.is_none() && self.visible.as_deref().is_some_and(env::hides_every_gpu)
    }
}

/// Asks gpushared at `socket` where the program runs. `None` when it cannot be asked (the
/// program's driver then says why at `cuInit`, as without a placement) or the program asked
/// for no GPU.
pub fn place(socket: &Path, ask: &Ask) -> Option<Result<Placement, String>> {
    if ask.hides_every_gpu() {
        return None;
    }
    let report = gpushare::Monitor::connect(socket).ok()?.status().ok()?;
    Some(decide(&report, ask))
}

/// The placement for `ask` on the GPUs of `report`.
pub fn decide(report: &StatusReport, ask: &Ask) -> Result<Placement, String> {
    let devices = &report.devices;
    let serves = || serves(devices);
    let (device, why) = if let Some((index, asked)) = &ask.index {
        let d = devices
            .get(*index as usize)
            .ok_or_else(|| format!("{asked}: gpushared has no such GPU ({})", serves()))?;
        (d, asked.clone())
    } else if let Some(visible) = &ask.visible {
        // Several named are a job (`decide_listed`); a caller placing one takes the first.
        let first = visible.split(',').map(str::trim).next().unwrap_or_default();
        let d = visible_device(devices, first, ask.pci_order)
            .map_err(|e| format!("CUDA_VISIBLE_DEVICES={visible}: {e} ({})", serves()))?;
        (d, format!("CUDA_VISIBLE_DEVICES={visible}"))
    } else {
        let next = report.next_gpu as usize;
        let d = devices
            .get(next)
            .or(devices.first())
            .ok_or("gpushared serves no GPU")?;
        (d, least_loaded_why(report, d.index))
    };
    Ok(Placement {
        gpu: device.index,
        uuid: device.uuid_text(),
        why,
    })
}

/// What gpushared serves, for an error's end.
fn serves(devices: &[DeviceInfo]) -> String {
    match devices.len() {
        1 => "it serves GPU 0".to_string(),
        n => format!("it serves GPUs 0..={}", n - 1),
    }
}

/// The GPUs of a job of one process per GPU (`--gpus N`), and why those.
#[derive(Debug, Clone, PartialEq)]
pub struct Several {
    /// gpushared's indices, in the job's device order.
    pub gpus: Vec<u32>,
    pub uuids: Vec<String>,
    pub why: String,
}

impl Several {
    /// A job on `chosen`, in that order; `why` follows the GPUs' indices.
    fn of(chosen: &[&DeviceInfo], why: &str) -> Several {
        let gpus: Vec<u32> = chosen.iter().map(|d| d.index).collect();
        let names: Vec<String> = gpus.iter().map(u32::to_string).collect();
        Several {
            why: format!("{}: {why}", names.join(", ")),
            gpus,
            uuids: chosen.iter().map(|d| d.uuid_text()).collect(),
        }
    }

    /// The job's environment for them: every process sees them all (`GPUSHARE_GPUS` tells the
    /// driver which it runs on by local rank).
    pub fn changes(&self) -> Vec<EnvChange> {
        let gpus: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
        let uuids = OsString::from(self.uuids.join(","));
        vec![
            EnvChange::Remove(env::GPU_ENV),
            EnvChange::Set(env::GPUS_ENV, OsString::from(gpus.join(","))),
            EnvChange::Set(env::GPU_UUIDS_ENV, uuids.clone()),
            EnvChange::Set("CUDA_VISIBLE_DEVICES", uuids),
        ]
    }
}

/// Asks gpushared at `socket` for the `n` GPUs of a job.
pub fn place_several(socket: &Path, n: usize) -> Result<Several, String> {
    let report = gpushare::Monitor::connect(socket)
        .and_then(|mut m| m.status())
        .map_err(|e| format!("cannot ask gpushared for its GPUs: {e}"))?;
    decide_several(&report, n)
}

/// The `n` least loaded GPUs of `report`, in gpushared's order.
pub fn decide_several(report: &StatusReport, n: usize) -> Result<Several, String> {
    let devices = &report.devices;
    if n > devices.len() {
        return Err(format!(
            "{n} GPUs asked for, gpushared serves {}",
            devices.len()
        ));
    }
    let mut chosen: Vec<&DeviceInfo> = if report.gpu_loads.len() == devices.len() {
        gpushare_protocol::stats::by_load(&report.gpu_loads)
            .into_iter()
            .filter_map(|i| devices.get(i))
            .take(n)
            .collect()
    } else {
        devices.iter().take(n).collect()
    };
    chosen.sort_by_key(|d| d.index);
    let why = if n == devices.len() {
        "all of gpushared's"
    } else {
        "the least loaded"
    };
    Ok(Several::of(&chosen, why))
}

/// The entries of a `CUDA_VISIBLE_DEVICES` that names several GPUs, where no index was asked
/// for: the program then gets a job of them (`decide_listed`).
fn listed_entries(ask: &Ask) -> Option<Vec<&str>> {
    if ask.index.is_some() {
        return None;
    }
    let entries: Vec<&str> = ask
        .visible
        .as_deref()?
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    (entries.len() > 1).then_some(entries)
}

/// Asks gpushared at `socket` for the GPUs a `CUDA_VISIBLE_DEVICES` of several names; `None`
/// when it names one or none (or an index was asked for), or gpushared cannot be asked (as
/// for `place`).
pub fn place_listed(socket: &Path, ask: &Ask) -> Option<Result<Several, String>> {
    listed_entries(ask)?;
    let report = gpushare::Monitor::connect(socket).ok()?.status().ok()?;
    decide_listed(&report, ask)
}

/// A job of one process per GPU over the GPUs `CUDA_VISIBLE_DEVICES` names, in its order
/// (CUDA's device 0 is the first named); `None` when it names one or none.
pub fn decide_listed(report: &StatusReport, ask: &Ask) -> Option<Result<Several, String>> {
    let entries = listed_entries(ask)?;
    let visible = ask.visible.as_deref().unwrap_or_default();
    let devices = &report.devices;
    let mut chosen: Vec<&DeviceInfo> = Vec::with_capacity(entries.len());
    for entry in entries {
        let d = match visible_device(devices, entry, ask.pci_order) {
            Ok(d) => d,
            Err(e) => {
                return Some(Err(format!(
                    "CUDA_VISIBLE_DEVICES={visible}: {e} ({})",
                    serves(devices)
                )));
            }
        };
        if chosen.iter().any(|c| c.index == d.index) {
            return Some(Err(format!(
                "CUDA_VISIBLE_DEVICES={visible} names GPU {} twice",
                d.index
            )));
        }
        chosen.push(d);
    }
    Some(Ok(Several::of(
        &chosen,
        &format!("CUDA_VISIBLE_DEVICES={visible}"),
    )))
}

/// The device one entry of `CUDA_VISIBLE_DEVICES` names.
fn visible_device<'a>(
    devices: &'a [DeviceInfo],
    entry: &str,
    pci_order: bool,
) -> Result<&'a DeviceInfo, String> {
    if let Ok(i) = entry.parse::<usize>() {
        let mut ordered: Vec<&DeviceInfo> = devices.iter().collect();
        if pci_order {
            ordered.sort_by_key(|d| d.pci);
        }
        let order = if pci_order { "PCI bus" } else { "CUDA's" };
        return ordered
            .get(i)
            .copied()
            .ok_or_else(|| format!("no GPU {i} in {order} order"));
    }
    if entry.len() >= 4 && entry[..4].eq_ignore_ascii_case("MIG-") {
        return Err("MIG instances are not served by gpushare".into());
    }
    if entry.len() <= 4 || !entry[..4].eq_ignore_ascii_case("GPU-") {
        return Err(format!("`{entry}` is neither an index nor a GPU UUID"));
    }
    gpushare_protocol::control::device_by_uuid(devices, entry)
}

/// Why the least loaded GPU, with every GPU's load beside it.
fn least_loaded_why(report: &StatusReport, chosen: u32) -> String {
    if report.devices.len() < 2 {
        return "the only GPU".into();
    }
    let loads: Vec<String> = report
        .gpu_loads
        .iter()
        .map(|l| format!("GPU {}: {}", l.gpu, crate::format::gpu_load(l)))
        .collect();
    format!(
        "the least loaded ({}); GPU {chosen} chosen",
        loads.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_protocol::stats::GpuLoad;

    fn device(index: u32, pci_bus: u32, uuid_first: u8) -> DeviceInfo {
        let mut uuid = [0x11; 16];
        uuid[0] = uuid_first;
        DeviceInfo {
            uuid,
            pci: (0, pci_bus, 0),
            ..crate::top::collect::tests::device(index)
        }
    }

    /// Two GPUs whose CUDA order is not their PCI bus order; GPU 1 the less loaded.
    fn report() -> StatusReport {
        let mut r = crate_status();
        r.devices = vec![device(0, 0x41, 0xaa), device(1, 0x01, 0xab)];
        r.gpu_loads = vec![
            GpuLoad {
                gpu: 0,
                busy: 0.9,
                memory_used: 1 << 30,
                clients: 2,
            },
            GpuLoad {
                gpu: 1,
                ..GpuLoad::default()
            },
        ];
        r.next_gpu = 1;
        r
    }

    fn crate_status() -> StatusReport {
        crate::top::collect::tests::report(1_000, Vec::new())
    }

    fn ask(index: Option<u32>, visible: Option<&str>, pci_order: bool) -> Ask {
        Ask {
            index: index.map(|i| (i, format!("--gpu {i}"))),
            visible: visible.map(str::to_string),
            pci_order,
        }
    }

    #[test]
    fn an_index_asked_for_wins_and_must_exist() {
        let p = decide(&report(), &ask(Some(0), Some("1"), false)).expect("placed");
        assert_eq!((p.gpu, p.why.as_str()), (0, "--gpu 0"));
        assert_eq!(p.uuid, "GPU-aa111111-1111-1111-1111-111111111111");
        let e = decide(&report(), &ask(Some(2), None, false)).expect_err("no GPU 2");
        assert_eq!(
            e,
            "--gpu 2: gpushared has no such GPU (it serves GPUs 0..=1)"
        );
    }

    #[test]
    fn visible_devices_by_index_in_cuda_or_pci_order_or_by_uuid() {
        let r = report();
        let gpu =
            |visible: &str, pci: bool| decide(&r, &ask(None, Some(visible), pci)).map(|p| p.gpu);
        assert_eq!(gpu("0", false), Ok(0));
        assert_eq!(gpu("0", true), Ok(1), "GPU 1 is first on the PCI bus");
        assert_eq!(gpu("GPU-ab11", false), Ok(1), "a unique prefix");
        assert_eq!(
            gpu("gpu-AA111111-1111-1111-1111-111111111111", false),
            Ok(0)
        );
        assert_eq!(
            gpu("1,0", false),
            Ok(1),
            "the first, for a caller that places one"
        );
        assert!(gpu("GPU-a", false).is_err_and(|e| e.contains("several")));
        assert!(gpu("GPU-ff", false).is_err_and(|e| e.contains("no GPU has")));
        assert!(gpu("2", false).is_err_and(|e| e.contains("no GPU 2 in CUDA's order")));
        assert!(gpu("MIG-1234", false).is_err_and(|e| e.contains("MIG")));
        assert!(gpu("all", false).is_err());
    }

    #[test]
    fn visible_devices_naming_several_make_a_job_of_them_in_their_order() {
        let r = report();
        let job = |visible: &str, pci: bool| decide_listed(&r, &ask(None, Some(visible), pci));
        let j = job("1,0", false).expect("several").expect("placed");
        assert_eq!(j.gpus, vec![1, 0], "CUDA's device 0 is the first named");
        assert_eq!(j.uuids.len(), 2);
        assert!(j.why.contains("CUDA_VISIBLE_DEVICES=1,0"), "{}", j.why);
        let by_uuid = job("GPU-ab11, 0", false).expect("several").expect("placed");
        assert_eq!(by_uuid.gpus, vec![1, 0]);
        assert_eq!(
            job("0,1", true).expect("several").map(|j| j.gpus),
            Ok(vec![1, 0]),
            "PCI bus order"
        );
        assert!(
            job("0,0", false)
                .expect("several")
                .is_err_and(|e| e.contains("names GPU 0 twice"))
        );
        assert!(
            job("0,7", false)
                .expect("several")
                .is_err_and(|e| e.contains("no GPU 7"))
        );
        assert!(job("1", false).is_none(), "one GPU is a placement");
        assert!(job("", false).is_none());
        assert!(
            decide_listed(&r, &ask(Some(0), Some("0,1"), false)).is_none(),
            "an index asked for wins"
        );
    }

    #[test]
    fn unasked_it_goes_where_gpushared_would_place_it_and_says_why() {
        let p = decide(&report(), &ask(None, None, false)).expect("placed");
        assert_eq!(p.gpu, 1);
        assert!(
            p.why.starts_with("the least loaded (GPU 0: busy 90%"),
            "{}",
            p.why
        );
        assert!(p.why.ends_with("GPU 1 chosen"), "{}", p.why);
        let changes = p.changes();
        assert!(changes.contains(&EnvChange::Set(env::GPU_ENV, "1".into())));
        assert!(changes.contains(&EnvChange::Set(
            "CUDA_VISIBLE_DEVICES",
            "GPU-ab111111-1111-1111-1111-111111111111".into()
        )));
    }
}
