//! Replaying a graph: its nodes' work sent again, one by one in an order their dependencies
//! allow, on the launch stream.

use gpushare_protocol::Command;

use super::Op;
use crate::driver::Driver;
use crate::status::Cu;

impl Driver {
    /// Sends a graph's ops on `stream`, in turn.
    pub(super) fn replay<'a>(&self, ops: impl Iterator<Item = &'a Op>, stream: u32) -> Cu<()> {
        for op in ops {
            match op {
                Op::Launch {
                    function,
                    shape,
                    params,
                } => self.send_launch(*function, shape, stream, params.len(), |dst| {
                    // SAFETY: `dst` has room for the recorded arguments.
                    unsafe { std::ptr::copy_nonoverlapping(params.as_ptr(), dst, params.len()) }
                })?,
                Op::Command(cmd) => self.transport.post(on_stream(*cmd, stream))?,
                Op::Empty => {}
                Op::Host { function, data } => {
                    self.host_function(stream, *function, *data)?;
                }
            }
        }
        Ok(())
    }
}

/// A recorded command, on another stream.
fn on_stream(cmd: Command, s: u32) -> Command {
    match cmd {
        Command::CopyDtoD { src, dst, len, .. } => Command::CopyDtoD {
            stream: s,
            src,
            dst,
            len,
        },
        Command::Memset {
            dst, value, len, ..
        } => Command::Memset {
            stream: s,
            dst,
            value,
            len,
        },
        Command::MemsetWide {
            dst,
            value,
            elem_bytes,
            count,
            ..
        } => Command::MemsetWide {
            stream: s,
            dst,
            value,
            elem_bytes,
            count,
        },
        Command::CopyHtoDHost {
            region,
            offset,
            dst,
            len,
            ..
        } => Command::CopyHtoDHost {
            stream: s,
            region,
            offset,
            dst,
            len,
        },
        Command::CopyDtoHHost {
            src,
            region,
            offset,
            len,
            ..
        } => Command::CopyDtoHHost {
            stream: s,
            src,
            region,
            offset,
            len,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_commands_move_to_the_launch_stream() {
        let recorded = [
            Command::CopyDtoD {
                stream: 3,
                src: 0x1000,
                dst: 0x2000,
                len: 64,
            },
            Command::Memset {
                stream: 3,
                dst: 0x2000,
                value: 7,
                len: 64,
            },
            Command::MemsetWide {
                stream: 3,
                dst: 0x2000,
                value: 0xdead_beef,
                elem_bytes: 4,
                count: 16,
            },
            Command::CopyHtoDHost {
                stream: 3,
                region: 1,
                offset: 128,
                dst: 0x2000,
                len: 64,
            },
            Command::CopyDtoHHost {
                stream: 3,
                src: 0x2000,
                region: 1,
                offset: 128,
                len: 64,
            },
        ];
        let moved = [
            Command::CopyDtoD {
                stream: 9,
                src: 0x1000,
                dst: 0x2000,
                len: 64,
            },
            Command::Memset {
                stream: 9,
                dst: 0x2000,
                value: 7,
                len: 64,
            },
            Command::MemsetWide {
                stream: 9,
                dst: 0x2000,
                value: 0xdead_beef,
                elem_bytes: 4,
                count: 16,
            },
            Command::CopyHtoDHost {
                stream: 9,
                region: 1,
                offset: 128,
                dst: 0x2000,
                len: 64,
            },
            Command::CopyDtoHHost {
                stream: 9,
                src: 0x2000,
                region: 1,
                offset: 128,
                len: 64,
            },
        ];
        for (cmd, want) in recorded.into_iter().zip(moved) {
            assert_eq!(on_stream(cmd, 9), want);
        }
        assert_eq!(
            on_stream(Command::Free { ptr: 0x1000 }, 9),
            Command::Free { ptr: 0x1000 },
            "not stream-ordered: as it was"
        );
    }
}
