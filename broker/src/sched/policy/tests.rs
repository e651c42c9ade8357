use super::PolicyKind;

#[test]
fn policy_kinds_parse_and_print() {
    for k in PolicyKind::ALL {
        assert_eq!(k.as_str().parse::<PolicyKind>(), Ok(k));
        assert_eq!(k.to_string(), k.as_str());
    }
    assert_eq!(" FAIR ".parse::<PolicyKind>(), Ok(PolicyKind::Fair));
    assert!("lottery".parse::<PolicyKind>().is_err());
}
