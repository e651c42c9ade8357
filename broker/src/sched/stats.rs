//! What a [`Dispatcher`] tells of its clients (`status`, tests).

use gpushare_protocol::PriorityClass;

use super::{ClientId, ClientSchedStats, ClientSpec, Dispatcher};

impl Dispatcher {
    /// How many of the client's requests are on the GPU (0 for an unknown client).
    pub fn inflight_of(&self, id: ClientId) -> usize {
        self.index
            .get(&id)
            .map_or(0, |&i| self.clients[i].inflight.len())
    }

    /// Scheduling figures of one client.
    pub fn stats(&self, id: ClientId) -> Option<ClientSchedStats> {
        let c = &self.clients[*self.index.get(&id)?];
        let total: u64 = self.clients.iter().map(|c| c.gpu_ns).sum();
        let rate_limit = match (&self.rate, c.spec.class) {
            (Some(r), PriorityClass::BestEffort) if self.ctx.limiter_engaged => Some(r.allowance()),
            _ => None,
        };
        let sm_share = if Self::is_restricted(&self.ctx, &c.spec) {
            self.deadline.share()
        } else {
            1.0
        };
        Some(ClientSchedStats {
            granted: c.granted,
            completed: c.completed,
            waiting: c.queue.len(),
            inflight: c.inflight.len(),
            gpu_ns: c.gpu_ns,
            share: if total == 0 {
                0.0
            } else {
                c.gpu_ns as f64 / total as f64
            },
            rate_limit,
            sm_share,
            deadline_misses: c.deadline_misses,
            admitted: c.admitted,
            iteration_latency_ns: c.iter_latency.map(|l| l.round() as u64),
        })
    }

    /// The client as registered.
    pub fn spec(&self, id: ClientId) -> Option<ClientSpec> {
        self.index.get(&id).map(|&i| self.clients[i].spec)
    }

    /// Clients registered, in arrival order.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.clients.iter().map(|c| c.spec.id)
    }

    /// Requests queued (not granted) and in flight over all clients.
    #[cfg(test)]
    pub fn backlog(&self) -> (usize, usize) {
        (self.queued_total, self.inflight_total)
    }
}
