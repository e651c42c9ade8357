//! A node's `GRES=` in `scontrol show job -d`: what the job holds of each GPU there.
//!
//! Slurm writes one entry per GRES name and type, comma-separated (slurmctld's
//! `gres_ctld_job_build_details`, 22.05; `gres_stepmgr.c` later):
//! - `gpu:2(IDX:0-1)`, `gpu:h200:1(IDX:3)`: the count, then the indices of the devices in
//!   gres.conf's order (a bitmap as `bit_fmt` prints it: `0-1,3`);
//! - `shard:3(IDX:0)`: the shards' count on the node and the GPUs they come from (22.05 takes
//!   a job's shards on a node from one GPU);
//! - `shard:5(3/8,2/8)` (24.05 and later): shards held / shards there, for each GPU in order;
//! - `gpu(CNT:2)`: a count without devices, when gres.conf gives the GRES no `File=`.

use std::collections::BTreeMap;

use gpushare::JobGpu;

/// Why a `GRES=` value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GresError {
    /// Slurm printed something this parser does not know.
    Unreadable(String),
    /// A GPU GRES without device indices: gres.conf lacks `File=`.
    NoIndices(String),
}

impl std::fmt::Display for GresError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GresError::Unreadable(entry) => write!(f, "cannot read the GRES entry `{entry}`"),
            GresError::NoIndices(entry) => write!(
                f,
                "Slurm gives `{entry}` without device indices: give the gpu and shard lines of gres.conf File= (the GPU's device file), so that gpushare knows which GPU it is"
            ),
        }
    }
}

/// The GPUs a node's `GRES=` value gives the job, by index, each whole (`shards: None`) or
/// as shards. Other GRES (`mps`, licenses, NICs) are left out.
pub fn gpus(value: &str) -> Result<Vec<JobGpu>, GresError> {
    // Index -> shards (None: the whole GPU).
    let mut held: BTreeMap<u32, Option<u32>> = BTreeMap::new();
    for entry in entries(value) {
        let unreadable = || GresError::Unreadable(entry.to_string());
        let (head, detail) = match entry.split_once('(') {
            Some((head, rest)) => (head, rest.strip_suffix(')').ok_or_else(unreadable)?),
            None => (entry, ""),
        };
        let mut fields = head.split(':');
        let name = fields.next().unwrap_or("");
        if name != "gpu" && name != "shard" {
            continue;
        }
        if detail.starts_with("CNT:") {
            return Err(GresError::NoIndices(entry.to_string()));
        }
        // `name[:type]:count`: the count is the last field.
        let count: u32 = head
            .rsplit(':')
            .next()
            .and_then(|c| c.parse().ok())
            .filter(|_| head.contains(':'))
            .ok_or_else(unreadable)?;
        let per_gpu: Vec<(u32, u32)> = if let Some(list) = detail.strip_prefix("IDX:") {
            let indices = indices(list).ok_or_else(unreadable)?;
            if name == "gpu" {
                indices.into_iter().map(|i| (i, 0)).collect()
            } else {
                spread(count, &indices)
            }
        } else if name == "shard" && detail.contains('/') {
            held_of_each(detail).ok_or_else(unreadable)?
        } else {
            return Err(unreadable());
        };
        for (gpu, shards) in per_gpu {
            if name == "gpu" {
                held.insert(gpu, None);
            } else if shards > 0 {
                let slot = held.entry(gpu).or_insert(Some(0));
                if let Some(s) = slot {
                    *s = s.saturating_add(shards);
                }
            }
        }
    }
    Ok(held
        .into_iter()
        .map(|(gpu, shards)| JobGpu { gpu, shards })
        .collect())
}

/// The entries of a `GRES=` value: split at commas outside parentheses.
fn entries(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in value.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out.into_iter().filter(|e| !e.is_empty()).collect()
}

/// The indices of a bitmap as `bit_fmt` prints it: `0`, `0-1,3`. Empty: none.
fn indices(list: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for range in list.split(',').filter(|r| !r.is_empty()) {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let (lo, hi): (u32, u32) = (lo.parse().ok()?, hi.parse().ok()?);
        // A node has a handful of GPUs; a longer range is not a GPU list.
        if hi < lo || hi - lo > 1024 {
            return None;
        }
        out.extend(lo..=hi);
    }
    Some(out)
}

