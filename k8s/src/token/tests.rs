use super::*;

/// Unpadded base64url, as a JWT's parts are written.
fn encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn jwt(payload: &serde_json::Value) -> String {
    format!(
        "{}.{}.c2lnbmF0dXJl",
        encode(br#"{"alg":"RS256","kid":"k"}"#),
        encode(payload.to_string().as_bytes())
    )
}

fn bound(namespace: &str, pod: &str, pod_uid: &str, account: &str) -> serde_json::Value {
    serde_json::json!({
        "aud": ["https://kubernetes.default.svc"],
        "iss": "https://kubernetes.default.svc",
        "sub": format!("system:serviceaccount:{namespace}:{account}"),
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": pod, "uid": pod_uid},
            "serviceaccount": {"name": account, "uid": "5a1e"},
            "warnafter": 1700000000
        }
    })
}

#[test]
fn base64url_round_trips_every_length_and_refuses_other_alphabets() {
    for len in 0..8 {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 77 + 250) as u8).collect();
        assert_eq!(base64url(&encode(&bytes)), Some(bytes));
    }
    assert_eq!(
        base64url("aGk="),
        Some(b"hi".to_vec()),
        "padding is allowed"
    );
    assert_eq!(
        base64url("a+b/"),
        None,
        "standard base64's characters are not base64url"
    );
    assert_eq!(base64url("abcde"), None, "a length no encoding has");
}

#[test]
fn a_bound_token_names_its_namespace_pod_and_service_account() {
    let c = claims(&jwt(&bound("ml-prod", "trainer-0", "u-1", "trainer"))).expect("claims");
    assert_eq!(
        c,
        Claims {
            namespace: "ml-prod".into(),
            service_account: "trainer".into(),
            pod: Some(BoundPod {
                name: "trainer-0".into(),
                uid: Some("u-1".into()),
            }),
        }
    );
}

#[test]
fn a_legacy_token_names_a_namespace_and_service_account_but_no_pod() {
    let legacy = serde_json::json!({
        "iss": "kubernetes/serviceaccount",
        "kubernetes.io/serviceaccount/namespace": "batch",
        "kubernetes.io/serviceaccount/secret.name": "runner-token-x1",
        "kubernetes.io/serviceaccount/service-account.name": "runner",
        "kubernetes.io/serviceaccount/service-account.uid": "5a1e",
        "sub": "system:serviceaccount:batch:runner"
    });
    let c = claims(&jwt(&legacy)).expect("claims");
    assert_eq!(
        (c.namespace.as_str(), c.service_account.as_str()),
        ("batch", "runner")
    );
    assert_eq!(c.pod, None);
}

#[test]
fn what_is_not_a_token_with_those_claims_is_refused() {
    assert!(claims("not a token").is_err());
    assert!(claims("a.b").is_err(), "two parts");
    assert!(claims("a.b.c.d").is_err(), "four parts");
    assert!(claims("eyJ9.!!!.sig").is_err(), "bad base64");
    assert!(claims(&format!("h.{}.s", encode(b"not json"))).is_err());
    let no_claims = serde_json::json!({"sub": "system:serviceaccount:a:b"});
    assert!(claims(&jwt(&no_claims)).is_err(), "no kubernetes claims");
    let no_account = serde_json::json!({"kubernetes.io": {"namespace": "a", "pod": {"name": "p"}}});
    assert!(claims(&jwt(&no_account)).is_err(), "no service account");
    let legacy_half = serde_json::json!({"kubernetes.io/serviceaccount/namespace": "a"});
    assert!(claims(&jwt(&legacy_half)).is_err(), "a namespace alone");
}

/// Writes `token` where the kubelet puts pod `uid`'s projected token in `volume`.
fn project(pods: &Path, uid: &str, volume: &str, token: &str) {
    let dir = pods.join(uid).join("volumes").join(PROJECTED).join(volume);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("token"), token).expect("write the token");
}

#[test]
fn a_pod_s_service_account_comes_from_its_own_bound_token_only() {
    let pods = tempfile::tempdir().expect("temp dir");
    let p = pods.path();
    project(
        p,
        "u-1",
        "kube-api-access-x",
        &jwt(&bound("ml-prod", "trainer-0", "u-1", "trainer")),
    );
    // A second token of the same pod (another audience) agrees.
    project(
        p,
        "u-1",
        "vault",
        &jwt(&bound("ml-prod", "trainer-0", "u-1", "trainer")),
    );
    // A token in pod u-2's directory whose claims name another pod's uid is not used.
    project(
        p,
        "u-2",
        "kube-api-access-y",
        &jwt(&bound("ml-prod", "worker-0", "u-9", "trainer")),
    );
    // Tokens that disagree: neither is believed.
    project(
        p,
        "u-3",
        "kube-api-access-z",
        &jwt(&bound("batch", "job-0", "u-3", "runner")),
    );
    project(
        p,
        "u-3",
        "forged",
        &jwt(&bound("batch", "job-0", "u-3", "admin")),
    );
    // Garbage and a legacy token are skipped.
    project(p, "u-4", "kube-api-access-w", "garbage");
    let legacy = serde_json::json!({
        "kubernetes.io/serviceaccount/namespace": "ml-prod",
        "kubernetes.io/serviceaccount/service-account.name": "trainer"
    });
    project(p, "u-5", "old", &jwt(&legacy));

    let found = ServiceAccounts::scan(p);
    assert_eq!(found.of("ml-prod", "trainer-0"), Some("trainer"));
    assert_eq!(
        found.of("default", "trainer-0"),
        None,
        "another namespace's pod"
    );
    assert_eq!(found.of("ml-prod", "worker-0"), None);
    assert_eq!(found.of("batch", "job-0"), None);
    assert_eq!(found.of("ml-prod", "nobody"), None);
    assert_eq!(
        ServiceAccounts::scan(&p.join("missing")).of("ml-prod", "trainer-0"),
        None,
        "no pods directory"
    );
}
