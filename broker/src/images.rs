//! Module images, held by content for as long as a module holds them: the second client that
//! loads the same bytes (another process of the same program) sends only their hash. Each
//! session loads its own module from the shared bytes (a module's global variables are per
//! process in CUDA). An image is counted against its user's `max_module_memory` (once per
//! user, whatever number of their modules hold it) and freed when its last module goes.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use gpushare_protocol::ErrorCode;
use gpushare_protocol::control::{ImageHash, image_hash, image_hash_reader};
use gpushare_protocol::error::WireError;

use crate::accounts::{Accounts, ImageHold, UserAccount};

/// Whose module holds an image: what it is counted against.
#[derive(Clone)]
pub struct Holder {
    pub accounts: Arc<Accounts>,
    pub account: Arc<UserAccount>,
}

/// Image bytes by hash, with how many modules hold each.
type ByHash = HashMap<ImageHash, (Arc<[u8]>, usize)>;

/// Images by hash, with how many modules hold each.
#[derive(Default)]
pub struct ImageCache {
    by_hash: Mutex<ByHash>,
}

/// An image a module holds; dropping it lets go (the bytes go with the last holder).
pub struct HeldImage {
    cache: Arc<ImageCache>,
    hash: ImageHash,
    bytes: Arc<[u8]>,
    _counted: ImageHold,
}

impl HeldImage {
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.bytes
    }
}

impl Drop for HeldImage {
    fn drop(&mut self) {
        let mut by_hash = self.cache.lock();
        if let Some((_, holders)) = by_hash.get_mut(&self.hash) {
            *holders -= 1;
            if *holders == 0 {
                by_hash.remove(&self.hash);
            }
        }
    }
}

fn refused(why: crate::accounts::Refusal) -> WireError {
    WireError::new(why.code(), why.to_string())
}

impl ImageCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByHash> {
        self.by_hash.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The image with `hash`, held for `holder`, if the broker holds it now.
    pub fn hold_cached(
        self: &Arc<Self>,
        hash: &ImageHash,
        holder: &Holder,
    ) -> Result<Option<HeldImage>, WireError> {
        let Some(bytes) = self.lock().get(hash).map(|(b, _)| b.clone()) else {
            return Ok(None);
        };
        self.hold(*hash, bytes, holder).map(Some)
    }

    /// Holds `bytes` (whose hash is `hash`) for `holder`: the copy already held when another
    /// module has the same bytes.
    fn hold(
        self: &Arc<Self>,
        hash: ImageHash,
        bytes: Arc<[u8]>,
        holder: &Holder,
    ) -> Result<HeldImage, WireError> {
        let counted = holder
            .accounts
            .hold_image(&holder.account, hash, bytes.len() as u64)
            .map_err(refused)?;
        let mut by_hash = self.lock();
        let entry = by_hash.entry(hash).or_insert_with(|| (bytes, 0));
        entry.1 += 1;
        Ok(HeldImage {
            cache: self.clone(),
            hash,
            bytes: entry.0.clone(),
            _counted: counted,
        })
    }

    /// Reads an image of `len` bytes from a client's file and holds it for `holder`. Blocking.
    /// Past the user's bound it is only hashed (it may be one they hold already); memory
    /// gpushared cannot get for it is the client's error, never the broker's end.
    pub fn receive(
        self: &Arc<Self>,
        fd: OwnedFd,
        len: u64,
        holder: &Holder,
    ) -> Result<HeldImage, WireError> {
        let bad = |what: String| WireError::new(ErrorCode::InvalidArgument, what);
        let file = File::from(fd);
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        if size < len {
            return Err(bad(format!(
                "module image file has {size} bytes, not the {len} announced"
            )));
        }
        if !holder.account.image_fits(len) {
            let hash =
                hash_file(&file, len).map_err(|e| bad(format!("cannot read module image: {e}")))?;
            if let Some(held) = self.hold_cached(&hash, holder)? {
                return Ok(held);
            }
            // Not one they hold: refused, naming the bound.
            let why = holder.accounts.hold_image(&holder.account, hash, len);
            return Err(why.err().map_or_else(
                || WireError::new(ErrorCode::Internal, "an image past the bound was counted"),
                refused,
            ));
        }
        let n = usize::try_from(len).map_err(|_| bad(format!("{len} bytes")))?;
        let mut image = Vec::new();
        image.try_reserve_exact(n).map_err(|_| {
            WireError::new(
                ErrorCode::OutOfMemory,
                format!("gpushared cannot get {n} bytes of memory for the module image"),
            )
        })?;
        image.resize(n, 0);
        // Read by position: the client's file offset is not ours to trust.
        file.read_exact_at(&mut image, 0)
            .map_err(|e| bad(format!("cannot read module image: {e}")))?;
        let hash = image_hash(&image);
        let bytes = self
            .lock()
            .get(&hash)
            .map(|(b, _)| b.clone())
            .unwrap_or_else(|| image.into());
        self.hold(hash, bytes, holder)
    }

