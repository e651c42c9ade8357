//! Accounts: shared quotas, bounds, fault storms.

use super::*;

fn joining(uid: u32, user: &str, quota: Option<u64>) -> Joining<'_> {
    Joining {
        uid,
        user,
        quota,
        bounds: Bounds {
            max_sessions: 3,
            max_pinned: Some(1000),
            ..Bounds::unbounded()
        },
        region_bytes: 100,
        faults: FaultLimit::default(),
    }
}

#[test]
fn sessions_of_one_user_share_one_quota() {
    let accounts = Arc::new(Accounts::default());
    let one = accounts
        .join(joining(1000, "alice", Some(100)))
        .expect("join");
    let two = accounts
        .join(joining(1000, "alice", Some(100)))
        .expect("join");
    assert!(Arc::ptr_eq(one.account(), two.account()));
    one.account().charge(60).expect("within the quota");
    assert_eq!(
        two.account().charge(60),
        Err(ErrorCode::OutOfQuota),
        "the first session's 60 bytes count for the second"
    );
    two.account().charge(40).expect("what is left");
    assert_eq!(one.account().memory_used(), 100);
    let other = accounts
        .join(joining(1001, "bob", Some(100)))
        .expect("join");
    other
        .account()
        .charge(100)
        .expect("another user's quota is untouched");
    let users = accounts.snapshot();
    assert_eq!(users.len(), 2);
    assert_eq!(
        (
            users[0].user.as_str(),
            users[0].sessions,
            users[0].memory_used,
            users[0].pinned_bytes
        ),
        ("alice", 2, 100, 200)
    );
}

#[test]
fn a_failed_charge_changes_nothing_and_release_never_goes_below_zero() {
    let account = UserAccount::new(1, "u".into(), Some(10));
    assert_eq!(account.charge(11), Err(ErrorCode::OutOfQuota));
    assert_eq!(account.charge(u64::MAX), Err(ErrorCode::OutOfQuota));
    assert_eq!(account.memory_used(), 0);
    account.charge_held(20);
    assert_eq!(
        account.memory_used(),
        20,
        "held memory counts past the quota"
    );
    assert_eq!(account.charge(1), Err(ErrorCode::OutOfQuota));
    account.release(30);
    assert_eq!(account.memory_used(), 0);
    let unlimited = UserAccount::new(2, "v".into(), None);
    unlimited.charge(u64::MAX - 1).expect("no quota");
    unlimited
        .charge(u64::MAX)
        .expect("no quota refuses nothing");
    assert_eq!(unlimited.quota(), None);
}

#[test]
fn a_charge_refused_while_another_session_ends_waits_for_its_memory() {
    let account = Arc::new(UserAccount::new(1, "u".into(), Some(100)));
    account.charge(100).expect("the first program's memory");
    let leaving = account.leaving();
    let next = {
        let account = account.clone();
        std::thread::spawn(move || account.charge(100))
    };
    // Refused at first, the charge waits for the ending session ...
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while account.leavers.waiting() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the charge never waited"
        );
        std::thread::yield_now();
    }
    // ... which gives its memory back, then is gone.
    account.release(100);
    drop(leaving);
    assert_eq!(next.join().expect("the charging thread"), Ok(()));
    assert_eq!(account.memory_used(), 100);
    // With no session ending a refusal is at once.
    assert_eq!(account.charge(1), Err(ErrorCode::OutOfQuota));
}

#[test]
fn the_latest_session_brings_the_policys_quota_and_idle_accounts_go() {
    let accounts = Arc::new(Accounts::default());
    let first = accounts.join(joining(7, "carol", Some(100))).expect("join");
    let second = accounts.join(joining(7, "carol", Some(300))).expect("join");
    assert_eq!(first.account().quota(), Some(300));
    first.account().charge(5).expect("charge");
    drop(first);
    drop(second);
    assert!(
        accounts.get(7).is_some(),
        "memory not yet given back keeps the account"
    );
    if let Some(a) = accounts.get(7) {
        a.release(5);
        assert_eq!(a.pinned(), 0, "the seats gave their regions back");
    }
    accounts.tidy(7);
    assert!(accounts.get(7).is_none());
    assert!(accounts.snapshot().is_empty());
}

#[test]
fn a_user_whose_programs_keep_faulting_is_refused_for_a_while() {
    let accounts = Arc::new(Accounts::default());
    let limit = FaultLimit {
        max_faults: 2,
        window: std::time::Duration::from_secs(60),
        refuse: std::time::Duration::from_secs(30),
    };
    let with_limit = |uid, user| Joining {
        faults: limit,
        ..joining(uid, user, None)
    };
    let root = accounts.join(with_limit(0, "root")).expect("joins");
    for _ in 0..3 {
        assert_eq!(root.account().note_fault(), None, "root is never refused");
    }
    let seat = accounts.join(with_limit(9, "mallory")).expect("joins");
    let account = seat.account().clone();
    assert_eq!(account.note_fault(), None, "one fault is not a storm");
    drop(seat);
    assert!(accounts.get(9).is_some(), "the fault is remembered");
    let seat = accounts.join(with_limit(9, "mallory")).expect("joins");
    let refused = seat.account().note_fault().expect("the second fault");
    assert_eq!(refused, limit.refuse);
    drop(seat);
    let e = accounts
        .join(with_limit(9, "mallory"))
        .expect_err("refused meanwhile");
    assert_eq!(e.code(), ErrorCode::PermissionDenied);
    assert!(e.to_string().contains("faulted the GPU 2 times"), "{e}");
    assert!(
        accounts.join(with_limit(10, "alice")).is_ok(),
        "others are not"
    );
    let off = FaultLimit {
        max_faults: 0,
        ..limit
    };
    let seat = accounts
        .join(Joining {
            faults: off,
            ..joining(11, "bob", None)
        })
        .expect("joins");
    assert_eq!(seat.account().note_fault(), None);
    assert_eq!(seat.account().note_fault(), None, "never, when off");
}

#[test]
fn sessions_and_pinned_memory_past_the_bounds_are_refused_with_the_reason() {
    let accounts = Arc::new(Accounts::default());
    let seats: Vec<Seat> = (0..3)
        .map(|_| {
            accounts
                .join(joining(5, "dave", None))
                .expect("within max_sessions")
        })
        .collect();
    let refused = accounts
        .join(joining(5, "dave", None))
        .expect_err("a fourth session");
    assert_eq!(
        refused.to_string(),
        "user `dave` (uid 5) has 3 sessions open, the most the policy's max_sessions allows: end one, or ask the administrator"
    );
    let account = seats[0].account().clone();
    assert_eq!((account.sessions(), account.pinned()), (3, 300));
    account.pin(700).expect("up to max_pinned_memory");
    let why = account.pin(1).expect_err("one byte past it").to_string();
    assert!(why.contains("max_pinned_memory of 1000 B"), "{why}");
    account.unpin(700);
    drop(seats);
    let big = Joining {
        region_bytes: 1001,
        ..joining(5, "dave", None)
    };
    let why = accounts
        .join(big)
        .expect_err("a region past the bound")
        .to_string();
    assert!(why.starts_with("user `dave` (uid 5) holds 0 B"), "{why}");
    assert!(accounts.get(5).is_none(), "a refused join leaves nothing");
    let other = accounts.join(joining(6, "erin", None));
    assert!(other.is_ok(), "other users are not held back");
}
