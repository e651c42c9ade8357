//! What a device looks like, as the broker tells its clients, and finding one by UUID.

use serde::{Deserialize, Serialize};

/// What the device looks like.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub total_memory: u64,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
    /// Peak FP32 rate the scheduler and the sim cost model assume, in FLOP/s.
    pub fp32_flops: f64,
    /// Peak device memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Host↔device copy bandwidth, bytes/s.
    pub host_bandwidth: f64,
    pub uuid: [u8; 16],
    /// PCI domain, bus and device.
    pub pci: (u32, u32, u32),
    /// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. 13000.
    pub driver_version: i32,
    /// `CUdevice_attribute` values, indexed by attribute number (0 where unknown).
    pub attributes: Vec<i32>,
}

/// The device `text` names as `CUDA_VISIBLE_DEVICES` may: its UUID (`GPU-…`, any case) or a
/// start of it that no other device's shares; else why none.
pub fn device_by_uuid<'a>(devices: &'a [DeviceInfo], text: &str) -> Result<&'a DeviceInfo, String> {
    if text.len() <= 4 || !text[..4].eq_ignore_ascii_case("GPU-") {
        return Err(format!("`{text}` is not a GPU UUID"));
    }
    let wanted = text.to_ascii_lowercase();
    let mut matches = devices
        .iter()
        .filter(|d| d.uuid_text().to_ascii_lowercase().starts_with(&wanted));
    match (matches.next(), matches.next()) {
        (Some(d), None) => Ok(d),
        (None, _) => Err(format!("no GPU has the UUID {text}")),
        (Some(_), Some(_)) => Err(format!("{text} is the start of several GPUs' UUIDs")),
    }
}

impl DeviceInfo {
    /// Its UUID as NVML and `CUDA_VISIBLE_DEVICES` write it: `GPU-` and 8-4-4-4-12 hex digits.
    pub fn uuid_text(&self) -> String {
        let hex: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_uuid_is_written_as_nvml_writes_it() {
        let mut d = crate::fuzzing::messages::device(0);
        d.uuid = [
            0xfe, 0xf8, 0x08, 0x9b, 0x48, 0x20, 0xab, 0xfc, 0xe8, 0x3e, 0x94, 0x31, 0x81, 0x97,
            0x57, 0x6e,
        ];
        assert_eq!(d.uuid_text(), "GPU-fef8089b-4820-abfc-e83e-94318197576e");
    }
}
