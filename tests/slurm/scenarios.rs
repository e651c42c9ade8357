//! The scenarios that share one Slurm cluster and one broker (`slurm.rs` runs them in turn).

use super::*;

pub(super) fn outside_a_job_only_root_may_use_the_gpu(s: &Setup) {
    let (status, out, err) = output_within(&mut s.run_outside_a_job(Some(&s.a), MIB), PATIENCE);
    assert!(
        status.is_some_and(|st| !st.success()) && ready_pid(&out).is_none(),
        "{} ran a CUDA program outside any job ({status:?}): {out}{err}",
        s.a.name
    );
    assert!(
        err.contains("Slurm"),
        "the refusal does not say it is Slurm's: {err}"
    );

    let (status, out, err) = output_within(&mut s.run_outside_a_job(None, MIB), PATIENCE);
    assert!(
        status.is_some_and(|st| st.success()) && ready_pid(&out).is_some(),
        "root could not run a CUDA program outside a job ({status:?}): {out}{err}"
    );
    s.wait_status("root's program leaves nothing after it ends", |st| {
        st.clients.is_empty()
    });
}

pub(super) fn two_users_jobs_run_side_by_side_on_their_grants_and_nothing_stays_after_they_end(
    s: &Setup,
) {
    let app = s.app();
    let gib = GIB.to_string();
    let mut step = Step::start(s.slurm.srun_as(
        &s.a,
        &[
            "--job-name=gpushare-a",
            "--gres=shard:2",
            &app,
            "hold",
            "libcuda.so.1",
            &gib,
        ],
    ));
    let a_pid = step.ready(s);
    let a_job = s
        .slurm
        .job_id_named("gpushare-a")
        .expect("squeue knows the step's job");

    // Meanwhile the other user's batch job in the interactive partition; its program holds
    // its memory until the FIFO's writer (this test) closes it.
    let (fifo, gate) = s.slurm.input_fifo("two-users-b");
    let b_job = s.slurm.sbatch_as(
        &s.b,
        &[
            "--job-name=gpushare-b",
            "--partition=interactive",
            "--gres=shard:3",
        ],
        &format!("exec {app} hold libcuda.so.1 {gib} < {}", fifo.display()),
    );
    let b_pid = s.batch_ready(&b_job);

    let status = s.wait_status("both jobs' programs hold 1 GiB on their jobs", |st| {
        [(a_job, a_pid), (b_job.id, b_pid)]
            .iter()
            .all(|&(job, pid)| {
                st.clients
                    .iter()
                    .any(|c| c.pid == pid && c.job == Some(job) && c.memory_used == GIB)
            })
    });
    for (job, user, shards, partition, class) in [
        (a_job, &s.a, 2u32, "debug", PriorityClass::Normal),
        (b_job.id, &s.b, 3, "interactive", PriorityClass::High),
    ] {
        let j = status
            .jobs
            .iter()
            .find(|j| j.job == job)
            .unwrap_or_else(|| panic!("no job {job} in {:#?}", status.jobs));
        assert_eq!(
            (j.uid, j.user.as_str(), j.partition.as_deref()),
            (user.uid, user.name.as_str(), Some(partition)),
            "{j:?}"
        );
        assert_eq!(
            (j.gpus.len(), j.gpus.first().map(|g| g.gpu), j.shards()),
            (1, Some(0), shards),
            "{j:?}"
        );
        assert_eq!(
            (j.memory_quota, j.class, j.weight),
            (u64::from(shards) * SHARD, class, shards),
            "the grant of {shards} shards in {partition}: {j:?}"
        );
        assert_eq!((j.memory_used, j.sessions), (GIB, 1), "{j:?}");
        // Its session runs on the job's grant, on the one GPU both share.
        let c = status
            .clients
            .iter()
            .find(|c| c.job == Some(job))
            .expect("the job's client");
        assert_eq!(
            (c.uid, c.gpu, c.class, c.weight),
            (user.uid, 0, class, shards),
            "{c:?}"
        );
    }

    // The first job ends with its program: its grant and session go, the other job's stay.
    let (exit, stderr) = step.finish();
    assert!(exit.success(), "srun: {exit}: {stderr}");
    assert!(
        s.slurm.wait_job_gone(a_job, PATIENCE),
        "job {a_job} did not end: {:?}\n{}",
        s.slurm.job_state(a_job),
        s.diagnostics()
    );
    let status = s.wait_status("job A leaves nothing after it ends", |st| {
        no_trace_of_job(st, a_job) && user_holds_nothing(st, s.a.uid)
    });
    assert!(
        status
            .jobs
            .iter()
            .any(|j| j.job == b_job.id && j.memory_used == GIB),
        "the other job's grant went too: {:#?}",
        status.jobs
    );

    drop(gate);
    assert!(
        s.slurm.wait_job_gone(b_job.id, PATIENCE),
        "batch job {} did not end with its program: {:?}; its output:\n{}\n{}",
        b_job.id,
        s.slurm.job_state(b_job.id),
        b_job.output_text(),
        s.diagnostics()
    );
    assert_eq!(
        s.slurm.job_state(b_job.id).as_deref(),
        Some("COMPLETED"),
        "{}",
        b_job.output_text()
    );
    s.wait_status("job B leaves nothing after it ends", |st| {
        no_trace_of_job(st, b_job.id) && st.clients.is_empty()
    });
}

