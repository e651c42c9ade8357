//! Per-job series: batch scheduler jobs holding shares of the GPUs (absent on a machine that
//! runs none).

use gpushare_protocol::job::JobStats;

use super::exposition::{Exposition, borrow};

pub(super) fn render_jobs(out: &mut Exposition, jobs: &[JobStats]) {
    if jobs.is_empty() {
        return;
    }
    let labels: Vec<[(&str, String); 3]> = jobs
        .iter()
        .map(|j| {
            [
                ("job", j.job.to_string()),
                ("user", j.user.clone()),
                ("class", j.class.as_str().to_string()),
            ]
        })
        .collect();
    type Get = fn(&JobStats) -> f64;
    let families: [(&str, &str, &str, Get); 6] = [
        (
            "gpushare_job_gpu_seconds_total",
            "counter",
            "Device time of the job's sessions, ended ones included.",
            |j| j.gpu_time_ns as f64 / 1e9,
        ),
        (
            "gpushare_job_memory_bytes",
            "gauge",
            "Device memory the job's sessions hold.",
            |j| j.memory_used as f64,
        ),
        (
            "gpushare_job_memory_quota_bytes",
            "gauge",
            "Device memory the job's shards are worth: what its sessions together may hold.",
            |j| j.memory_quota as f64,
        ),
        (
            "gpushare_job_shards",
            "gauge",
            "GPU shards the job holds here, over every GPU.",
            |j| f64::from(j.shards()),
        ),
        (
            "gpushare_job_sessions",
            "gauge",
            "Sessions of the job open now.",
            |j| f64::from(j.sessions),
        ),
        (
            "gpushare_job_sessions_total",
            "counter",
            "Sessions the job has had.",
            |j| j.sessions_total as f64,
        ),
    ];
    for (name, kind, help, get) in &families {
        out.family(name, kind, help);
        for (j, l) in jobs.iter().zip(&labels) {
            out.sample(name, &borrow(l), get(j));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::render;
    use crate::metrics::testing::{job, parse, report, value};

    #[test]
    fn each_job_has_its_gpu_time_memory_quota_and_shards() {
        let mut r = report();
        r.clients[0].job = Some(12);
        r.jobs = vec![job(12, "alice")];
        let scrape = parse(&render(&r));
        let labels = [("job", "12"), ("user", "alice"), ("class", "normal")];
        assert_eq!(
            value(&scrape, "gpushare_job_gpu_seconds_total", &labels),
            2.5
        );
        assert_eq!(
            value(&scrape, "gpushare_job_memory_quota_bytes", &labels),
            (4u64 << 30) as f64
        );
        assert_eq!(value(&scrape, "gpushare_job_shards", &labels), 2.0);
        assert_eq!(value(&scrape, "gpushare_job_sessions", &labels), 1.0);
        assert_eq!(
            value(
                &scrape,
                "gpushare_client_memory_bytes",
                &[("client", "7"), ("job", "12")]
            ),
            r.clients[0].memory_used as f64
        );
    }

    #[test]
    fn a_machine_without_jobs_has_no_job_series() {
        let text = render(&report());
        assert!(!text.contains("gpushare_job_"), "{text}");
    }
}
