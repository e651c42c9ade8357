//! When a GPU cannot be recovered in place, gpushared restarts: [`Stuck`] says so (and why),
//! and [`Carry`] is what the next image is told about the fault.

use std::sync::Mutex;

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
