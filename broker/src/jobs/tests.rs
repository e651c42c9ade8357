use super::*;

const GIB: u64 = 1 << 30;

fn policy() -> SlurmPolicy {
    crate::access::Policy::parse(
        "[slurm]\nshards_per_gpu = 8\n[slurm.partitions]\ninteractive = \"high\"\n",
        "test",
    )
    .expect("policy")
    .slurm()
    .expect("[slurm]")
}

fn start(job: u64, gpus: &[(u32, Option<u32>)], partition: Option<&str>) -> JobStart {
    JobStart {
        job,
        uid: 1000,
        user: "alice".into(),
        gpus: gpus
            .iter()
            .map(|&(gpu, shards)| JobGpu { gpu, shards })
            .collect(),
        partition: partition.map(str::to_string),
        qos: None,
    }
}

#[test]
fn a_job_s_shards_give_it_their_memory_weight_and_its_partition_s_class() {
    let jobs = Jobs::default();
    let job = jobs
        .start(
            &start(12, &[(0, Some(3))], Some("interactive")),
            &policy(),
            &[16 * GIB],
        )
        .expect("started");
    let grant = job.grant();
    assert_eq!(grant.memory_quota, Some(6 * GIB));
    assert_eq!(grant.weight, 3);
    assert_eq!(grant.class, PriorityClass::High);
    let whole = jobs
        .start(
            &start(13, &[(0, None), (1, Some(2))], None),
            &policy(),
            &[16 * GIB, 8 * GIB],
        )
        .expect("started");
    assert_eq!(whole.grant().memory_quota, Some(18 * GIB));
    assert_eq!(whole.grant().weight, 10);
    assert_eq!(whole.grant().class, PriorityClass::Normal);
    assert_eq!(whole.stats((0, 0)).shards(), 10);
}

#[test]
fn a_job_on_a_gpu_gpushared_lacks_or_with_no_shards_is_refused() {
    let jobs = Jobs::default();
    assert_eq!(
        jobs.start(&start(1, &[(2, Some(1))], None), &policy(), &[16 * GIB])
            .map(|_| ()),
        Err(JobRefusal::NoSuchGpu {
            job: 1,
            gpu: 2,
            count: 1
        })
    );
    assert_eq!(
        jobs.start(&start(2, &[(0, Some(0))], None), &policy(), &[16 * GIB])
            .map(|_| ()),
        Err(JobRefusal::NoShares(2))
    );
    assert!(jobs.all().is_empty());
}

#[test]
fn a_job_s_sessions_share_its_quota_and_its_gpu_time_outlives_them() {
    let jobs = Jobs::default();
    let job = jobs
        .start(&start(7, &[(0, Some(1))], None), &policy(), &[8 * GIB])
        .expect("started");
    assert_eq!(job.charge(GIB / 2), Ok(()));
    assert_eq!(job.charge(GIB / 2), Ok(()));
    assert_eq!(job.charge(1), Err(ErrorCode::OutOfQuota));
    job.release(GIB / 2);
    assert_eq!(job.memory_used(), GIB / 2);
    job.session_started();
    job.session_ended(5_000);
    let stats = job.stats((1, 2_000));
    assert_eq!(stats.gpu_time_ns, 7_000);
    assert_eq!((stats.sessions, stats.sessions_total), (1, 1));
    assert!(jobs.end(7).is_some());
    assert!(jobs.end(7).is_none(), "a job ends once");
}

#[test]
fn a_prolog_that_runs_twice_keeps_the_job_its_sessions_hold_memory_against() {
    let jobs = Jobs::default();
    let first = jobs
        .start(&start(9, &[(0, Some(1))], None), &policy(), &[8 * GIB])
        .expect("started");
    first.charge(GIB / 4).expect("charged");
    let again = jobs
        .start(&start(9, &[(0, Some(1))], None), &policy(), &[8 * GIB])
        .expect("started");
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(again.memory_used(), GIB / 4);
}

#[test]
fn a_session_runs_on_the_job_s_first_gpu_unless_it_asks_for_another_the_job_holds() {
    let jobs = Jobs::default();
    let job = jobs
        .start(
            &start(3, &[(1, Some(2)), (2, Some(2))], None),
            &policy(),
            &[GIB; 3],
        )
        .expect("started");
    assert_eq!(job.gpu_for(None), 1);
    assert_eq!(job.gpu_for(Some(2)), 2);
    assert_eq!(job.gpu_for(Some(0)), 1, "not the job's: its first");
}

#[test]
fn an_administrators_quota_for_a_job_is_at_most_its_gpus_memory() {
    let jobs = Jobs::default();
    let job = jobs
        .start(
            &start(9, &[(0, Some(2)), (1, Some(1))], None),
            &policy(),
            &[8 * GIB, 4 * GIB],
        )
        .expect("started");
    job.set_quota(None);
    assert_eq!(job.quota(), 12 * GIB, "unlimited: all of its GPUs' memory");
    assert_eq!(job.stats((0, 0)).memory_quota, 12 * GIB);
    job.set_quota(Some(64 * GIB));
    assert_eq!(job.quota(), 12 * GIB, "never more");
    job.set_quota(Some(GIB));
    assert_eq!(job.quota(), GIB);
}
