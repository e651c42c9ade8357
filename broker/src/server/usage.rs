//! gpushared's own use of the machine, from `/proc`: its CPU time and memory, and its device
//! workers' (its children). What `gpushare top` and the metrics show as the broker's cost.
//! The one reader of `/proc/PID/stat` here (the status's process list asks it for parents).

use gpushare_protocol::stats::BrokerUsage;

/// The broker's usage now. Anything `/proc` does not give (another kernel, a race with a
/// worker's exit) counts as zero rather than failing the status report.
pub fn broker_usage() -> BrokerUsage {
    let tick_ns = tick_ns();
    let page = page_bytes();
    let me = Stat::of("self").unwrap_or_default();
    let mut usage = BrokerUsage {
        cpu_ns: (me.utime + me.stime) * tick_ns,
        // Reaped children's time: a replaced worker's stays counted.
        workers_cpu_ns: (me.cutime + me.cstime) * tick_ns,
        rss_bytes: me.rss_pages * page,
        threads: me.threads,
        ..BrokerUsage::default()
    };
    for pid in children() {
        if let Some(child) = Stat::of(&pid.to_string()) {
            usage.workers_cpu_ns += (child.utime + child.stime) * tick_ns;
            usage.workers_rss_bytes += child.rss_pages * page;
            usage.workers += 1;
        }
    }
    usage
}

/// The parent of process `pid` (`None` once it is gone).
pub fn parent_of(pid: i32) -> Option<i32> {
    i32::try_from(Stat::of(&pid.to_string())?.ppid).ok()
}

/// The fields of `/proc/PID/stat` gpushared reads.
#[derive(Debug, Default, PartialEq)]
struct Stat {
    ppid: u64,
    utime: u64,
    stime: u64,
    cutime: u64,
    cstime: u64,
    threads: u32,
    rss_pages: u64,
}

impl Stat {
    fn of(pid: &str) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// "pid (comm) state ppid …": the command may hold spaces and ')', so fields are counted
    /// from the last ')'. After it, ppid is index 1, utime index 11, then stime, cutime,
    /// cstime; num_threads index 17, rss index 21 (proc(5)).
    fn parse(stat: &str) -> Option<Stat> {
        let (_, rest) = stat.rsplit_once(')')?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        Some(Stat {
            ppid: num(1)?,
            utime: num(11)?,
            stime: num(12)?,
            cutime: num(13)?,
            cstime: num(14)?,
            threads: u32::try_from(num(17)?).unwrap_or(u32::MAX),
            rss_pages: num(21)?,
        })
    }
}

/// gpushared's live children, from every thread's `children` list (a child belongs to the
/// thread that forked it).
fn children() -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn tick_ns() -> u64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&t| t > 0)
        .unwrap_or(100);
    1_000_000_000 / ticks as u64
}

fn page_bytes() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .filter(|&p| p > 0)
        .map_or(4096, |p| p as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_with_spaces_and_parentheses_is_skipped_whole() {
        let line = "4242 (gpushare (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 75 3 4 20 0 9 0 1234 567890 1500 18446744073709551615";
        let stat = Stat::parse(line).expect("parses");
        assert_eq!(
            stat,
            Stat {
                ppid: 1,
                utime: 250,
                stime: 75,
                cutime: 3,
                cstime: 4,
                threads: 9,
                rss_pages: 1500,
            }
        );
        assert_eq!(Stat::parse("garbage"), None);
        assert_eq!(Stat::parse("1 (x) S 1"), None);
    }

    #[test]
    fn the_broker_sees_its_own_time_and_its_children() {
        // Burn a little CPU so that the count is above zero on any clock tick.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let usage = broker_usage();
        let parent = parent_of(i32::try_from(child.id()).expect("pid"));
        let _ = child.kill();
        let _ = child.wait();
        assert!(usage.cpu_ns > 0, "{usage:?}");
        assert!(usage.rss_bytes > 0 && usage.threads >= 1, "{usage:?}");
        assert!(usage.workers >= 1, "the child is counted: {usage:?}");
        assert_eq!(parent, Some(std::process::id() as i32));
    }
}
