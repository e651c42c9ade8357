//! Device workers map bottom-up, far below where programs map their libraries, so the device
//! addresses a worker's context hands out (carved from the worker's own address space) and
//! the client memory it maps at the client's own address do not meet a consolidated client's
//! mappings (docs/consolidated.md, "Memory").

use std::time::Duration;

use gpushare_tests::{Broker, WORKER_MAPPINGS_BELOW, mappings, wait_until};

/// `personality(2)`'s flags for the bottom-up ("legacy") mmap layout, and for no address
/// randomisation.
const ADDR_COMPAT_LAYOUT: u32 = 0x0200000;
const ADDR_NO_RANDOMIZE: u32 = 0x0040000;

/// Whether the mmap layout decides where this mapping goes: all but the stack and the
/// kernel's pages near it, and the executable with its heap.
fn placed_by_mmap_layout(what: &str, exe: &str) -> bool {
    let fixed = [
        "[stack]",
        "[vvar]",
        "[vvar_vclock]",
        "[vdso]",
        "[vsyscall]",
        "[heap]",
    ];
    !fixed.contains(&what) && what != exe
}

#[test]
fn device_workers_map_bottom_up_below_programs_mappings() {
    let broker = Broker::start();
    // The serving worker and its spare.
    assert!(
        wait_until(Duration::from_secs(20), || broker.worker_pids().len() >= 2),
        "workers: {:?}",
        broker.worker_pids()
    );
    // Something allocated, so the worker has mapped memory for it.
    let client = broker.client();
    let buf = client.alloc::<u8>(8 << 20).expect("alloc");
    buf.copy_from_host(&vec![7u8; 8 << 20]).expect("up");
    let mut libc_at = Vec::new();
    for pid in broker.worker_pids() {
        let personality = std::fs::read_to_string(format!("/proc/{pid}/personality"))
            .expect("the worker's personality");
        let flags = u32::from_str_radix(personality.trim(), 16).expect("hex flags");
        assert_ne!(
            flags & ADDR_COMPAT_LAYOUT,
            0,
            "worker {pid} runs in the top-down layout (personality {personality})"
        );
        assert_ne!(
            flags & ADDR_NO_RANDOMIZE,
            0,
            "worker {pid} runs with address randomisation (personality {personality})"
        );
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .expect("the worker's executable")
            .display()
            .to_string();
        let maps = mappings(pid);
        // The executable's zero-filled data past its file-backed pages is anonymous, right
        // after its last mapping: the executable's, not the mmap layout's.
        let exe_end = maps
            .iter()
            .filter(|(_, _, what)| *what == exe)
            .map(|(_, hi, _)| *hi)
            .max();
        let own: Vec<_> = maps
            .iter()
            .filter(|(_, _, what)| placed_by_mmap_layout(what, &exe))
            .filter(|(lo, _, what)| !(what.is_empty() && Some(*lo) == exe_end))
            .collect();
        let libc = own
            .iter()
            .filter(|(_, _, what)| what.contains("libc"))
            .map(|(lo, _, _)| *lo)
            .min();
        assert!(libc.is_some(), "worker {pid} maps no libc?\n{maps:#x?}");
        libc_at.push((pid, libc));
        let high: Vec<_> = own
            .iter()
            .filter(|(_, hi, _)| *hi > WORKER_MAPPINGS_BELOW)
            .collect();
        assert!(
            high.is_empty(),
            "worker {pid} mapped where programs map their libraries: {high:#x?}"
        );
    }
    // Laid out alike, a spare's context places a module's globals where the serving worker's
    // did (docs/reliability.md, "Module globals").
    assert!(
        libc_at.windows(2).all(|w| w[0].1 == w[1].1),
        "workers map their libraries at different addresses: {libc_at:#x?}"
    );
}

/// Where a worker maps what it holds for clients (broker/src/device/remote/worker/zone.rs).
const ZONE: std::ops::Range<u64> = 0x4000_0000_0000..0x4800_0000_0000;

#[test]
fn a_worker_maps_clients_regions_and_its_channels_in_its_zone() {
    let broker = Broker::start();
    assert!(
        wait_until(Duration::from_secs(20), || !broker.worker_pids().is_empty()),
        "no worker"
    );
    // A session (its region is shared with the worker) that calls the device (a channel).
    let client = broker.client();
    let buf = client.alloc::<u8>(1 << 20).expect("alloc");
    buf.copy_from_host(&vec![9u8; 1 << 20]).expect("up");
    assert_eq!(buf.to_vec().expect("down")[4096], 9);
    let held = |pid: i32| -> Vec<(u64, u64, String)> {
        mappings(pid)
            .into_iter()
            .filter(|(_, _, what)| {
                what.contains("gpushare-client") || what.contains("gpushare-worker-channel")
            })
            .collect()
    };
    let serving: Vec<_> = broker
        .worker_pids()
        .into_iter()
        .map(|pid| (pid, held(pid)))
        .filter(|(_, maps)| maps.iter().any(|(_, _, w)| w.contains("gpushare-client")))
        .collect();
    assert!(!serving.is_empty(), "no worker maps the client's region");
    for (pid, maps) in serving {
        for (lo, hi, what) in maps {
            assert!(
                ZONE.contains(&lo) && hi <= ZONE.end,
                "worker {pid} maps {what} at {lo:#x}, outside its zone (where the driver would put module data)"
            );
        }
    }
}
