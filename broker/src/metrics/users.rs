//! Per-user and per-GPU load series: what each user's sessions hold together (on each GPU and
//! in total, against the policy's quotas), how busy each GPU has been lately, and whether FAIR
//! runs free on it.

use gpushare_protocol::stats::{FreeRunning, GpuLoad, UserStats};

use super::exposition::Exposition;

pub(super) fn render_users(out: &mut Exposition, users: &[UserStats]) {
    if users.is_empty() {
        return;
    }
    out.family(
        "gpushare_user_memory_bytes",
        "gauge",
        "Device memory all of the user's sessions hold, on every GPU together.",
    );
    for u in users {
        out.sample(
            "gpushare_user_memory_bytes",
            &[("user", &u.user)],
            u.memory_used as f64,
        );
    }
    out.family(
        "gpushare_user_memory_quota_bytes",
        "gauge",
        "The user's memory quota over every GPU together (absent: unlimited).",
    );
    for u in users {
        if let Some(q) = u.memory_quota {
            out.sample(
                "gpushare_user_memory_quota_bytes",
                &[("user", &u.user)],
                q as f64,
            );
        }
    }
    out.family(
        "gpushare_user_gpu_memory_bytes",
        "gauge",
        "Device memory the user's sessions hold on one GPU.",
    );
    for u in users {
        for g in &u.gpu_memory {
            let gpu = g.gpu.to_string();
            out.sample(
                "gpushare_user_gpu_memory_bytes",
                &[("user", &u.user), ("gpu", &gpu)],
                g.memory_used as f64,
            );
        }
    }
    out.family(
        "gpushare_user_gpu_memory_quota_bytes",
        "gauge",
        "The user's memory quota on any one GPU (absent: unlimited).",
    );
    for u in users {
        if let Some(q) = u.gpu_memory_quota {
            out.sample(
                "gpushare_user_gpu_memory_quota_bytes",
                &[("user", &u.user)],
                q as f64,
            );
        }
    }
}

pub(super) fn render_gpu_loads(out: &mut Exposition, loads: &[GpuLoad]) {
    out.family(
        "gpushare_device_busy_ratio",
        "gauge",
        "Device time the GPU's clients' work took per second lately (above 1 where work overlaps): what the default placement weighs first.",
    );
    for l in loads {
        let gpu = l.gpu.to_string();
        out.sample("gpushare_device_busy_ratio", &[("gpu", &gpu)], l.busy);
    }
}

/// FAIR running free on each GPU whose policy may (`[fair] free_lead_us`).
pub(super) fn render_free_running(out: &mut Exposition, free: &[FreeRunning]) {
    type Series = (
        &'static str,
        &'static str,
        &'static str,
        fn(&FreeRunning) -> f64,
    );
    let series: [Series; 2] = [
        (
            "gpushare_fair_free",
            "gauge",
            "1 while FAIR's launches skip the scheduler (no account leads by more than free_lead_us), else 0.",
            |f| f64::from(u8::from(f.now)),
        ),
        (
            "gpushare_fair_free_seconds_total",
            "counter",
            "How long FAIR's launches have skipped the scheduler since gpushared started.",
            |f| f.total_ns as f64 / 1e9,
        ),
    ];
    if free.is_empty() {
        return;
    }
    for (name, kind, help, value) in series {
        out.family(name, kind, help);
        for f in free {
            out.sample(name, &[("gpu", &f.gpu.to_string())], value(f));
        }
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::stats::{GpuLoad, GpuMemory, UserStats};

    use crate::metrics::render;
    use crate::metrics::testing::{parse, report, value};

    fn alice() -> UserStats {
        UserStats {
            uid: 1000,
            user: "alice".into(),
            sessions: 2,
            memory_used: 3 << 20,
            memory_quota: None,
            pinned_bytes: 0,
            max_sessions: 64,
            max_pinned_bytes: None,
            connections: 2,
            max_connections: 128,
            module_bytes: 0,
            max_module_bytes: None,
            gpu_memory: vec![
                GpuMemory {
                    gpu: 0,
                    memory_used: 1 << 20,
                },
                GpuMemory {
                    gpu: 1,
                    memory_used: 2 << 20,
                },
            ],
            gpu_memory_quota: Some(8 << 30),
        }
    }

    #[test]
    fn each_user_has_memory_per_gpu_and_in_total_with_the_quotas_that_are_set() {
        let mut r = report();
        r.users = vec![alice()];
        let scrape = parse(&render(&r));
        let alice = [("user", "alice")];
        assert_eq!(
            value(&scrape, "gpushare_user_memory_bytes", &alice),
            (3u64 << 20) as f64
        );
        assert_eq!(
            value(
                &scrape,
                "gpushare_user_gpu_memory_bytes",
                &[("user", "alice"), ("gpu", "1")]
            ),
            (2u64 << 20) as f64
        );
        assert_eq!(
            value(&scrape, "gpushare_user_gpu_memory_quota_bytes", &alice),
            (8u64 << 30) as f64
        );
        let text = render(&r);
        assert!(
            !text.contains("gpushare_user_memory_quota_bytes{"),
            "an unlimited quota has no sample: {text}"
        );
    }

    #[test]
    fn each_gpu_says_how_busy_it_has_been() {
        let mut r = report();
        r.gpu_loads = vec![
            GpuLoad {
                gpu: 0,
                busy: 0.25,
                ..GpuLoad::default()
            },
            GpuLoad {
                gpu: 1,
                busy: 1.5,
                ..GpuLoad::default()
            },
        ];
        let scrape = parse(&render(&r));
        assert_eq!(
            value(&scrape, "gpushare_device_busy_ratio", &[("gpu", "1")]),
            1.5
        );
    }

    #[test]
    fn fair_running_free_is_a_gauge_and_a_counter_per_gpu() {
        let mut r = report();
        assert!(!render(&r).contains("gpushare_fair_free"), "not asked for");
        r.free_running = vec![gpushare_protocol::stats::FreeRunning {
            gpu: 0,
            now: true,
            total_ns: 2_500_000_000,
        }];
        let scrape = parse(&render(&r));
        assert_eq!(value(&scrape, "gpushare_fair_free", &[("gpu", "0")]), 1.0);
        assert_eq!(
            value(&scrape, "gpushare_fair_free_seconds_total", &[("gpu", "0")]),
            2.5
        );
    }
}
