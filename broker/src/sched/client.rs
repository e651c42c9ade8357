//! What the scheduler knows of a client and of its requests: what the client declared, what
//! it queued and was granted, and the figures status reports.

use std::collections::VecDeque;

use gpushare_protocol::PriorityClass;

use super::inflight::InflightSet;
use super::{ClientId, KernelProfile, RequestId};

/// A training-style job's declaration (Salus): for SRTF and memory admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobProfile {
    /// GPU time the job still needs, as declared when it was set.
    pub remaining_ns_estimate: u64,
    /// Memory held for the job's whole life (weights, optimizer state).
    pub persistent_bytes: u64,
    /// Memory needed during an iteration (activations).
    pub ephemeral_bytes: u64,
}

impl JobProfile {
    pub fn footprint(&self) -> u64 {
        self.persistent_bytes.saturating_add(self.ephemeral_bytes)
    }
}

/// A periodic client's deadline (CudaMon): each iteration should finish within
/// `deadline_ns` of its first submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineSpec {
    pub period_ns: u64,
    pub deadline_ns: u64,
}

/// A client as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSpec {
    pub id: ClientId,
    pub class: PriorityClass,
    /// Fair-share weight, at least 1.
    pub weight: u32,
    pub job: Option<JobProfile>,
    pub deadline: Option<DeadlineSpec>,
    /// The GPU context its kernels run in (0: gpushared's default one). The GPU time-slices
    /// between contexts, so kernels of different contexts never run side by side.
    pub context: u64,
    /// Whose share its work draws on when FAIR divides the GPU among users (`per_user`): its
    /// user's ([`user_account`]); its own id otherwise.
    pub account: u64,
}

impl ClientSpec {
    pub fn new(id: ClientId, class: PriorityClass, weight: u32) -> ClientSpec {
        ClientSpec {
            id,
            class,
            weight,
            job: None,
            deadline: None,
            context: 0,
            account: id,
        }
    }
}

/// The account of the Unix user `uid` (above every client id, which count up from 1).
pub fn user_account(uid: u32) -> u64 {
    (1 << 62) | u64::from(uid)
}

/// A queued launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    pub profile: KernelProfile,
    pub submitted_at: u64,
}

/// A granted launch not yet completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inflight {
    pub id: RequestId,
    pub profile: KernelProfile,
    pub submitted_at: u64,
    pub granted_at: u64,
    /// When it would be done had it waited on the device for nothing but its client's
    /// kernels granted before it (their estimates): later, and it waits behind others' work.
    pub due_at: u64,
    /// Its grant's number in the dispatcher (whether another client's came after it, while it
    /// was in flight).
    pub(super) grant_seq: u64,
    /// The SM partition it was granted on, if its client is partitioned.
    pub sm_limit: Option<u32>,
    /// Another client had work in flight at some point beside it.
    pub(super) overlapped: bool,
    /// SMs it holds of the deadline partition's room (0: not partitioned below a deadline).
    pub(super) deadline_sms: u32,
}

/// A decision: hand `request` of `client` to the device now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub client: ClientId,
    pub request: RequestId,
    /// Run it on a partition of this many SMs (a green context), if set.
    pub sm_limit: Option<u32>,
    /// It waits at the device's priority gate before it starts ([`Policy::behind_gate`]).
    ///
    /// [`Policy::behind_gate`]: super::policy::Policy::behind_gate
    pub gated: bool,
}

/// What `iteration_boundary` measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterationReport {
    /// From the iteration's first submission to its declared end.
    pub latency_ns: u64,
    pub deadline_missed: bool,
}

/// One client's scheduling figures, for status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientSchedStats {
    pub granted: u64,
    pub completed: u64,
    /// Queued, not yet granted.
    pub waiting: usize,
    pub inflight: usize,
    /// Measured GPU time of its completed requests.
    pub gpu_ns: u64,
    /// Its fraction of all current clients' GPU time.
    pub share: f64,
    /// Blocks/s allowed to best-effort clients (all of them together) while the rate limit
    /// is engaged (a high client present, or outside load).
    pub rate_limit: Option<f64>,
    /// Fraction of the SMs it may use (1 unless partitioned below a deadline client).
    pub sm_share: f64,
    pub deadline_misses: u64,
    /// Admitted by memory admission (always, for clients that declared no footprint).
    pub admitted: bool,
    /// EWMA of its iteration latency.
    pub iteration_latency_ns: Option<u64>,
}

/// Everything the dispatcher tracks of one client.
#[derive(Debug, Clone)]
pub(super) struct ClientState {
    pub(super) spec: ClientSpec,
    /// Order of arrival among clients.
    pub(super) arrival: u64,
    pub(super) queue: VecDeque<Request>,
    pub(super) inflight: InflightSet,
    pub(super) granted: u64,
    pub(super) completed: u64,
    pub(super) gpu_ns: u64,
    /// `gpu_ns` when the job profile was declared (remaining = declared − since then).
    pub(super) job_base_gpu_ns: u64,
    pub(super) admitted: bool,
    /// Granted something since the last iteration boundary.
    pub(super) iter_open: bool,
    pub(super) iter_start: Option<u64>,
    pub(super) iter_latency: Option<f64>,
    pub(super) deadline_misses: u64,
}

impl ClientState {
    /// A client that has queued nothing yet.
    pub(super) fn new(spec: ClientSpec, arrival: u64, admitted: bool) -> ClientState {
        ClientState {
            spec,
            arrival,
            queue: VecDeque::new(),
            inflight: InflightSet::default(),
            granted: 0,
            completed: 0,
            gpu_ns: 0,
            job_base_gpu_ns: 0,
            admitted,
            iter_open: false,
            iter_start: None,
            iter_latency: None,
            deadline_misses: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_footprint_is_both_kinds_of_memory_and_saturates() {
        let job = JobProfile {
            remaining_ns_estimate: 0,
            persistent_bytes: 3 << 30,
            ephemeral_bytes: 1 << 30,
        };
        assert_eq!(job.footprint(), 4 << 30);
        let huge = JobProfile {
            persistent_bytes: u64::MAX,
            ephemeral_bytes: 1,
            ..job
        };
        assert_eq!(huge.footprint(), u64::MAX);
    }

    #[test]
    fn a_new_client_spec_declares_no_job_and_no_deadline() {
        let spec = ClientSpec::new(7, PriorityClass::Normal, 3);
        assert_eq!(
            (spec.id, spec.class, spec.weight),
            (7, PriorityClass::Normal, 3)
        );
        assert_eq!(spec.job, None);
        assert_eq!(spec.deadline, None);
    }
}
