//! Standard output for readers that may go away: `gpushare status | head -4`, `| grep -q`, a
//! pager closed early. A closed pipe ends the output quietly, as it does for coreutils, instead
//! of the panic `println!` gives; any other write error is reported.

use std::io::{self, Write};

/// Whether the text reached the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Printed {
    Yes,
    /// The reader closed its end: print nothing more.
    ReaderGone,
}

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> io::Result<Printed> {
    write_to(&mut io::stdout().lock(), text.as_bytes())
}

/// Writes `bytes` to `out`, treating a closed pipe as the reader's choice.
pub fn write_to(out: &mut impl Write, bytes: &[u8]) -> io::Result<Printed> {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(Printed::Yes),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Printed::ReaderGone),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;
    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("no space left on device"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_reader_is_not_an_error_but_a_full_disk_is() {
        assert_eq!(write_to(&mut Vec::new(), b"x").ok(), Some(Printed::Yes));
        assert_eq!(write_to(&mut Closed, b"x").ok(), Some(Printed::ReaderGone));
        assert!(write_to(&mut Full, b"x").is_err());
    }
}