    /// Images held now, and their bytes (for the status report and tests).
    pub fn held(&self) -> (usize, u64) {
        let by_hash = self.lock();
        let bytes = by_hash.values().map(|(b, _)| b.len() as u64).sum();
        (by_hash.len(), bytes)
    }
}

/// The hash of the first `len` bytes of `file`, read by position in pieces.
fn hash_file(file: &File, len: u64) -> std::io::Result<ImageHash> {
    struct At<'a>(&'a File, u64);
    impl Read for At<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read_at(buf, self.1)?;
            self.1 += n as u64;
            Ok(n)
        }
    }
    let (hash, read) = image_hash_reader(At(file, 0).take(len))?;
    if read < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the file is shorter than announced",
        ));
    }
    Ok(hash)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;

    use super::*;
    use crate::access::Bounds;
    use crate::accounts::Joining;

    fn holder(max_module_memory: Option<u64>) -> (Holder, crate::accounts::Seat) {
        let accounts: Arc<Accounts> = Arc::default();
        let seat = accounts
            .join(Joining {
                uid: 1000,
                user: "alice",
                quota: None,
                bounds: Bounds {
                    max_module_memory,
                    ..Bounds::unbounded()
                },
                region_bytes: 0,
                faults: Default::default(),
            })
            .expect("a seat");
        let holder = Holder {
            accounts,
            account: seat.account().clone(),
        };
        (holder, seat)
    }

    fn file(bytes: &[u8]) -> OwnedFd {
        let mut f = tempfile::tempfile().expect("temp file");
        f.write_all(bytes).expect("write");
        f.as_fd().try_clone_to_owned().expect("dup")
    }

    #[test]
    fn the_same_bytes_are_held_once_and_freed_with_their_last_holder() {
        let cache = Arc::new(ImageCache::default());
        let (alice, _seat) = holder(None);
        let a = cache.receive(file(b"module bytes"), 12, &alice).expect("a");
        let b = cache.receive(file(b"module bytes"), 12, &alice).expect("b");
        assert!(Arc::ptr_eq(a.bytes(), b.bytes()), "one copy");
        assert_eq!(cache.held(), (1, 12));
        assert_eq!(alice.account.image_bytes(), 12, "counted once");
        let hash = image_hash(b"module bytes");
        drop(a);
        assert!(cache.hold_cached(&hash, &alice).expect("held").is_some());
        drop(b);
        assert_eq!(cache.held(), (0, 0), "gone with its last holder");
        assert_eq!(alice.account.image_bytes(), 0);
        assert!(cache.hold_cached(&hash, &alice).expect("none").is_none());
    }

    #[test]
    fn images_past_the_users_bound_are_refused_unless_they_hold_them_already() {
        let cache = Arc::new(ImageCache::default());
        let (alice, _seat) = holder(Some(100));
        let first = cache.receive(file(&[1; 80]), 80, &alice).expect("fits");
        let refused = cache
            .receive(file(&[2; 40]), 40, &alice)
            .err()
            .expect("past the bound");
        assert_eq!(refused.code, ErrorCode::TooManyHandles);
        assert!(refused.message.contains("max_module_memory"), "{refused:?}");
        // The same bytes again cost nothing more.
        let again = cache.receive(file(&[1; 80]), 80, &alice).expect("held");
        assert_eq!(alice.account.image_bytes(), 80);
        drop((first, again));
        let later = cache.receive(file(&[2; 40]), 40, &alice);
        assert!(later.is_ok(), "room again once unloaded");
        let short = cache
            .receive(file(b"abc"), 10, &alice)
            .err()
            .expect("short");
        assert_eq!(
            short.message,
            "module image file has 3 bytes, not the 10 announced"
        );
    }
}
