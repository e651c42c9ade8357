//! What a policy sees of the dispatcher's clients when it picks: a read-only [`View`].

use gpushare_protocol::PriorityClass;

use super::client::ClientState;
use super::inflight::InflightSet;
use super::{ClientId, ClientSpec, DeviceShape, Request};

/// A read-only view of the dispatcher's clients for a policy's decision.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub(super) device: DeviceShape,
    pub(super) clients: &'a [ClientState],
    pub(super) eligible: &'a [bool],
    pub(super) inflight_total: usize,
    /// Only the clients of this class are seen (`of_class`).
    pub(super) only: Option<PriorityClass>,
}

impl<'a> View<'a> {
    pub fn device(&self) -> DeviceShape {
        self.device
    }

    /// Every client, in arrival order.
    pub fn clients(&self) -> impl Iterator<Item = ClientView<'a>> + 'a {
        let (eligible, only) = (self.eligible, self.only);
        self.clients
            .iter()
            .enumerate()
            .filter(move |(_, state)| only.is_none_or(|c| state.spec.class == c))
            .map(move |(i, state)| ClientView {
                state,
                eligible: eligible.get(i).copied().unwrap_or(false),
            })
    }

    /// The same view with only the clients of `class` in it (what a policy that serves one
    /// class by another policy's rules hands that policy).
    pub fn of_class(&self, class: PriorityClass) -> View<'a> {
        View {
            only: Some(class),
            ..*self
        }
    }

    /// Clients whose queue head may be granted now (every gate passed), in arrival order.
    pub fn candidates(&self) -> impl Iterator<Item = ClientView<'a>> + 'a {
        self.clients().filter(|c| c.eligible)
    }

    pub fn client(&self, id: ClientId) -> Option<ClientView<'a>> {
        self.clients().find(|c| c.id() == id)
    }

    /// Granted, not completed, over all clients (of the class, in a view of one).
    pub fn inflight_total(&self) -> usize {
        match self.only {
            None => self.inflight_total,
            Some(_) => self.clients().map(|c| c.inflight().len()).sum(),
        }
    }
}

/// One client in a [`View`].
#[derive(Clone, Copy)]
pub struct ClientView<'a> {
    state: &'a ClientState,
    eligible: bool,
}

impl<'a> ClientView<'a> {
    pub fn id(&self) -> ClientId {
        self.state.spec.id
    }

