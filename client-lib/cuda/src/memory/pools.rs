//! Memory pools (`cuMemPoolCreate`, `cuMemAllocFromPoolAsync`, `cuDeviceGetDefaultMemPool` …):
//! what `cudaMallocAsync` allocators use (PyTorch's `backend:cudaMallocAsync`, CuPy's
//! `MemoryAsyncPool`, RAPIDS). The broker already keeps freed memory for its user's next
//! allocation, so a pool here is a name for allocations made through it: they are made at once
//! (memory ready earlier than its stream asked is CUDA-correct), counted per pool for the
//! attributes programs read (`USED_MEM_*`; reserved is what is used, the broker holds the
//! rest), and freed when freed. Pools of pinned memory on this process's device only;
//! exporting a pool to another process is not served.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use super::vmm::{ACCESS_READWRITE, LOCATION_DEVICE, Location};
use crate::driver::Driver;
use crate::status::Cu;
use crate::types::result;

/// `CUmemPool_attribute` numbers.
pub mod attr {
    pub const REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
    pub const REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
    pub const RELEASE_THRESHOLD: i32 = 4;
    pub const RESERVED_MEM_CURRENT: i32 = 5;
    pub const RESERVED_MEM_HIGH: i32 = 6;
    pub const USED_MEM_CURRENT: i32 = 7;
    pub const USED_MEM_HIGH: i32 = 8;
}

/// The device's own pool, there from the start.
pub const DEFAULT_POOL: u64 = 1;

#[derive(Debug, Clone, Copy)]
struct Pool {
    /// The three reuse flags (attributes 1 to 3), CUDA's defaults all on.
    reuse: [i32; 3],
    release_threshold: u64,
    used: u64,
    used_high: u64,
    reserved_high: u64,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool {
            reuse: [1, 1, 1],
            release_threshold: 0,
            used: 0,
            used_high: 0,
            reserved_high: 0,
        }
    }
}

#[derive(Debug)]
struct State {
    pools: HashMap<u64, Pool>,
    next: u64,
    /// The pool `cuMemAllocAsync` takes from.
    current: u64,
    /// Allocation → (its pool, its size).
    owners: HashMap<u64, (u64, u64)>,
}

pub struct Pools {
    state: Mutex<State>,
}

impl Default for Pools {
    fn default() -> Pools {
        Pools {
            state: Mutex::new(State {
                pools: HashMap::from([(DEFAULT_POOL, Pool::default())]),
                next: DEFAULT_POOL + 1,
                current: DEFAULT_POOL,
                owners: HashMap::new(),
            }),
        }
    }
}

/// A pool's handle: its number, never a pointer (as streams' are).
pub fn pool_handle(id: u64) -> *mut c_void {
    ((id << 8) | 0x5c) as *mut c_void
}

pub fn pool_id(h: *mut c_void) -> Option<u64> {
    let v = h as u64;
    (v & 0xff == 0x5c && v >> 8 != 0).then_some(v >> 8)
}

impl Pools {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn create(&self) -> u64 {
        let mut st = self.lock();
        let id = st.next;
        st.next += 1;
        st.pools.insert(id, Pool::default());
        id
    }

    /// Forgets a pool (not the default one); its allocations live on until freed.
    pub fn destroy(&self, id: u64) -> Cu<()> {
        let mut st = self.lock();
        if id == DEFAULT_POOL || st.pools.remove(&id).is_none() {
            return Err(result::INVALID_VALUE);
        }
        if st.current == id {
            st.current = DEFAULT_POOL;
        }
        Ok(())
    }

    pub fn exists(&self, id: u64) -> bool {
        self.lock().pools.contains_key(&id)
    }

    pub fn current(&self) -> u64 {
        self.lock().current
    }

    pub fn set_current(&self, id: u64) -> Cu<()> {
        let mut st = self.lock();
        if !st.pools.contains_key(&id) {
            return Err(result::INVALID_VALUE);
        }
        st.current = id;
        Ok(())
    }

    /// Counts an allocation made through pool `id`.
    fn note_alloc(&self, id: u64, ptr: u64, bytes: u64) {
        let mut st = self.lock();
        if let Some(p) = st.pools.get_mut(&id) {
            p.used += bytes;
            p.used_high = p.used_high.max(p.used);
            p.reserved_high = p.reserved_high.max(p.used);
        }
        st.owners.insert(ptr, (id, bytes));
    }

