//! The kubelet's gRPC APIs, generated from their protos (`k8s/proto/`, as published in
//! k8s.io/kubelet) by tonic-build 0.12.3 with protox, and checked in so that building needs no
//! protoc. `scripts/gen-k8s-api.sh` makes them again.

/// The device plugin API (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1`): the kubelet's
/// `Registration` service and the plugin's `DevicePlugin`.
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::unwrap_used, missing_docs)]
pub mod v1beta1;

/// The pod resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`): which pod's container
/// holds which devices.
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::unwrap_used, missing_docs)]
pub mod v1;

/// The device plugin API's version, as `RegisterRequest.version` names it.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";
/// A device the kubelet may hand out.
pub const HEALTHY: &str = "Healthy";
/// A device the kubelet must not hand out.
pub const UNHEALTHY: &str = "Unhealthy";
