//! A pod's service account, read on the node: the kubelet writes each pod's projected
//! service-account token (a JWT) at
//! `/var/lib/kubelet/pods/<pod uid>/volumes/kubernetes.io~projected/<volume>/token`, and a
//! bound token's claims name its namespace, pod and service account. The pod resources API
//! does not carry the service account, and the plugin has no API server access.
//!
//! The signature is not checked: we have no key, and only the kubelet writes these files. What
//! a pod's author could place there (a projected secret at path `token`) can only name a
//! service account of the pod's own namespace, which the author could run the pod as anyway;
//! a token naming another pod, or a pod of another uid than its directory, is not used.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use serde::Deserialize;

/// The kubelet's directory for projected volumes, within a pod's `volumes/`.
const PROJECTED: &str = "kubernetes.io~projected";
/// A token larger than this is not one (they are about a kilobyte).
const MAX_TOKEN: u64 = 64 << 10;

/// What a service-account token says about who holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub namespace: String,
    pub service_account: String,
    /// The pod it is bound to: a bound token's; a legacy (secret) token names none.
    pub pod: Option<BoundPod>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    pub name: String,
    pub uid: Option<String>,
}

/// A JWT payload's claims we read: the bound token's `kubernetes.io` object, or a legacy
/// token's flat `kubernetes.io/serviceaccount/…` claims.
#[derive(Deserialize)]
struct Payload {
    #[serde(rename = "kubernetes.io")]
    bound: Option<Bound>,
    #[serde(rename = "kubernetes.io/serviceaccount/namespace")]
    legacy_namespace: Option<String>,
    #[serde(rename = "kubernetes.io/serviceaccount/service-account.name")]
    legacy_service_account: Option<String>,
}

#[derive(Deserialize)]
struct Bound {
    namespace: String,
    pod: Option<Named>,
    serviceaccount: Named,
}

#[derive(Deserialize)]
struct Named {
    name: String,
    uid: Option<String>,
}

/// The claims of `token` (`header.payload.signature`), signature unchecked.
pub fn claims(token: &str) -> anyhow::Result<Claims> {
    let mut parts = token.trim().split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        bail!("not a JWT (three dot-separated parts)");
    };
    let json = base64url(payload).ok_or_else(|| anyhow!("its payload is not base64url"))?;
    let p: Payload = serde_json::from_slice(&json).context("its payload is not JSON claims")?;
    match (p.bound, p.legacy_namespace, p.legacy_service_account) {
        (Some(b), _, _) => Ok(Claims {
            namespace: b.namespace,
            service_account: b.serviceaccount.name,
            pod: b.pod.map(|pod| BoundPod {
                name: pod.name,
                uid: pod.uid,
            }),
        }),
        (None, Some(namespace), Some(service_account)) => Ok(Claims {
            namespace,
            service_account,
            pod: None,
        }),
        _ => bail!("it names no namespace and service account"),
    }
}

/// Decodes unpadded (or padded) base64url, as JWTs use; `None` if it is not.
fn base64url(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The service account of each pod with a bound token on this node, by namespace and name.
#[derive(Debug, Default)]
pub struct ServiceAccounts {
    /// `None`: its tokens disagree, so none is believed.
    by_pod: HashMap<(String, String), Option<String>>,
}

impl ServiceAccounts {
    /// Reads every pod's projected tokens under `pods_dir` (the kubelet's `pods/`). What
    /// cannot be read is skipped: that pod's service account stays unknown.
    pub fn scan(pods_dir: &Path) -> ServiceAccounts {
        let mut found = ServiceAccounts::default();
        let Ok(pods) = std::fs::read_dir(pods_dir) else {
            return found;
        };
        for pod in pods.flatten() {
            let uid = pod.file_name().to_string_lossy().into_owned();
            let Ok(volumes) = std::fs::read_dir(pod.path().join("volumes").join(PROJECTED)) else {
                continue;
            };
            for volume in volumes.flatten() {
                let Some(token) = read_token(&volume.path().join("token")) else {
                    continue;
                };
                if let Ok(c) = claims(&token) {
                    found.add(&uid, c);
                }
            }
        }
        found
    }

    /// Counts a token found in pod directory `uid`: only a bound token for that very pod.
    fn add(&mut self, uid: &str, c: Claims) {
        let Some(pod) = c.pod else { return };
        if pod.uid.as_deref().is_some_and(|u| u != uid) {
            return;
        }
        let key = (c.namespace, pod.name);
        let account = Some(c.service_account);
        match self.by_pod.get(&key) {
            Some(seen) if *seen != account => {
                self.by_pod.insert(key, None);
            }
            Some(_) => {}
            None => {
                self.by_pod.insert(key, account);
            }
        }
    }

    /// The service account of pod `name` in `namespace`, if its tokens say one.
    pub fn of(&self, namespace: &str, name: &str) -> Option<&str> {
        self.by_pod
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|a| a.as_deref())
    }
}

/// A token file's text, if it is a small readable file.
fn read_token(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_TOKEN).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests;
