//! Context limits (`cuCtxGetLimit` / `cuCtxSetLimit`): remembered, not applied.

use std::ffi::c_int;

use super::Contexts;
use crate::status::Cu;
use crate::types::{limit, result};

/// What each limit reads before the program sets it (CUDA's defaults).
pub(super) fn defaults() -> [u64; limit::COUNT] {
    let mut limits = [0u64; limit::COUNT];
    limits[limit::STACK_SIZE] = 1024;
    limits[limit::PRINTF_FIFO_SIZE] = 1 << 20;
    limits[limit::MALLOC_HEAP_SIZE] = 8 << 20;
    limits[limit::DEV_RUNTIME_SYNC_DEPTH] = 2;
    limits[limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
    limits[limit::MAX_L2_FETCH_GRANULARITY] = 32;
    limits
}

impl Contexts {
    /// A limit's value; `INVALID_VALUE` for a number that names no limit.
    pub fn limit(&self, which: c_int) -> Cu<u64> {
        let limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        usize::try_from(which)
            .ok()
            .and_then(|i| limits.get(i).copied())
            .ok_or(result::INVALID_VALUE)
    }

    /// Remembers a limit's value; `INVALID_VALUE` for a number that names no limit.
    pub fn set_limit(&self, which: c_int, value: u64) -> Cu<()> {
        let mut limits = self.limits.lock().unwrap_or_else(|p| p.into_inner());
        let slot = usize::try_from(which)
            .ok()
            .and_then(|i| limits.get_mut(i))
            .ok_or(result::INVALID_VALUE)?;
        *slot = value;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_cudas_defaults_until_set() {
        let contexts = Contexts::new();
        let stack = limit::STACK_SIZE as c_int;
        assert_eq!(contexts.limit(stack), Ok(1024));
        assert_eq!(
            contexts.limit(limit::MALLOC_HEAP_SIZE as c_int),
            Ok(8 << 20)
        );
        assert_eq!(contexts.set_limit(stack, 64 << 10), Ok(()));
        assert_eq!(contexts.limit(stack), Ok(64 << 10));
        assert_eq!(
            contexts.limit(limit::PRINTF_FIFO_SIZE as c_int),
            Ok(1 << 20),
            "the others stay"
        );
    }

    #[test]
    fn a_number_that_names_no_limit_is_refused() {
        let contexts = Contexts::new();
        for which in [-1, limit::COUNT as c_int] {
            assert_eq!(contexts.limit(which), Err(result::INVALID_VALUE));
            assert_eq!(contexts.set_limit(which, 1), Err(result::INVALID_VALUE));
        }
    }
}
