//! When a GPU cannot be recovered in place, gpushared restarts: [`Stuck`] says so (and why),
//! and [`Carry`] is what the next image is told about the fault.

use std::sync::Mutex;

use crate::device::Space;

/// What a restart carries over to the next image, by client process id: whose work faulted
/// (refused for a while, so one program cannot restart the broker again and again) and who
/// was a suspect (on probation: its work runs alone, so a second fault names it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carry {
    pub evicted: Vec<i32>,
    pub probation: Vec<i32>,
    /// How long both last, from the restart.
    pub seconds: u64,
}

/// The environment variable a restarting gpushared passes a [`Carry`] in.
pub const CARRY_ENV: &str = "GPUSHARE_FAULT_CARRY";

impl Carry {
    /// `evicted=1,2;probation=3;seconds=60`
    pub fn to_env(&self) -> String {
        let list = |v: &[i32]| v.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
        format!(
            "evicted={};probation={};seconds={}",
            list(&self.evicted),
            list(&self.probation),
            self.seconds
        )
    }

    /// Reads [`Carry::to_env`]'s format; anything malformed is ignored.
    pub fn from_env(text: &str) -> Carry {
        let mut carry = Carry::default();
        for part in text.split(';') {
            let Some((key, value)) = part.split_once('=') else {
                continue;
            };
            let pids = || -> Vec<i32> {
                value
                    .split(',')
                    .filter_map(|p| p.trim().parse().ok())
                    .filter(|p| *p > 0)
                    .collect()
            };
            match key.trim() {
                "evicted" => carry.evicted = pids(),
                "probation" => carry.probation = pids(),
                "seconds" => carry.seconds = value.trim().parse().unwrap_or(0).min(86_400),
                _ => {}
            }
        }
        carry
    }

    pub fn is_empty(&self) -> bool {
        self.evicted.is_empty() && self.probation.is_empty()
    }
}

/// Set when a GPU cannot be recovered in place: the broker must restart (see
/// [`Device::reset_deadline`]). Shared by every GPU's health.
#[derive(Default)]
pub struct Stuck {
    reason: Mutex<Option<String>>,
    carry: Mutex<Carry>,
    notify: tokio::sync::Notify,
}

impl Stuck {
    pub(super) fn set(&self, reason: String) {
        let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none() {
            *r = Some(reason);
            self.notify.notify_one();
        }
    }

    pub(super) fn set_carry(&self, carry: Carry) {
        *self.carry.lock().unwrap_or_else(|e| e.into_inner()) = carry;
    }

    /// What the next image should know.
    pub fn carry(&self) -> Carry {
        self.carry.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why the broker must restart, if it must.
    pub fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves (with the reason) once a GPU is stuck.
    pub async fn wait(&self) -> String {
        loop {
            if let Some(r) = self.reason() {
                return r;
            }
            self.notify.notified().await;
        }
    }
}

/// The environment variable a restarting gpushared tells its next image where each GPU's
/// clients' memory lived in: clients rebuilding their state place it again at the same
/// addresses, and fresh memory must not take them first.
pub const MEMORY_HANDOVER_ENV: &str = "GPUSHARE_MEMORY_HANDOVER";

/// Where one GPU's clients' memory lived: its address range, and where fresh memory went from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handover {
    pub space: Space,
    pub floor: u64,
}

impl Handover {
    /// `base:size:granularity:floor` per GPU, `;` between GPUs (an empty entry: none).
    pub fn to_env(all: &[Option<Handover>]) -> String {
        all.iter()
            .map(|h| {
                h.map_or(String::new(), |h| {
                    format!(
                        "{}:{}:{}:{}",
                        h.space.base, h.space.size, h.space.granularity, h.floor
                    )
                })
            })
            .collect::<Vec<_>>()
            .join(";")
    }

    /// Reads [`Handover::to_env`]'s format; anything malformed is no handover.
    pub fn from_env(text: &str) -> Vec<Option<Handover>> {
        text.split(';')
            .map(|part| {
                let n: Vec<u64> = part
                    .split(':')
                    .map(|v| v.trim().parse().ok())
                    .collect::<Option<_>>()?;
                match n[..] {
                    [base, size, granularity, floor] => Some(Handover {
                        space: Space {
                            base,
                            size,
                            granularity,
                        },
                        floor,
                    }),
                    _ => None,
                }
            })
            .collect()
    }

    /// What this process's earlier image handed over, by GPU index.
    pub fn inherited() -> Vec<Option<Handover>> {
        std::env::var(MEMORY_HANDOVER_ENV)
            .map(|t| Handover::from_env(&t))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handover_survives_the_environment() {
        let one = Handover {
            space: Space {
                base: 0x7000_0000_0000,
                size: 1 << 40,
                granularity: 2 << 20,
            },
            floor: 0x7000_0040_0000,
        };
        let text = Handover::to_env(&[Some(one), None]);
        assert_eq!(Handover::from_env(&text), vec![Some(one), None]);
        assert_eq!(Handover::from_env("1:2:x:4"), vec![None]);
    }
}
