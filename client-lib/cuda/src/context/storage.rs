//! Context-local storage, a service of the CUDA runtime's export tables: values a library
//! keeps per (context, key), with a destructor called when the context ends.

use std::collections::HashMap;
use std::ffi::c_void;

use super::Contexts;
use crate::types::CUcontext;

/// A destructor a library registered with a context-local value.
pub type StorageDtor = extern "C" fn(CUcontext, *mut c_void, *mut c_void);

/// Context-local values by (context, key), with their destructors.
pub(super) type Storage = HashMap<(usize, usize), (usize, Option<StorageDtor>)>;

impl Contexts {
    /// Calls and forgets the destructors of a context's local storage.
    pub(super) fn run_storage_dtors(&self, ctx: CUcontext) {
        let gone: Vec<(usize, usize, Option<StorageDtor>)> = {
            let mut storage = self.storage.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<(usize, usize)> = storage
                .keys()
                .filter(|k| k.0 == ctx as usize)
                .copied()
                .collect();
            keys.into_iter()
                .filter_map(|k| storage.remove(&k).map(|(v, d)| (k.1, v, d)))
                .collect()
        };
        for (key, value, dtor) in gone {
            if let Some(dtor) = dtor {
                dtor(ctx, key as *mut c_void, value as *mut c_void);
            }
        }
    }

    pub fn storage_put(&self, ctx: CUcontext, key: usize, value: usize, dtor: Option<StorageDtor>) {
        self.storage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((ctx as usize, key), (value, dtor));
    }

    pub fn storage_get(&self, ctx: CUcontext, key: usize) -> Option<usize> {
        self.storage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(ctx as usize, key))
            .map(|v| v.0)
    }

    pub fn storage_delete(&self, ctx: CUcontext, key: usize) -> bool {
        self.storage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ctx as usize, key))
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI32, Ordering};

    use super::*;

    extern "C" fn count_dtor(_ctx: CUcontext, _key: *mut c_void, value: *mut c_void) {
        // SAFETY: the test passes a pointer to an AtomicI32.
        unsafe { &*(value as *const AtomicI32) }.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn context_local_storage_is_per_context_and_ends_with_it() {
        let contexts = Contexts::new();
        let a = contexts.create(0, 0);
        let b = contexts.create(0, 0);
        let calls = Box::leak(Box::new(AtomicI32::new(0)));
        contexts.storage_put(a, 7, calls as *const AtomicI32 as usize, Some(count_dtor));
        contexts.storage_put(b, 7, 99, None);
        assert_eq!(
            contexts.storage_get(a, 7),
            Some(calls as *const AtomicI32 as usize)
        );
        assert_eq!(contexts.storage_get(b, 7), Some(99));
        assert_eq!(contexts.storage_get(a, 8), None);
        contexts.destroy(a).expect("destroy");
        assert_eq!(calls.load(Ordering::Relaxed), 1, "the destructor ran once");
        assert_eq!(contexts.storage_get(a, 7), None);
        assert!(contexts.storage_delete(b, 7));
        assert!(!contexts.storage_delete(b, 7));
    }
}
