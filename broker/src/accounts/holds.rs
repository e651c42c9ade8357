//! What a user holds in gpushared besides sessions: open connections of every kind, and module
//! images. Each is a guard that counts itself out when dropped.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpushare_protocol::control::ImageHash;

use super::{Accounts, Refusal, UserAccount, account_of, forget_if_idle};
use crate::access::Bounds;

/// An open connection, counted in its user's account (root's are not counted).
#[derive(Debug)]
pub struct Visit {
    held: Option<(Arc<Accounts>, Arc<UserAccount>)>,
}

impl Drop for Visit {
    fn drop(&mut self) {
        if let Some((accounts, account)) = self.held.take() {
            let mut users = accounts.lock();
            account.connections.fetch_sub(1, Ordering::Relaxed);
            forget_if_idle(&mut users, account.uid);
        }
    }
}

/// A module image held for a user: the user's first hold of an image counts its bytes, the
/// last one let go gives them back.
#[derive(Debug)]
pub struct ImageHold {
    accounts: Arc<Accounts>,
    account: Arc<UserAccount>,
    hash: ImageHash,
}

impl Drop for ImageHold {
    fn drop(&mut self) {
        let mut users = self.accounts.lock();
        let mut images = self.account.images_lock();
        if let Some((holders, bytes)) = images.get_mut(&self.hash) {
            *holders -= 1;
            if *holders == 0 {
                let bytes = *bytes;
                images.remove(&self.hash);
                self.account.image_bytes.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
        drop(images);
        forget_if_idle(&mut users, self.account.uid);
    }
}

impl UserAccount {
    pub fn connections(&self) -> u32 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Module image bytes held for the user, each image once.
    pub fn image_bytes(&self) -> u64 {
        self.image_bytes.load(Ordering::Relaxed)
    }

    /// Whether an image of `bytes` would fit within the user's bound, not counting images
    /// they hold already.
    pub fn image_fits(&self, bytes: u64) -> bool {
        self.image_bytes()
            .checked_add(bytes)
            .is_some_and(|now| now <= self.max_image_bytes.load(Ordering::Relaxed))
    }

    /// Whether the user holds the image with `hash` already (a load of it costs nothing).
    pub fn holds_image(&self, hash: &ImageHash) -> bool {
        self.images_lock().contains_key(hash)
    }

    fn images_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<ImageHash, (u32, u64)>> {
        self.images.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Accounts {
    /// Counts a new connection of `uid` in, within the policy's `max_connections` for them
    /// (root is not counted).
    pub fn visit(self: &Arc<Self>, uid: u32, user: &str, bounds: Bounds) -> Result<Visit, Refusal> {
        if uid == 0 {
            return Ok(Visit { held: None });
        }
        let mut users = self.lock();
        let account = account_of(&mut users, uid, user, None);
        account
            .max_connections
            .store(bounds.max_connections, Ordering::Relaxed);
        let open = account.connections();
        if open >= bounds.max_connections {
            let why = Refusal::TooManyConnections {
                who: account.who(),
                open,
            };
            forget_if_idle(&mut users, uid);
            return Err(why);
        }
        account.connections.fetch_add(1, Ordering::Relaxed);
        Ok(Visit {
            held: Some((self.clone(), account)),
        })
    }

    /// Holds the image `hash` of `bytes` for `account`'s user: counted unless the user holds
    /// it already, within the policy's `max_module_memory`.
    pub fn hold_image(
        self: &Arc<Self>,
        account: &Arc<UserAccount>,
        hash: ImageHash,
        bytes: u64,
    ) -> Result<ImageHold, Refusal> {
        let _users = self.lock();
        let mut images = account.images_lock();
        match images.get_mut(&hash) {
            Some((holders, _)) => *holders += 1,
            None => {
                let max = account.max_image_bytes.load(Ordering::Relaxed);
                let held = account.image_bytes();
                if held.checked_add(bytes).is_none_or(|now| now > max) {
                    return Err(Refusal::ModuleMemory {
                        who: account.who(),
                        held,
                        asked: bytes,
                        max,
                    });
                }
                images.insert(hash, (1, bytes));
                account.image_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
        }
        Ok(ImageHold {
            accounts: self.clone(),
            account: account.clone(),
            hash,
        })
    }
}