/// `count` shards over `indices` as evenly as can be, the first ones taking what is left
/// over. Slurm 22.05 names one GPU; should it name several, this is as good a guess as any,
/// and the total is right.
fn spread(count: u32, indices: &[u32]) -> Vec<(u32, u32)> {
    let n = u32::try_from(indices.len()).unwrap_or(u32::MAX);
    if n == 0 {
        return Vec::new();
    }
    let (each, extra) = (count / n, count % n);
    indices
        .iter()
        .zip(0u32..)
        .map(|(&gpu, k)| (gpu, each + u32::from(k < extra)))
        .collect()
}

/// `3/8,0/8,2/8`: the shards held of each GPU, in index order.
fn held_of_each(detail: &str) -> Option<Vec<(u32, u32)>> {
    detail
        .split(',')
        .zip(0u32..)
        .map(|(pair, gpu)| {
            let (held, _there) = pair.split_once('/')?;
            Some((gpu, held.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(gpu: u32) -> JobGpu {
        JobGpu { gpu, shards: None }
    }

    fn shards(gpu: u32, n: u32) -> JobGpu {
        JobGpu {
            gpu,
            shards: Some(n),
        }
    }

    #[test]
    fn shards_of_one_gpu() {
        assert_eq!(gpus("shard:3(IDX:0)"), Ok(vec![shards(0, 3)]));
        assert_eq!(gpus("shard:8(IDX:2)"), Ok(vec![shards(2, 8)]));
    }

    #[test]
    fn whole_gpus_typed_or_not() {
        assert_eq!(gpus("gpu:2(IDX:0-1)"), Ok(vec![whole(0), whole(1)]));
        assert_eq!(gpus("gpu:h200:1(IDX:3)"), Ok(vec![whole(3)]));
        assert_eq!(
            gpus("gpu:3(IDX:0,2-3)"),
            Ok(vec![whole(0), whole(2), whole(3)])
        );
        assert_eq!(
            gpus("gpu:a100:1(IDX:0),gpu:v100:1(IDX:2)"),
            Ok(vec![whole(0), whole(2)])
        );
    }

    #[test]
    fn gpus_and_shards_together_and_other_gres_left_out() {
        assert_eq!(
            gpus("gpu:1(IDX:0),shard:2(IDX:1),mps:50(IDX:2),nic:1(IDX:0)"),
            Ok(vec![whole(0), shards(1, 2)])
        );
        assert_eq!(gpus(""), Ok(vec![]));
        assert_eq!(gpus("(null)"), Ok(vec![]));
    }

    #[test]
    fn shards_over_several_gpus() {
        // Only a total: spread, the first taking the rest.
        assert_eq!(
            gpus("shard:5(IDX:0-1)"),
            Ok(vec![shards(0, 3), shards(1, 2)])
        );
        // Slurm 24.05 and later say how many of each.
        assert_eq!(
            gpus("shard:5(3/8,0/8,2/8)"),
            Ok(vec![shards(0, 3), shards(2, 2)])
        );
    }

    #[test]
    fn counts_without_devices_and_nonsense_are_errors() {
        assert!(matches!(gpus("gpu(CNT:2)"), Err(GresError::NoIndices(_))));
        assert!(matches!(gpus("shard(CNT:4)"), Err(GresError::NoIndices(_))));
        assert!(matches!(
            gpus("gpu:x(IDX:0)"),
            Err(GresError::Unreadable(_))
        ));
        assert!(matches!(gpus("gpu(IDX:0)"), Err(GresError::Unreadable(_))));
        assert!(matches!(gpus("gpu:1(IDX:0"), Err(GresError::Unreadable(_))));
        assert!(matches!(
            gpus("gpu:1(IDX:a)"),
            Err(GresError::Unreadable(_))
        ));
        assert!(matches!(gpus("gpu:1"), Err(GresError::Unreadable(_))));
        assert!(matches!(
            gpus("gpu:1(IDX:0-99999)"),
            Err(GresError::Unreadable(_))
        ));
    }
}