    /// An allocation was freed: its pool no longer counts it.
    pub fn note_free(&self, ptr: u64) {
        let mut st = self.lock();
        if let Some((id, bytes)) = st.owners.remove(&ptr)
            && let Some(p) = st.pools.get_mut(&id)
        {
            p.used = p.used.saturating_sub(bytes);
        }
    }

    /// An attribute's value (as a u64; the reuse flags are ints).
    pub fn get(&self, id: u64, attribute: i32) -> Cu<u64> {
        let st = self.lock();
        let p = st.pools.get(&id).ok_or(result::INVALID_VALUE)?;
        Ok(match attribute {
            attr::REUSE_FOLLOW_EVENT_DEPENDENCIES..=attr::REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                p.reuse[(attribute - 1) as usize] as u64
            }
            attr::RELEASE_THRESHOLD => p.release_threshold,
            attr::RESERVED_MEM_CURRENT | attr::USED_MEM_CURRENT => p.used,
            attr::RESERVED_MEM_HIGH => p.reserved_high,
            attr::USED_MEM_HIGH => p.used_high,
            _ => return Err(result::INVALID_VALUE),
        })
    }

    /// Sets an attribute; the high-water marks take only 0, which resets them.
    pub fn set(&self, id: u64, attribute: i32, value: u64) -> Cu<()> {
        let mut st = self.lock();
        let p = st.pools.get_mut(&id).ok_or(result::INVALID_VALUE)?;
        match attribute {
            attr::REUSE_FOLLOW_EVENT_DEPENDENCIES..=attr::REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                p.reuse[(attribute - 1) as usize] = i32::from(value != 0)
            }
            attr::RELEASE_THRESHOLD => p.release_threshold = value,
            attr::RESERVED_MEM_HIGH if value == 0 => p.reserved_high = p.used,
            attr::USED_MEM_HIGH if value == 0 => p.used_high = p.used,
            _ => return Err(result::INVALID_VALUE),
        }
        Ok(())
    }
}

/// Whether a location is this process's device (pools serve no other).
pub fn on_device(location: &Location) -> Cu<()> {
    match (location.kind, location.id) {
        (LOCATION_DEVICE, id) if id == crate::device::bound() => Ok(()),
        (LOCATION_DEVICE, _) => Err(result::INVALID_DEVICE),
        _ => {
            crate::log::say_once("memory pools of host memory are not supported");
            Err(result::NOT_SUPPORTED)
        }
    }
}

/// The access every pool's memory has on the device (read and write, as the broker maps it).
pub const POOL_ACCESS: u32 = ACCESS_READWRITE;

impl Driver {
    /// `bytes` from pool `id`, made at once.
    pub fn alloc_from_pool(&self, id: u64, bytes: u64) -> Cu<u64> {
        if !self.pools.exists(id) {
            return Err(result::INVALID_VALUE);
        }
        let ptr = self.alloc(bytes)?;
        self.pools.note_alloc(id, ptr, bytes);
        Ok(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_count_what_is_allocated_through_them() {
        let pools = Pools::default();
        let p = pools.create();
        assert_eq!(pool_id(pool_handle(p)), Some(p));
        assert_eq!(pool_id(std::ptr::null_mut()), None);
        pools.note_alloc(p, 0x1000, 4096);
        pools.note_alloc(p, 0x3000, 100);
        assert_eq!(pools.get(p, attr::USED_MEM_CURRENT), Ok(4196));
        pools.note_free(0x1000);
        assert_eq!(pools.get(p, attr::USED_MEM_CURRENT), Ok(100));
        assert_eq!(pools.get(p, attr::USED_MEM_HIGH), Ok(4196));
        assert_eq!(
            pools.set(p, attr::USED_MEM_HIGH, 5),
            Err(result::INVALID_VALUE)
        );
        pools.set(p, attr::USED_MEM_HIGH, 0).expect("reset");
        assert_eq!(pools.get(p, attr::USED_MEM_HIGH), Ok(100));
        pools
            .set(p, attr::RELEASE_THRESHOLD, u64::MAX)
            .expect("threshold");
        assert_eq!(pools.get(p, attr::RELEASE_THRESHOLD), Ok(u64::MAX));
        assert_eq!(pools.get(p, 2), Ok(1), "reuse on by default");
        pools.set_current(p).expect("current");
        pools.destroy(p).expect("destroyed");
        assert_eq!(
            pools.current(),
            DEFAULT_POOL,
            "the default is current again"
        );
        assert_eq!(pools.destroy(DEFAULT_POOL), Err(result::INVALID_VALUE));
        assert_eq!(
            pools.get(p, attr::USED_MEM_CURRENT),
            Err(result::INVALID_VALUE)
        );
    }
}
