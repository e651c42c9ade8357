//! Modules on the sim device: a small text format of its own, so that what a client's modules
//! go through in gpushared (loading, functions, packed parameters, launches, the scheduler's
//! turns and measured profiles, accounting) is tested without a GPU. Real images (PTX, cubin,
//! fatbin) are refused, as before: the sim runs no device code.
//!
//! ```text
//! gpushare-sim-module 1
//! kernel spin
//! ```
//!
//! `kernel NAME` declares a function that occupies the device for as many microseconds as its
//! one parameter says (a `u64`, packed at offset 0), like the built-in `Spin` kernel.

use gpushare_protocol::text::Printable;

use crate::device::{DeviceError, DeviceResult, FunctionShape};

/// The first line of a sim module.
pub const MAGIC: &str = "gpushare-sim-module 1";
/// Most functions one sim module may declare.
const MAX_KERNELS: usize = 256;

/// A loaded sim module: the names of its functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimModule {
    kernels: Vec<String>,
}

/// A function of a sim module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFunction {
    name: String,
}

impl SimModule {
    /// The module `image` holds, if it is a sim module (`None`: it is not one at all).
    pub fn parse(image: &[u8]) -> Option<DeviceResult<SimModule>> {
        let text = std::str::from_utf8(image).ok()?;
        let text = text.trim_end_matches('\0');
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        if lines.next()? != MAGIC {
            return None;
        }
        let mut kernels = Vec::new();
        for line in lines {
            let bad = || {
                DeviceError::InvalidArgument(format!(
                    "cannot load module: sim module line `{line}`: expected `kernel NAME`"
                ))
            };
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("kernel"), Some(name), None)
                    if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                {
                    kernels.push(name.to_string());
                }
                _ => return Some(Err(bad())),
            }
            if kernels.len() > MAX_KERNELS {
                return Some(Err(DeviceError::InvalidArgument(format!(
                    "cannot load module: more than {MAX_KERNELS} sim kernels"
                ))));
            }
        }
        Some(Ok(SimModule { kernels }))
    }

    /// Its functions' names, in the order the image declares them.
    pub fn names(&self) -> &[String] {
        &self.kernels
    }

    pub fn function(&self, name: &str) -> DeviceResult<SimFunction> {
        if self.kernels.iter().any(|k| k == name) {
            Ok(SimFunction {
                name: name.to_string(),
            })
        } else {
            Err(DeviceError::NotFound(format!(
                "no function `{}` in module",
                Printable(name)
            )))
        }
    }
}

impl SimFunction {
    /// The dynamic shared memory a block of a sim function may ask for: CUDA's 48 KiB for a
    /// function that did not opt in to more (the sim sets no function attributes).
    pub const MAX_DYNAMIC_SHARED: u32 = 48 << 10;

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its layout (one `u64` at offset 0) and the attributes a driver asks for, by
    /// `CUfunction_attribute` number: 1,024 threads a block, no shared, constant or local
    /// memory, 32 registers, PTX and binary version 9.0.
    pub fn shape(&self) -> FunctionShape {
        FunctionShape {
            params: vec![(0, 8)],
            attributes: vec![
                1024,
                0,
                0,
                0,
                32,
                90,
                90,
                0,
                Self::MAX_DYNAMIC_SHARED as i32,
                0,
            ],
        }
    }

    /// The microseconds a launch with packed `params` occupies the device.
    pub fn micros(&self, params: &[u8]) -> DeviceResult<u64> {
        let word = params.get(..8).ok_or_else(|| {
            DeviceError::InvalidArgument(format!(
                "`{}` takes one u64 parameter ({} bytes given)",
                self.name,
                params.len()
            ))
        })?;
        let mut b = [0u8; 8];
        b.copy_from_slice(word);
        Ok(u64::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sim_module_declares_kernels_and_other_images_are_not_one() {
        let m = SimModule::parse(b"gpushare-sim-module 1\nkernel spin\n  kernel other_1 \n\0")
            .expect("a sim module")
            .expect("valid");
        assert_eq!(m.function("spin").expect("spin").name(), "spin");
        assert!(m.function("other_1").is_ok());
        assert!(m.function("nope").is_err());
        assert_eq!(m.names(), ["spin", "other_1"], "in the image's order");
        assert!(
            SimModule::parse(b".version 8.0\n.target sm_90\n").is_none(),
            "PTX"
        );
        assert!(SimModule::parse(b"\x7fELF\x02\x01").is_none(), "cubin");
        assert!(
            SimModule::parse(b"gpushare-sim-module 1\nkernel a b\n")
                .expect("a sim module")
                .is_err(),
            "a line that says more"
        );
        assert!(
            SimModule::parse(b"gpushare-sim-module 1\nkernel a;rm\n")
                .expect("a sim module")
                .is_err()
        );
    }

    #[test]
    fn a_spin_takes_its_microseconds_from_its_packed_parameter() {
        let f = SimFunction {
            name: "spin".into(),
        };
        assert_eq!(f.micros(&1500u64.to_le_bytes()).expect("micros"), 1500);
        assert!(f.micros(&[1, 2, 3]).is_err());
        assert_eq!(f.shape().params, vec![(0, 8)]);
    }
}
