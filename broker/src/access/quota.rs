//! A memory size in the policy file: a number of bytes, a string with units ("8 GiB"), or
//! "unlimited". One that does not fit in 64 bits is refused, naming it: it must never turn
//! into "unlimited" on the way.

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota(pub Option<u64>);

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Negative(i64),
            Fraction(f64),
            Text(String),
        }
        let bad = |what: String| serde::de::Error::custom(what);
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => fits(b, &b.to_string()).map_err(bad),
            Raw::Negative(n) => Err(bad(format!("a memory size cannot be negative: {n}"))),
            Raw::Fraction(f) => Err(bad(format!(
                "a memory size in bytes is a whole number, not {f} (or write it with units: \"1.5 GiB\")"
            ))),
            Raw::Text(t) if t.trim().eq_ignore_ascii_case("unlimited") => Ok(Quota(None)),
            Raw::Text(t) => parse(t.trim()).map_err(bad),
        }
    }
}

/// "8 GiB", "512 MB", "1.5 GiB", "4096".
fn parse(text: &str) -> Result<Quota, String> {
    let size = text
        .parse::<bytesize::ByteSize>()
        .map_err(|e| format!("bad memory size `{text}`: {e}"))?;
    fits(size.as_u64(), text)
}

/// Refuses a size the parser had to saturate (the largest `u64` stands for "too large").
fn fits(bytes: u64, text: &str) -> Result<Quota, String> {
    if bytes == u64::MAX {
        return Err(format!(
            "memory size `{text}` does not fit in 64 bits (write \"unlimited\" for no bound)"
        ));
    }
    Ok(Quota(Some(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Entry {
        q: Quota,
    }

    fn read(value: &str) -> Result<Quota, String> {
        toml::from_str::<Entry>(&format!("q = {value}"))
            .map(|e| e.q)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn sizes_read_as_written_and_too_large_ones_are_refused_by_name() {
        assert_eq!(read("\"8 GiB\""), Ok(Quota(Some(8 << 30))));
        assert_eq!(read("4096"), Ok(Quota(Some(4096))));
        assert_eq!(read("\"unlimited\""), Ok(Quota(None)));
        assert_eq!(read("\"1.5 KiB\""), Ok(Quota(Some(1536))));
        for huge in ["\"20000000 PiB\"", "\"18446744073709551615\"", "\"16 EiB\""] {
            let e = read(huge).expect_err(huge);
            assert!(e.contains("does not fit in 64 bits"), "{huge}: {e}");
            assert!(e.contains(huge.trim_matches('"')), "names the value: {e}");
        }
        assert!(read("-5").expect_err("negative").contains("negative: -5"));
        assert!(read("1.5").expect_err("fraction").contains("whole number"));
        assert!(read("\"lots\"").expect_err("words").contains("`lots`"));
    }
}
