//! The policy file the tour writes, and what the broker's log says became of its SM partition.
//!
//! Case 3 runs the priority policy with `lower_depth = 1` on every device. On a GPU it also
//! sets `lower_sm_share`: there the trainer's kernels each fill every SM, and CUDA's stream
//! priorities already put the interactive client's blocks first under FIFO, so holding the
//! trainer's queued kernels back adds nothing (docs/benchmarks.md, "The demo tour on the
//! H100"). Only SMs no trainer block can occupy would help, which a hardware partition (a CUDA
//! green context) gives. The sim device cannot partition SMs, so the tour leaves the setting
//! out there rather than claim a measurement of something that did not happen.

use std::fmt;

/// The memory quota the tour's policy gives this user.
pub const QUOTA: u64 = 256 << 20;

/// The trainer runs on half the SMs: the interactive client finds the other half free of the
/// trainer's blocks, and the trainer still keeps half the GPU.
pub const DEFAULT_LOWER_SM_SHARE: f64 = 0.5;

/// The priority policy's settings in the tour's policy file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Priority {
    /// Kernels the trainer may keep on the device beside the interactive client.
    pub lower_depth: u32,
    /// The share of the SMs the trainer runs on (a hardware partition); `None`: all of them.
    pub lower_sm_share: Option<f64>,
}

impl Priority {
    /// What the tour sets before it knows the device (cases 1 and 2 run FIFO, which reads
    /// none of it).
    pub const PLAIN: Priority = Priority {
        lower_depth: 1,
        lower_sm_share: None,
    };

    /// Case 3's settings on `backend`, as the broker's status names it (`"cuda"` or `"sim"`).
    pub fn for_backend(backend: &str, lower_sm_share: f64) -> Priority {
        Priority {
            lower_sm_share: (backend == "cuda").then_some(lower_sm_share),
            ..Priority::PLAIN
        }
    }
}

/// `lower_depth 1, lower_sm_share 0.5`, for the tour's output.
impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lower_depth {}", self.lower_depth)?;
        if let Some(share) = self.lower_sm_share {
            write!(f, ", lower_sm_share {share}")?;
        }
        Ok(())
    }
}

/// The policy file: `scheduler`, `priority`'s settings, and this user (`uid`) allowed every
/// class with the tour's quota.
pub fn policy(scheduler: &str, priority: Priority, uid: u32) -> String {
    let mut text = format!(
        "# gpushare-demo tour: this user may use every class; each client asks for its own.\n\
         scheduler = \"{scheduler}\"\n\
         # Beside the interactive client the trainer keeps one kernel on the device, not two.\n\
         [priority]\n\
         lower_depth = {}\n",
        priority.lower_depth
    );
    if let Some(share) = priority.lower_sm_share {
        // `{:?}` keeps the decimal point (`1.0`, not `1`): the field is a float.
        text.push_str(&format!(
            "# It runs on this share of the SMs (a hardware partition); the rest are left to the\n\
             # interactive client.\n\
             lower_sm_share = {share:?}\n"
        ));
    }
    text.push_str(&format!(
        "[[users]]\n\
         uid = {uid}\n\
         class = \"high\"\n\
         memory_quota = {QUOTA}\n"
    ));
    text
}

/// What became of `lower_sm_share` on a GPU of `sms` SMs, from the broker's log: whether the
/// trainer ran on a partition, and of how many SMs, or why not.
pub fn partition_note(log: &str, sms: u32) -> String {
    let whole = "the trainer ran on the whole GPU, so the priority row measures lower_depth alone";
    if log.contains("no SM partitions on this GPU") {
        return format!(
            "this GPU cannot make SM partitions (green contexts need CUDA 12.4 and a recent \
             driver): {whole}"
        );
    }
    if let Some(line) = log.lines().find(|l| l.contains("SM partition made")) {
        // `… SM partition made (green context) asked=66 sms=64`
        let made = line
            .split("sms=")
            .nth(1)
            .map(|rest| rest.chars().take_while(char::is_ascii_digit).collect())
            .and_then(|n: String| n.parse::<u32>().ok());
        return match made {
            Some(n) => format!(
                "under priority the trainer ran on an SM partition of {n} of the {sms} SMs (a \
                 green context): no trainer block could take the other {}",
                sms.saturating_sub(n)
            ),
            None => "under priority the trainer ran on an SM partition (a green context)".into(),
        };
    }
    if log.contains("cannot make an SM partition") {
        return format!("the driver would not make the SM partition: {whole}");
    }
    format!("the broker's log shows no SM partition made: {whole}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_a_gpu_case_3_runs_the_trainer_on_a_partition() {
        let p = Priority::for_backend("cuda", DEFAULT_LOWER_SM_SHARE);
        assert_eq!(p.to_string(), "lower_depth 1, lower_sm_share 0.5");
        assert_eq!(
            policy("priority", p, 1000),
            "# gpushare-demo tour: this user may use every class; each client asks for its own.\n\
             scheduler = \"priority\"\n\
             # Beside the interactive client the trainer keeps one kernel on the device, not two.\n\
             [priority]\n\
             lower_depth = 1\n\
             # It runs on this share of the SMs (a hardware partition); the rest are left to the\n\
             # interactive client.\n\
             lower_sm_share = 0.5\n\
             [[users]]\n\
             uid = 1000\n\
             class = \"high\"\n\
             memory_quota = 268435456\n"
        );
        // A whole share is still written as a float.
        let whole = Priority::for_backend("cuda", 1.0);
        assert!(policy("priority", whole, 0).contains("lower_sm_share = 1.0\n"));
    }

    #[test]
    fn on_the_sim_device_case_3_sets_no_partition() {
        let p = Priority::for_backend("sim", DEFAULT_LOWER_SM_SHARE);
        assert_eq!(p, Priority::PLAIN);
        assert_eq!(p.to_string(), "lower_depth 1");
        assert_eq!(
            policy("priority", p, 1000),
            "# gpushare-demo tour: this user may use every class; each client asks for its own.\n\
             scheduler = \"priority\"\n\
             # Beside the interactive client the trainer keeps one kernel on the device, not two.\n\
             [priority]\n\
             lower_depth = 1\n\
             [[users]]\n\
             uid = 1000\n\
             class = \"high\"\n\
             memory_quota = 268435456\n"
        );
    }

    #[test]
    fn the_note_says_what_became_of_the_partition() {
        let made = "2025-01-01T00:00:00Z  INFO gpushare_broker::device::cuda::partition: SM \
                    partition made (green context) asked=66 sms=64\n";
        assert_eq!(
            partition_note(made, 132),
            "under priority the trainer ran on an SM partition of 64 of the 132 SMs (a green \
             context): no trainer block could take the other 68"
        );
        let none = "INFO gpushare_broker::device::cuda::partition: no SM partitions on this GPU \
                    (green contexts need CUDA 12.4 and a recent driver); …\n";
        assert!(partition_note(none, 132).starts_with("this GPU cannot make SM partitions"));
        let refused = "WARN …: cannot make an SM partition; running on the whole GPU sms=64\n";
        assert!(partition_note(refused, 132).starts_with("the driver would not make"));
        assert!(partition_note("", 132).contains("no SM partition made"));
        for note in [none, refused, ""].map(|log| partition_note(log, 132)) {
            assert!(note.ends_with("measures lower_depth alone"), "{note}");
        }
    }
}
