//! The schema check of the Kubernetes manifests gpushare ships (packaging/kubernetes/*.yaml):
//! every document must be an object of a kind the check knows, read by the Kubernetes API's
//! own types (k8s-openapi, generated from the API's OpenAPI spec, release 1.30) and written
//! back unchanged. A field the API does not have (a misspelling) is dropped on the way and
//! shows as a difference; a value of the wrong type fails to read.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
}

/// `doc` read as a `T` and written back.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// `doc` through the API type its `apiVersion` and `kind` name.
fn check(doc: &Value) -> Result<Value, String> {
    use k8s_openapi::api::{apps, core, node, rbac, scheduling};
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    match (api, kind) {
        ("v1", "Namespace") => round_trip::<core::v1::Namespace>(doc),
        ("v1", "ServiceAccount") => round_trip::<core::v1::ServiceAccount>(doc),
        ("v1", "Pod") => round_trip::<core::v1::Pod>(doc),
        ("v1", "ConfigMap") => round_trip::<core::v1::ConfigMap>(doc),
        ("apps/v1", "DaemonSet") => round_trip::<apps::v1::DaemonSet>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac::v1::ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<rbac::v1::ClusterRoleBinding>(doc)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac::v1::Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac::v1::RoleBinding>(doc),
        ("scheduling.k8s.io/v1", "PriorityClass") => {
            round_trip::<scheduling::v1::PriorityClass>(doc)
        }
        ("node.k8s.io/v1", "RuntimeClass") => round_trip::<node::v1::RuntimeClass>(doc),
        _ => Err(format!(
            "kind {kind:?} of apiVersion {api:?} is not one this check knows: add its type"
        )),
    }
}

/// Paths where `a` and `b` differ, at most a few.
fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    if out.len() >= 8 {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => differences(v, w, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k}: not a field of the API")),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!("{at}.{k}: added on the way"));
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                differences(v, w, &format!("{at}[{i}]"), out);
            }
        }
        _ if a != b => out.push(format!("{at}: {a} became {b}")),
        _ => {}
    }
}

#[test]
fn every_shipped_manifest_is_valid_for_the_kubernetes_api() {
    let files = manifests();
    assert!(
        files.iter().any(|f| f.ends_with("plugin.yaml")),
        "no packaging/kubernetes/plugin.yaml among {files:?}"
    );
    let mut problems = Vec::new();
    let mut kinds = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let where_ = format!("{} document {}", file.display(), i + 1);
            let value = match <Value as serde::Deserialize>::deserialize(doc) {
                Ok(Value::Null) => continue, // an empty document (a trailing `---`)
                Ok(v) => v,
                Err(e) => {
                    problems.push(format!("{where_}: not YAML: {e}"));
                    continue;
                }
            };
            kinds.push(value["kind"].as_str().unwrap_or_default().to_string());
            match check(&value) {
                Ok(back) => {
                    let mut diffs = Vec::new();
                    differences(&value, &back, "", &mut diffs);
                    for d in diffs {
                        problems.push(format!("{where_}: {d}"));
                    }
                }
                Err(e) => problems.push(format!("{where_}: {e}")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for kind in ["DaemonSet", "ServiceAccount", "Pod"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} among {kinds:?}");
    }
}

#[test]
fn a_misspelled_field_and_a_wrong_type_are_caught() {
    let doc: Value = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"nodeSelecter": {"a": "b"}, "containers": []}}
        }
    });
    let back = check(&doc).expect("reads");
    let mut diffs = Vec::new();
    differences(&doc, &back, "", &mut diffs);
    assert_eq!(
        diffs,
        [".spec.template.spec.nodeSelecter: not a field of the API"]
    );
    let wrong = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "c", "securityContext": {"runAsUser": "root"}}]}
    });
    assert!(check(&wrong).is_err());
}
