//! Encoding and decoding control messages (bincode, bounded by [`MAX_CONTROL_MESSAGE`]).

use serde::{Deserialize, Serialize};

use super::MAX_CONTROL_MESSAGE;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_CONTROL_MESSAGE>()
}

/// Why a control message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("cannot decode control message: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("cannot encode control message: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("control message has {0} trailing bytes")]
    TrailingBytes(usize),
}

/// The protocol version a [`super::ClientMessage::Hello`] announces, read without decoding the rest
/// of it, so that a client of another version (whose hello may be shaped differently) is told
/// `VersionMismatch` rather than a decoding error. `None` when `bytes` is not a hello.
///
/// Wire invariant, for every protocol version: `Hello` is the first variant of
/// `ClientMessage`, and `protocol_version` is its first field.
pub fn hello_version(bytes: &[u8]) -> Option<u32> {
    let ((variant, version), _): ((u32, u32), usize) =
        bincode::serde::decode_from_slice(bytes, config()).ok()?;
    (variant == 0).then_some(version)
}

/// Encodes a control message.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(msg, config())?)
}

/// Encodes a message into `buf` (no allocation); returns the bytes written. For messages on
/// a hot path, such as gpushared's requests to its device workers.
pub fn encode_into<T: Serialize>(msg: &T, buf: &mut [u8]) -> Result<usize, CodecError> {
    Ok(bincode::serde::encode_into_slice(msg, buf, config())?)
}

/// Decodes a message at the start of `bytes`; returns it and the bytes it took (what
/// follows is the caller's: a request's payload, say).
pub fn decode_prefix<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<(T, usize), CodecError> {
    Ok(bincode::serde::decode_from_slice(bytes, config())?)
}

/// Decodes one whole control message; trailing garbage is an error.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, CodecError> {
    let (msg, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - used));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PriorityClass;
    use crate::control::{BrokerMessage, ClientMessage, Hello, Role};
    use proptest::prelude::*;

    #[test]
    fn hello_round_trips() {
        let hello = ClientMessage::Hello(Hello {
            protocol_version: crate::PROTOCOL_VERSION,
            role: Role::Client,
            client_name: "trainer".into(),
            requested_class: Some(PriorityClass::BestEffort),
            sq_entries: 256,
            arena_size: 1 << 20,
            gpu: Some(1),
        });
        let bytes = encode(&hello).expect("encode");
        assert_eq!(decode::<ClientMessage>(&bytes).expect("decode"), hello);
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<ClientMessage>(&longer).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<ClientMessage>(&bytes);
            let _ = decode::<BrokerMessage>(&bytes);
        }
    }

    #[test]
    fn the_version_of_a_hello_is_read_before_the_rest() {
        let hello = |version| {
            ClientMessage::Hello(Hello {
                protocol_version: version,
                role: Role::Client,
                client_name: "x".into(),
                requested_class: None,
                sq_entries: 0,
                arena_size: 0,
                gpu: None,
            })
        };
        let bytes = encode(&hello(7)).expect("encode");
        assert_eq!(hello_version(&bytes), Some(7));
        // A later version's hello with fields this one does not know: still readable.
        let mut longer = encode(&hello(crate::PROTOCOL_VERSION + 1)).expect("encode");
        longer.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(hello_version(&longer), Some(crate::PROTOCOL_VERSION + 1));
        assert!(decode::<ClientMessage>(&longer).is_err());
        // Not a hello.
        let status = encode(&ClientMessage::Status { request: 1 }).expect("encode");
        assert_eq!(hello_version(&status), None);
        assert_eq!(hello_version(&[]), None);
    }

    #[test]
    fn huge_length_prefix_is_refused_without_allocating() {
        // A GetFunction whose name claims to be 2^60 bytes long.
        let mut bytes = encode(&ClientMessage::GetFunction {
            request: 1,
            module: 2,
            name: String::new(),
        })
        .expect("encode");
        bytes.pop();
        bytes.extend_from_slice(&[0xff, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        assert!(decode::<ClientMessage>(&bytes).is_err());
    }
}
