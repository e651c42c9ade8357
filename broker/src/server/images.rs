//! Module images shared between sessions by content: the second client that loads the same
//! bytes (another process of the same program) sends only their hash. Each session loads its
//! own module from the shared bytes (a module's global variables are per process in CUDA).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use gpushare_protocol::control::{ImageHash, image_hash};

/// Images by hash, alive while a session's module holds them.
#[derive(Default)]
pub struct ImageCache {
    by_hash: Mutex<HashMap<ImageHash, Weak<[u8]>>>,
}

impl ImageCache {
    /// The image with `hash`, if a session holds it now.
    pub fn get(&self, hash: &ImageHash) -> Option<Arc<[u8]>> {
        self.lock().get(hash).and_then(Weak::upgrade)
    }

    /// Shares `image`: the copy already held when another session has the same bytes, else
    /// this one, remembered.
    pub fn intern(&self, image: Vec<u8>) -> Arc<[u8]> {
        let hash = image_hash(&image);
        let mut by_hash = self.lock();
        if let Some(held) = by_hash.get(&hash).and_then(Weak::upgrade) {
            return held;
        }
        by_hash.retain(|_, w| w.strong_count() > 0);
        let image: Arc<[u8]> = image.into();
        by_hash.insert(hash, Arc::downgrade(&image));
        image
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ImageHash, Weak<[u8]>>> {
        self.by_hash.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_bytes_are_held_once_while_someone_holds_them() {
        let cache = ImageCache::default();
        let a = cache.intern(b"module bytes".to_vec());
        let b = cache.intern(b"module bytes".to_vec());
        assert!(Arc::ptr_eq(&a, &b), "one copy");
        let hash = image_hash(b"module bytes");
        assert!(cache.get(&hash).is_some());
        drop((a, b));
        assert!(cache.get(&hash).is_none(), "gone with its last holder");
        assert!(cache.get(&image_hash(b"other")).is_none());
    }
}