    pub fn spec(&self) -> &'a ClientSpec {
        &self.state.spec
    }

    pub fn class(&self) -> PriorityClass {
        self.state.spec.class
    }

    /// The GPU context its kernels run in ([`ClientSpec::context`]).
    pub fn context(&self) -> u64 {
        self.state.spec.context
    }

    pub fn weight(&self) -> u32 {
        self.state.spec.weight.max(1)
    }

    /// Order of arrival among clients (smaller: earlier).
    pub fn arrival(&self) -> u64 {
        self.state.arrival
    }

    /// Its head may be granted now.
    pub fn eligible(&self) -> bool {
        self.eligible
    }

    pub fn head(&self) -> Option<&'a Request> {
        self.state.queue.front()
    }

    pub fn queued(&self) -> usize {
        self.state.queue.len()
    }

    pub fn inflight(&self) -> &'a InflightSet {
        &self.state.inflight
    }

    /// Estimated time of its kernels in flight, together.
    pub fn inflight_est_ns(&self) -> u64 {
        self.state.inflight.est_ns()
    }

    /// Estimated time of its queued kernels, together (a walk of its queue).
    pub fn queued_est_ns(&self) -> u64 {
        self.state.queue.iter().map(|r| r.profile.est_ns).sum()
    }

    /// SMs its kernels in flight hold together (each its grid, or its partition if smaller).
    pub fn inflight_sms(&self) -> u64 {
        self.state.inflight.sms()
    }

    /// The grid of its widest kernel in flight, in SMs (0: none in flight).
    pub fn inflight_widest(&self) -> u32 {
        self.state.inflight.widest()
    }

    /// Whether one of its kernels in flight is bound by `bound`.
    pub fn inflight_has(&self, bound: crate::sched::Bound) -> bool {
        self.state.inflight.has(bound)
    }

    /// How long past when it would be done its oldest kernel in flight is at `now`
    /// ([`crate::sched::Inflight::due_at`]): time its work has waited on the device behind others' (or that
    /// its estimates are short). 0 with nothing in flight.
    pub fn overdue_ns(&self, now: u64) -> u64 {
        self.state
            .inflight
            .iter()
            .next()
            .map_or(0, |oldest| now.saturating_sub(oldest.due_at))
    }

    /// Queued or in flight.
    pub fn backlogged(&self) -> bool {
        !self.state.queue.is_empty() || !self.state.inflight.is_empty()
    }

    /// The declared job's remaining GPU time, less what it has used since declaring it.
    pub fn remaining_ns(&self) -> Option<u64> {
        let used = self.state.gpu_ns - self.state.job_base_gpu_ns;
        self.state
            .spec
            .job
            .map(|j| j.remaining_ns_estimate.saturating_sub(used))
    }

    /// Granted something since its last iteration boundary.
    pub fn iteration_open(&self) -> bool {
        self.state.iter_open
    }

    /// EWMA of its iteration latency.
    pub fn iteration_latency_ns(&self) -> Option<u64> {
        self.state.iter_latency.map(|l| l.round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::simulate::kernel;
    use crate::sched::{Bound, JobProfile};

    fn state(id: ClientId, arrival: u64, weight: u32) -> ClientState {
        ClientState::new(
            ClientSpec::new(id, PriorityClass::Normal, weight),
            arrival,
            true,
        )
    }

    fn request(id: u64) -> Request {
        Request {
            id,
            profile: kernel(1, 10, 4, Bound::Compute),
            submitted_at: 0,
        }
    }

    const DEVICE: DeviceShape = DeviceShape {
        sms: 132,
        sm_partitions: true,
    };

    #[test]
    fn candidates_are_the_eligible_clients_in_arrival_order() {
        let clients = [state(10, 0, 1), state(20, 1, 1), state(30, 2, 1)];
        // A client past the end of `eligible` is not a candidate.
        let eligible = [true, false];
        let view = View {
            device: DEVICE,
            clients: &clients,
            eligible: &eligible,
            inflight_total: 0,
            only: None,
        };
        let all: Vec<_> = view.clients().map(|c| c.id()).collect();
        assert_eq!(all, [10, 20, 30]);
        let candidates: Vec<_> = view.candidates().map(|c| c.id()).collect();
        assert_eq!(candidates, [10]);
        assert!(view.client(30).is_some_and(|c| !c.eligible()));
        assert!(view.client(40).is_none());
    }

    #[test]
    fn a_client_reads_as_backlogged_weighted_and_with_its_remaining_time() {
        let mut c = state(1, 0, 0);
        c.spec.job = Some(JobProfile {
            remaining_ns_estimate: 1_000,
            ..JobProfile::default()
        });
        // 300 ns used before the job was declared, 400 since.
        c.job_base_gpu_ns = 300;
        c.gpu_ns = 700;
        c.queue.push_back(request(5));
        c.iter_latency = Some(2.6);
        let clients = [c];
        let view = View {
            device: DEVICE,
            clients: &clients,
            eligible: &[true],
            inflight_total: 0,
            only: None,
        };
        let Some(v) = view.client(1) else {
            panic!("client 1 is in the view");
        };
        assert_eq!(v.weight(), 1, "a weight of 0 counts as 1");
        assert!(v.backlogged());
        assert_eq!(v.head().map(|r| r.id), Some(5));
        assert_eq!(v.remaining_ns(), Some(600));
        assert_eq!(v.iteration_latency_ns(), Some(3));

        let mut overran = clients[0].clone();
        overran.gpu_ns = 5_000;
        overran.queue.clear();
        let clients = [overran];
        let view = View {
            device: DEVICE,
            clients: &clients,
            eligible: &[false],
            inflight_total: 0,
            only: None,
        };
        let v = view.clients().next();
        assert_eq!(v.and_then(|v| v.remaining_ns()), Some(0));
        assert!(v.is_some_and(|v| !v.backlogged()));
    }
}
