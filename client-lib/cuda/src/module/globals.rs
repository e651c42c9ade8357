//! Module globals: a global's device address and size, asked of the broker once per name,
//! and recorded as a device range (copies and pointer queries may name it).

use std::ffi::CStr;

use gpushare_protocol::control::{BrokerMessage, ClientMessage};

use super::{Image, module_error};
use crate::driver::Driver;
use crate::status::{Cu, from_error};
use crate::types::result;

impl Driver {
    /// A module global's device address and size.
    pub fn global(&self, image: &Image, name: &CStr) -> Cu<(u64, u64)> {
        let key = (self.device, name.to_owned());
        if let Some(&g) = image
            .globals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(g);
        }
        let module = self.ensure_loaded(image)?;
        let n = name.to_string_lossy().into_owned();
        let reply = self
            .transport
            .session
            .request(
                |request| ClientMessage::GetGlobal {
                    request,
                    module,
                    name: n,
                },
                &[],
            )
            .map_err(|e| from_error(&e))?;
        let (ptr, bytes) = match reply {
            BrokerMessage::Global { result: Ok(g), .. } => g,
            BrokerMessage::Global { result: Err(w), .. } => return Err(module_error(&w)),
            _ => return Err(result::UNKNOWN),
        };
        self.note_global(ptr, bytes);
        image
            .globals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (ptr, bytes));
        Ok((ptr, bytes))
    }
}
