//! Maps keyed by gpushared's own integer ids (clients, accounts, requests), hashed with one
//! multiplication: the policies look up every client's entry on every launch, under the lock
//! every data thread takes, and std's SipHash (which guards against keys an attacker picks)
//! was a visible part of that lock's time. Never for keys a client chooses.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by one of gpushared's integer ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of an integer key: a bijection, so distinct ids never collide in full,
/// with the high bits (which the map's control bytes use) mixed from all of the key's.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(GOLDEN);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_in_a_row_and_far_apart_are_all_kept_apart() {
        let mut map: IdMap<u64, u64> = IdMap::default();
        let keys: Vec<u64> = (1..=2000).chain((0..64).map(|u| (1 << 62) | u)).collect();
        for &k in &keys {
            map.insert(k, k * 2);
        }
        assert_eq!(map.len(), keys.len());
        assert!(keys.iter().all(|k| map.get(k) == Some(&(k * 2))));
        map.remove(&5);
        assert_eq!(map.get(&5), None);
    }
}
