//! Kernels and functions: one object per (image, name), made without asking the broker; the
//! function's layout and attributes come from the broker at first use, and attributes the
//! program sets are kept here.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int};
use std::sync::{Arc, Mutex, OnceLock};

use gpushare_protocol::Command;
use gpushare_protocol::control::{BrokerMessage, ClientMessage, FunctionDetails};

use super::{Image, Modules, module_error, module_load_error};
use crate::driver::Driver;
use crate::status::Cu;
use crate::types::{func_attr, result};

/// A function's layout and attributes, from the broker.
#[derive(Debug)]
pub struct FunctionInfo {
    pub id: u64,
    pub params: Vec<(u32, u32)>,
    /// Bytes of the packed parameter buffer.
    pub params_size: usize,
    pub attributes: Vec<i32>,
}

impl From<FunctionDetails> for FunctionInfo {
    fn from(d: FunctionDetails) -> FunctionInfo {
        let params_size = d
            .params
            .iter()
            .map(|&(o, s)| o as usize + s as usize)
            .max()
            .unwrap_or(0);
        FunctionInfo {
            id: d.id,
            params: d.params,
            params_size,
            attributes: d.attributes,
        }
    }
}

/// A kernel (or function) of an image, by name.
pub struct Kernel {
    pub image: &'static Image,
    pub name: CString,
    /// Its layout on each device (by ordinal), once asked there.
    pub(super) info: Box<[OnceLock<Arc<FunctionInfo>>]>,
    resolving: Mutex<()>,
    /// Attributes the program set, as it set them.
    set: Mutex<HashMap<i32, i32>>,
}

impl Modules {
    /// The kernel `name` of `image` (one object per name, made without asking the broker).
    pub fn kernel_of(&self, image: &'static Image, name: &CStr) -> &'static Kernel {
        let key = (image as *const Image as usize, name.to_owned());
        let mut by_name = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&k) = by_name.get(&key) {
            // SAFETY: recorded below from a leaked `Box<Kernel>`.
            return unsafe { &*(k as *const Kernel) };
        }
        let kernel: &'static Kernel = Box::leak(Box::new(Kernel {
            image,
            name: key.1.clone(),
            info: (0..self.devices).map(|_| OnceLock::new()).collect(),
            resolving: Mutex::new(()),
            set: Mutex::new(HashMap::new()),
        }));
        by_name.insert(key, kernel as *const Kernel as usize);
        self.kernels
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kernel as *const Kernel as usize);
        kernel
    }
}

impl Driver {
    /// A kernel's layout and attributes, asked of the broker the first time.
    #[inline]
    pub fn info(&self, k: &Kernel) -> Cu<Arc<FunctionInfo>> {
        let slot = k
            .info
            .get(self.device as usize)
            .ok_or(result::INVALID_DEVICE)?;
        if let Some(info) = slot.get() {
            return Ok(info.clone());
        }
        let _one = k.resolving.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(info) = slot.get() {
            return Ok(info.clone());
        }
        let module = self.ensure_loaded(k.image)?;
        let name = k.name.to_string_lossy().into_owned();
        let reply = self
            .transport
            .session
            .request(
                |request| ClientMessage::GetFunctionInfo {
                    request,
                    module,
                    name,
                },
                &[],
            )
            .map_err(|e| module_load_error(&e))?;
        let details = match reply {
            BrokerMessage::FunctionInfo { result: Ok(d), .. } => d,
            BrokerMessage::FunctionInfo { result: Err(w), .. } => return Err(module_error(&w)),
            _ => return Err(result::UNKNOWN),
        };
        let info = Arc::new(FunctionInfo::from(details));
        // What the program set (on another device) holds here too; under the lock
        // `set_function_attribute` takes, so that none is missed.
        let set = k.set.lock().unwrap_or_else(|p| p.into_inner());
        for (&attribute, &value) in set.iter() {
            self.transport.post(Command::FunctionSetAttribute {
                function: info.id,
                attribute: attribute as u32,
                value,
            })?;
        }
        let _ = slot.set(info.clone());
        Ok(info)
    }

