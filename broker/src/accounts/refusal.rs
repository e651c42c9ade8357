//! Why a user's account refuses more.

use bytesize::ByteSize;
use gpushare_protocol::ErrorCode;

/// Why a user's account refuses more: each a sentence for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{who} has {open} sessions open, the most the policy's max_sessions allows: end one, or ask the administrator"
    )]
    TooManySessions { who: String, open: u32 },
    #[error(
        "{who}'s programs faulted the GPU {faults} times lately, past the policy's [faults] limit: new sessions are refused for {} s more",
        .left.as_secs() + 1
    )]
    FaultStorm {
        who: String,
        faults: usize,
        left: std::time::Duration,
    },
    #[error(
        "{who} holds {} of page-locked host memory in gpushared (each session's rings and arena, and host memory consolidated programs share); {} more would pass the policy's max_pinned_memory of {}: end a session, or ask the administrator",
        ByteSize(*.held),
        ByteSize(*.asked),
        ByteSize(*.max)
    )]
    PinnedMemory {
        who: String,
        held: u64,
        asked: u64,
        max: u64,
    },
    #[error(
        "{who} has {open} connections to gpushared open (sessions, monitors such as `gpushare status`, handshakes), the most the policy's max_connections allows: close one, or ask the administrator"
    )]
    TooManyConnections { who: String, open: u32 },
    #[error(
        "{who}'s programs have gpushared hold {} of module images; {} more would pass the policy's max_module_memory of {}: unload a module or end a program, or ask the administrator",
        ByteSize(*.held),
        ByteSize(*.asked),
        ByteSize(*.max)
    )]
    ModuleMemory {
        who: String,
        held: u64,
        asked: u64,
        max: u64,
    },
}

impl Refusal {
    /// What the client is refused with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::FaultStorm { .. } => ErrorCode::PermissionDenied,
            Refusal::TooManySessions { .. }
            | Refusal::PinnedMemory { .. }
            | Refusal::TooManyConnections { .. }
            | Refusal::ModuleMemory { .. } => ErrorCode::TooManyHandles,
        }
    }
}
