//! What a device call gets back: its [`Reply`] (or the error it failed with), and the
//! [`Answer`] that carries it with what the call learnt of its stream's device time.

use serde::{Deserialize, Serialize};

use super::{DeviceError, DeviceResult, FunctionShape};

/// A stream, event, module or function the executor made, by its number there.
pub type Handle = u64;

/// What a call got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    /// A pointer, a handle, bytes taken, nanoseconds, a count.
    Value(u64),
    Pair(u64, u64),
    Flag(bool),
    Shape(FunctionShape),
    Bytes(Vec<u8>),
    Fault(Option<String>),
    Failed(DeviceError),
}

impl Reply {
    /// A failure as the error it is.
    pub fn ok(self) -> DeviceResult<Reply> {
        match self {
            Reply::Failed(e) => Err(e),
            other => Ok(other),
        }
    }

    pub fn done(self) -> DeviceResult<()> {
        match self.ok()? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub fn value(self) -> DeviceResult<u64> {
        match self.ok()? {
            Reply::Value(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    pub fn pair(self) -> DeviceResult<(u64, u64)> {
        match self.ok()? {
            Reply::Pair(a, b) => Ok((a, b)),
            other => Err(unexpected(other)),
        }
    }

    pub fn flag(self) -> DeviceResult<bool> {
        match self.ok()? {
            Reply::Flag(f) => Ok(f),
            other => Err(unexpected(other)),
        }
    }

    pub fn bytes(self) -> DeviceResult<Vec<u8>> {
        match self.ok()? {
            Reply::Bytes(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }

    pub fn shape(self) -> DeviceResult<FunctionShape> {
        match self.ok()? {
            Reply::Shape(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }
}

/// A reply of the wrong kind (a bug on one side).
fn unexpected(reply: Reply) -> DeviceError {
    DeviceError::Failed(format!("the device answered {reply:?}"))
}

/// A reply, and what a stream call learnt of the stream's device time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub reply: Reply,
    /// (device time measured since last told, whether measurements are still pending).
    pub news: Option<(u64, bool)>,
}

impl Answer {
    pub fn failed(e: DeviceError) -> Answer {
        Answer {
            reply: Reply::Failed(e),
            news: None,
        }
    }
}