pub(super) fn an_allocation_past_the_jobs_shards_is_refused(s: &Setup) {
    let app = s.app();
    // One shard is worth 2 GiB: 3 GiB is refused as the device would refuse it.
    let (status, out, err) = output_within(
        &mut s.slurm.srun_as(
            &s.a,
            &[
                "--gres=shard:1",
                &app,
                "hold",
                "libcuda.so.1",
                &(3 * GIB).to_string(),
            ],
        ),
        PATIENCE,
    );
    assert!(
        status.is_some_and(|st| !st.success()),
        "3 GiB on one shard ({status:?}): {out}{err}\n{}",
        s.diagnostics()
    );
    let refusal = err
        .lines()
        .find(|l| l.contains("cuMemAlloc"))
        .unwrap_or_else(|| panic!("no cuMemAlloc failure in: {out}{err}"));
    assert!(
        refusal.trim_end().ends_with(": 2"),
        "not CUDA_ERROR_OUT_OF_MEMORY: {refusal}"
    );

    // The same one shard holds all it is worth (the program frees and ends at once: no input).
    let (status, out, err) = output_within(
        &mut s.slurm.srun_as(
            &s.a,
            &[
                "--gres=shard:1",
                &app,
                "hold",
                "libcuda.so.1",
                &SHARD.to_string(),
            ],
        ),
        PATIENCE,
    );
    assert!(
        status.is_some_and(|st| st.success()) && ready_pid(&out).is_some(),
        "one shard's 2 GiB ({status:?}): {out}{err}\n{}",
        s.diagnostics()
    );
    s.wait_status("both jobs leave nothing", |st| {
        st.jobs.is_empty() && st.clients.is_empty() && user_holds_nothing(st, s.a.uid)
    });
}

pub(super) fn a_job_cancelled_mid_run_leaves_nothing_held(s: &Setup) {
    let app = s.app();
    // Its input stays open: the program would hold its memory until the job's end.
    let (fifo, _gate) = s.slurm.input_fifo("cancelled");
    let job = s.slurm.sbatch_as(
        &s.b,
        &["--job-name=gpushare-cancelled", "--gres=shard:2"],
        &format!("exec {app} hold libcuda.so.1 {GIB} < {}", fifo.display()),
    );
    let pid = s.batch_ready(&job);
    s.wait_status("the job's program holds 1 GiB", |st| {
        st.clients
            .iter()
            .any(|c| c.pid == pid && c.job == Some(job.id) && c.memory_used == GIB)
    });

    s.slurm.scancel(job.id);
    assert!(
        s.slurm.wait_job_gone(job.id, PATIENCE),
        "job {} did not end after scancel: {:?}\n{}",
        job.id,
        s.slurm.job_state(job.id),
        s.diagnostics()
    );
    assert_eq!(s.slurm.job_state(job.id).as_deref(), Some("CANCELLED"));
    s.wait_status("the cancelled job leaves nothing held", |st| {
        no_trace_of_job(st, job.id)
            && !st.clients.iter().any(|c| c.pid == pid)
            && user_holds_nothing(st, s.b.uid)
    });
}

pub(super) fn a_program_left_running_when_its_job_ends_loses_its_session(s: &Setup) {
    let app = s.app();
    // The batch script starts the program in the background and ends once it holds its
    // memory: the job is over, and the program, no longer a child of the job's step, lives
    // on (Slurm's proctrack/linuxproc follows processes by their parents). Only the epilog
    // can take its session.
    let (fifo, gate) = s.slurm.input_fifo("left-running");
    let out = s.slurm.work_dir().join("left-running.out");
    let (fifo, out_arg) = (fifo.display(), out.display());
    let job = s.slurm.sbatch_as(
        &s.a,
        &["--job-name=gpushare-left-running", "--gres=shard:2"],
        &format!(
            "{app} hold libcuda.so.1 {GIB} < {fifo} > {out_arg} 2>&1 &\n\
             while kill -0 $! 2>/dev/null; do grep -q '^ready' {out_arg} && exit 0; sleep 0.1; done\n\
             exit 1"
        ),
    );
    assert!(
        s.slurm.wait_job_gone(job.id, PATIENCE),
        "job {} did not end: {:?}\n{}",
        job.id,
        s.slurm.job_state(job.id),
        s.diagnostics()
    );
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(
        s.slurm.job_state(job.id).as_deref(),
        Some("COMPLETED"),
        "the program did not get ready in its job: {said}\n{}",
        s.diagnostics()
    );
    let pid = ready_pid(&said).expect("the program's ready line");
    let alive = || Path::new(&format!("/proc/{pid}")).exists();

    s.wait_status("the ended job's program loses its session", |st| {
        no_trace_of_job(st, job.id)
            && !st.clients.iter().any(|c| c.pid == pid)
            && user_holds_nothing(st, s.a.uid)
    });
    assert!(
        alive(),
        "the program ended by itself, so this showed nothing: {}",
        std::fs::read_to_string(&out).unwrap_or_default()
    );
    // Its input ends: it frees (on a session that is gone) and exits, without hanging.
    drop(gate);
    let ended = wait_until(PATIENCE, || !alive());
    if !ended {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        ended,
        "the evicted program hangs: {}",
        std::fs::read_to_string(&out).unwrap_or_default()
    );
}
