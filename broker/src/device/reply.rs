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
    /// A page of a module's function names: how many it has, and the names from the first
    /// asked for on ([`Reply::names_page`]).
    Names(u32, Vec<String>),
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

    pub fn names(self) -> DeviceResult<(u32, Vec<String>)> {
        match self.ok()? {
            Reply::Names(total, names) => Ok((total, names)),
            other => Err(unexpected(other)),
        }
    }

    /// The names of a module's functions from the `first`th on, as many as fit one answer
    /// (a device worker's answers are at most 64 KiB), and how many there are. A name too long
    /// for any answer is refused.
    pub fn names_page(mut names: Vec<String>, first: u32) -> DeviceResult<Reply> {
        let total = u32::try_from(names.len())
            .map_err(|_| DeviceError::Failed("more functions than a count holds".into()))?;
        let rest = names.split_off((first as usize).min(names.len()));
        let mut page = Vec::new();
        let mut bytes = 0;
        for name in rest {
            bytes += name.len() + NAME_OVERHEAD;
            if bytes > NAMES_PAGE {
                if page.is_empty() {
                    return Err(DeviceError::NotSupported {
                        backend: "gpushare".into(),
                        what: format!("a function name of {} bytes", name.len()),
                    });
                }
                break;
            }
            page.push(name);
        }
        Ok(Reply::Names(total, page))
    }
}

/// Bytes of names one [`Reply::Names`] carries at most, counting [`NAME_OVERHEAD`] for each.
pub const NAMES_PAGE: usize = 48 << 10;
/// What a name costs in an answer besides its bytes (its length prefix, with room to spare).
const NAME_OVERHEAD: usize = 16;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn page(names: &[String], first: u32) -> (u32, Vec<String>) {
        Reply::names_page(names.to_vec(), first)
            .and_then(Reply::names)
            .expect("a page")
    }

    #[test]
    fn names_come_a_page_at_a_time_and_every_one_once() {
        let names: Vec<String> = (0..5000).map(|i| format!("_Z6kernel{i:0>40}")).collect();
        let mut got = Vec::new();
        let mut pages = 0;
        while got.len() < names.len() {
            let (total, more) = page(&names, got.len() as u32);
            assert_eq!(total, 5000);
            assert!(
                !more.is_empty(),
                "a page brings something while names remain"
            );
            let bytes: usize = more.iter().map(|n| n.len() + NAME_OVERHEAD).sum();
            assert!(bytes <= NAMES_PAGE, "{bytes} bytes in one page");
            got.extend(more);
            pages += 1;
        }
        assert_eq!(got, names, "in order");
        assert!(pages > 1, "more than one answer holds");
        assert_eq!(page(&names, 5000), (5000, vec![]), "past the end: none");
        assert_eq!(page(&names, u32::MAX), (5000, vec![]));
        assert_eq!(page(&[], 0), (0, vec![]));
    }

    #[test]
    fn a_full_page_fits_a_device_workers_answer() {
        // Long names and short ones: the most bytes, and the most length prefixes.
        for len in [0, 1, 200, NAMES_PAGE - NAME_OVERHEAD] {
            let names = vec!["n".repeat(len); NAMES_PAGE / (len + NAME_OVERHEAD) + 2];
            let answer = Answer {
                reply: Reply::names_page(names, 0).expect("a page"),
                news: Some((u64::MAX, true)),
            };
            let bytes = gpushare_protocol::control::encode(&answer).expect("encodes");
            // `remote/channel`'s MAX_ANSWER.
            assert!(
                bytes.len() < 64 << 10,
                "{} bytes for names of {len}",
                bytes.len()
            );
        }
    }

    #[test]
    fn a_name_no_answer_holds_is_refused() {
        let names = vec!["a".to_string(), "x".repeat(NAMES_PAGE)];
        assert_eq!(page(&names, 0), (2, vec!["a".to_string()]));
        assert!(matches!(
            Reply::names_page(names, 1),
            Err(DeviceError::NotSupported { .. })
        ));
    }

    #[test]
    fn a_sim_module_lists_its_functions_in_order() {
        use crate::device::call::Call;
        use crate::device::executor::Executor;
        use crate::device::sim::{SimDevice, SimOptions};
        let exec = Executor::new(SimDevice::new(SimOptions::default()));
        let image = b"gpushare-sim-module 1\nkernel spin\nkernel b_2\nkernel a\n\0";
        let format = gpushare_protocol::control::ModuleFormat::Ptx;
        let load = Call::LoadModule { id: 1, format };
        assert!(exec.run(load, image).reply.ok().is_ok());
        let names = |first| {
            exec.run(Call::FunctionNames { module: 1, first }, &[])
                .reply
        };
        let want = ["spin", "b_2", "a"].map(String::from).to_vec();
        assert_eq!(names(0).names(), Ok((3, want)));
        assert_eq!(names(2).names(), Ok((3, vec!["a".to_string()])));
        let none = exec.run(
            Call::FunctionNames {
                module: 9,
                first: 0,
            },
            &[],
        );
        assert!(none.reply.names().is_err(), "no module 9");
    }
}