    /// An image's kernels, in the module's order, as `cuModuleGetFunction` names them (the
    /// same handles): their names asked of the broker, a page at a time. Each kernel's layout
    /// still comes at its first use.
    pub fn kernels_of(&self, image: &'static Image) -> Cu<Vec<&'static Kernel>> {
        let module = self.ensure_loaded(image)?;
        let mut names: Vec<String> = Vec::new();
        loop {
            let first = u32::try_from(names.len()).map_err(|_| result::UNKNOWN)?;
            let reply = self
                .transport
                .session
                .request(
                    |request| ClientMessage::GetFunctionNames {
                        request,
                        module,
                        first,
                    },
                    &[],
                )
                .map_err(|e| module_load_error(&e))?;
            let (total, page) = match reply {
                BrokerMessage::FunctionNames { result: Ok(r), .. } => r,
                BrokerMessage::FunctionNames { result: Err(w), .. } => {
                    return Err(module_error(&w));
                }
                _ => return Err(result::UNKNOWN),
            };
            let total = total as usize;
            // A page that brings nothing while names remain would never end; one that goes
            // past the count is no answer to trust.
            if (page.is_empty() && names.len() < total) || names.len() + page.len() > total {
                return Err(result::UNKNOWN);
            }
            names.extend(page);
            if names.len() == total {
                break;
            }
        }
        names
            .into_iter()
            .map(|n| {
                let name = CString::new(n).map_err(|_| result::UNKNOWN)?;
                Ok(self.modules.kernel_of(image, &name))
            })
            .collect()
    }

    /// A function attribute: what the program set, else what the broker said.
    pub fn function_attribute(&self, k: &Kernel, attr: c_int) -> Cu<i32> {
        if !(0..func_attr::MAX).contains(&attr) {
            return Err(result::INVALID_VALUE);
        }
        if let Some(&v) = k.set.lock().unwrap_or_else(|p| p.into_inner()).get(&attr) {
            return Ok(v);
        }
        let info = self.info(k)?;
        info.attributes
            .get(attr as usize)
            .copied()
            .ok_or(result::INVALID_VALUE)
    }

    /// Sets a function attribute in the broker (without waiting; not again when unchanged),
    /// on every device where the kernel is resolved; another device gets it at its first use.
    pub fn set_function_attribute(&self, k: &Kernel, attr: c_int, value: c_int) -> Cu<()> {
        if !(0..func_attr::MAX).contains(&attr) {
            return Err(result::INVALID_VALUE);
        }
        self.info(k)?;
        let mut set = k.set.lock().unwrap_or_else(|p| p.into_inner());
        if set.get(&attr) == Some(&value) {
            return Ok(());
        }
        let first = crate::driver::first()?;
        for d in crate::route::opened(first) {
            let Some(info) = k.info.get(d.device as usize).and_then(|s| s.get()) else {
                continue;
            };
            d.transport.post(Command::FunctionSetAttribute {
                function: info.id,
                attribute: attr as u32,
                value,
            })?;
        }
        set.insert(attr, value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use gpushare_protocol::control::ModuleFormat;

    use super::super::loading::Bytes;
    use super::*;

    #[test]
    fn a_name_is_one_kernel_per_image() {
        let m = Modules::default();
        let a = m.add_image(ModuleFormat::Ptx, Bytes::Owned(b".version 8.0\0".to_vec()));
        let b = m.add_image(ModuleFormat::Ptx, Bytes::Owned(b".version 8.0\0".to_vec()));
        let f = m.kernel_of(a, c"f");
        assert!(
            std::ptr::eq(f, m.kernel_of(a, c"f")),
            "asked again: the same"
        );
        assert!(!std::ptr::eq(f, m.kernel_of(a, c"g")));
        assert!(!std::ptr::eq(f, m.kernel_of(b, c"f")), "another image's");
        assert_eq!(f.name.as_c_str(), c"f");
        assert!(f.info[0].get().is_none(), "nothing asked of the broker yet");
    }

    #[test]
    fn the_parameter_buffer_ends_at_the_furthest_parameter() {
        let size = |params: Vec<(u32, u32)>| {
            FunctionInfo::from(FunctionDetails {
                id: 1,
                params,
                attributes: vec![],
            })
            .params_size
        };
        assert_eq!(size(vec![(0, 8), (8, 4), (16, 8)]), 24);
        assert_eq!(size(vec![(16, 8), (0, 4)]), 24, "in any order");
        assert_eq!(size(vec![]), 0);
    }
}
