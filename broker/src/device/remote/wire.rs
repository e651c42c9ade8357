//! What gpushared and its device workers say to each other besides the calls themselves
//! ([`crate::device::call`]): how a call travels on a calling thread's channel, and the
//! messages of the worker's control socket. Both ends are the
//! same binary, so nothing here is versioned; lengths are still checked, and a message that
//! does not decode is an error, never a panic.

use gpushare_protocol::control::DeviceInfo;
use serde::{Deserialize, Serialize};

use crate::device::call::Call;
use crate::device::link::Space;

/// Where a request's variable-length bytes are (launch parameters, a module image, a name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Payload {
    None,
    /// Right after the encoded request, in the channel's request area.
    Inline(u32),
    /// Too big for the request area: handed over on the control socket first, by this id.
    Blob(u64),
}

/// A call as it travels on a channel, with where its payload is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub call: Call,
    pub payload: Payload,
}

/// The backend names a worker can have.
pub fn static_backend(name: &str) -> &'static str {
    match name {
        "cuda" => "cuda",
        "sim" => "sim",
        _ => "remote",
    }
}

/// Which device a worker opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerBackend {
    Cuda {
        ordinal: i32,
    },
    Sim {
        index: u32,
        memory: u64,
        realtime: bool,
    },
}

/// The built-in kernels compiled for a compute capability (PTX), passed from worker to worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltinKernels {
    pub cc: (u32, u32),
    pub ptx: String,
}

/// How a worker is to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub backend: WorkerBackend,
    /// Load the fault-injection kernels (`--allow-fault-injection`).
    pub fault_injection: bool,
    /// The log filter (tracing's env-filter syntax).
    pub log: String,
    /// Shown in the worker's log lines: which GPU, which trust domain, which generation.
    pub label: String,
    /// Kernels an earlier worker compiled, so that this one need not.
    pub builtins: Option<BuiltinKernels>,
    /// Where clients' memory lives: the address range the worker this one may replace has
    /// reserved (`None`: the first worker of a device reserves where its driver likes).
    pub space: Option<Space>,
    /// For a first worker: reserve at this address if it is free (clear of another GPU's
    /// range, so that no device address means two GPUs), else where the driver likes.
    pub prefer_base: Option<u64>,
}

/// gpushared → worker, on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToWorker {
    Start(WorkerSpec),
    /// A channel's memfd comes with it.
    OpenChannel {
        id: u64,
    },
    /// The region's file comes with it (`len` bytes from `offset`).
    ShareMemory {
        region: u64,
        len: u64,
        at: u64,
        offset: u64,
    },
    UnshareMemory {
        region: u64,
    },
    /// A memfd of `len` bytes comes with it: a request's payload too big for its channel.
    Blob {
        id: u64,
        len: u64,
    },
    /// Make a chunk of clients' memory at `at` (the reply carries its descriptor).
    CreateChunk {
        at: u64,
        size: u64,
    },
    /// Make physical memory mapped nowhere (the reply carries its descriptor).
    MakeMemory {
        size: u64,
    },
    /// Map a chunk another worker made; its descriptor comes with it.
    ImportChunk {
        at: u64,
        size: u64,
    },
    ReleaseChunk {
        at: u64,
        size: u64,
    },
    /// Reserve another device's range of clients' memory here too (peer access).
    ReservePeer {
        base: u64,
        size: u64,
    },
    /// Map another device's chunk at its own address (inside a range `ReservePeer` took);
    /// its descriptor comes with it.
    ImportPeerChunk {
        at: u64,
        size: u64,
    },
    /// Run `call` here too (a spare making a module, a function or an attribute ahead of a
    /// fault); a memfd of `len` bytes, its payload, comes with it when `len` is not 0.
    Mirror {
        call: Call,
        len: u64,
    },
}

/// Worker → gpushared, on the control socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromWorker {
    Ready {
        info: DeviceInfo,
        backend: String,
        sm_partitions: bool,
        /// The built-in kernels it compiled (CUDA), for the workers after it.
        builtins: Option<BuiltinKernels>,
        /// The address range it reserved for clients' memory.
        space: Space,
    },
    /// A chunk was made; its descriptor comes with it.
    Chunk,
    /// The device could not be opened.
    Failed {
        reason: String,
    },
    Ack,
    Refused {
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_protocol::command::{LaunchAttributes, ModuleLaunch};
    use gpushare_protocol::control::{decode, encode};

    #[test]
    fn a_launch_call_is_small() {
        let env = Envelope {
            call: Call::LaunchModule {
                stream: 3,
                function: 9,
                launch: ModuleLaunch {
                    function: 9,
                    grid: [1024, 1, 1],
                    block: [256, 1, 1],
                    shared_mem_bytes: 0,
                    params_offset: 0,
                    params_len: 64,
                },
                attributes: LaunchAttributes::default(),
                start: Some(4),
                // A gated launch on a partition: the most a launch carries.
                place: crate::device::Place {
                    sms: Some(66),
                    gate: Some(crate::device::GateWord {
                        page: crate::shm::Span {
                            region: 1 << 40,
                            offset: 0,
                            len: 192 << 10,
                        },
                        slot: 0,
                    }),
                },
            },
            payload: Payload::Inline(64),
        };
        let bytes = encode(&env).expect("encodes");
        assert!(bytes.len() < 96, "{} bytes", bytes.len());
        let back: Envelope = decode(&bytes).expect("decodes");
        assert!(matches!(back.call, Call::LaunchModule { stream: 3, .. }));
    }
}
