//! The CUDA runtime's check that it talks to a genuine driver: it asks the driver for a
//! digest of facts both sides know (versions, process and thread, the export tables'
//! addresses, the devices' UUIDs and PCI addresses) and compares it with its own. The digest
//! is HMAC-MD2 under a fixed key; MD2 is RFC 1319's.

/// MD2's substitution table (RFC 1319, built from the digits of pi).
const S: [u8; 256] = [
    0x29, 0x2E, 0x43, 0xC9, 0xA2, 0xD8, 0x7C, 0x01, 0x3D, 0x36, 0x54, 0xA1, 0xEC, 0xF0, 0x06, 0x13,
    0x62, 0xA7, 0x05, 0xF3, 0xC0, 0xC7, 0x73, 0x8C, 0x98, 0x93, 0x2B, 0xD9, 0xBC, 0x4C, 0x82, 0xCA,
    0x1E, 0x9B, 0x57, 0x3C, 0xFD, 0xD4, 0xE0, 0x16, 0x67, 0x42, 0x6F, 0x18, 0x8A, 0x17, 0xE5, 0x12,
    0xBE, 0x4E, 0xC4, 0xD6, 0xDA, 0x9E, 0xDE, 0x49, 0xA0, 0xFB, 0xF5, 0x8E, 0xBB, 0x2F, 0xEE, 0x7A,
    0xA9, 0x68, 0x79, 0x91, 0x15, 0xB2, 0x07, 0x3F, 0x94, 0xC2, 0x10, 0x89, 0x0B, 0x22, 0x5F, 0x21,
    0x80, 0x7F, 0x5D, 0x9A, 0x5A, 0x90, 0x32, 0x27, 0x35, 0x3E, 0xCC, 0xE7, 0xBF, 0xF7, 0x97, 0x03,
    0xFF, 0x19, 0x30, 0xB3, 0x48, 0xA5, 0xB5, 0xD1, 0xD7, 0x5E, 0x92, 0x2A, 0xAC, 0x56, 0xAA, 0xC6,
    0x4F, 0xB8, 0x38, 0xD2, 0x96, 0xA4, 0x7D, 0xB6, 0x76, 0xFC, 0x6B, 0xE2, 0x9C, 0x74, 0x04, 0xF1,
    0x45, 0x9D, 0x70, 0x59, 0x64, 0x71, 0x87, 0x20, 0x86, 0x5B, 0xCF, 0x65, 0xE6, 0x2D, 0xA8, 0x02,
    0x1B, 0x60, 0x25, 0xAD, 0xAE, 0xB0, 0xB9, 0xF6, 0x1C, 0x46, 0x61, 0x69, 0x34, 0x40, 0x7E, 0x0F,
    0x55, 0x47, 0xA3, 0x23, 0xDD, 0x51, 0xAF, 0x3A, 0xC3, 0x5C, 0xF9, 0xCE, 0xBA, 0xC5, 0xEA, 0x26,
    0x2C, 0x53, 0x0D, 0x6E, 0x85, 0x28, 0x84, 0x09, 0xD3, 0xDF, 0xCD, 0xF4, 0x41, 0x81, 0x4D, 0x52,
    0x6A, 0xDC, 0x37, 0xC8, 0x6C, 0xC1, 0xAB, 0xFA, 0x24, 0xE1, 0x7B, 0x08, 0x0C, 0xBD, 0xB1, 0x4A,
    0x78, 0x88, 0x95, 0x8B, 0xE3, 0x63, 0xE8, 0x6D, 0xE9, 0xCB, 0xD5, 0xFE, 0x3B, 0x00, 0x1D, 0x39,
    0xF2, 0xEF, 0xB7, 0x0E, 0x66, 0x58, 0xD0, 0xE4, 0xA6, 0x77, 0x72, 0xF8, 0xEB, 0x75, 0x4B, 0x0A,
    0x31, 0x44, 0x50, 0xB4, 0x8F, 0xED, 0x1F, 0x1A, 0xDB, 0x99, 0x8D, 0x33, 0x9F, 0x11, 0x83, 0x14,
];

/// MD2, fed a byte at a time.
#[derive(Clone)]
pub struct Md2 {
    /// The 48-byte state: 16 of hash, the current block, and hash xor block.
    x: [u8; 48],
    checksum: [u8; 16],
    /// Bytes of the current block so far.
    pos: usize,
    /// The checksum's running byte.
    last: u8,
}

impl Default for Md2 {
    fn default() -> Md2 {
        Md2 {
            x: [0; 48],
            checksum: [0; 16],
            pos: 0,
            last: 0,
        }
    }
}

impl Md2 {
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        let i = self.pos;
        self.x[16 + i] = b;
        self.x[32 + i] = self.x[i] ^ b;
        self.checksum[i] ^= S[(b ^ self.last) as usize];
        self.last = self.checksum[i];
        self.pos = (i + 1) % 16;
        if self.pos == 0 {
            let mut t = 0u8;
            for round in 0..18u8 {
                for v in self.x.iter_mut() {
                    *v ^= S[t as usize];
                    t = *v;
                }
                t = t.wrapping_add(round);
            }
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.pos) as u8;
        for _ in 0..pad {
            self.byte(pad);
        }
        let checksum = self.checksum;
        self.update(&checksum);
        let mut out = [0; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

/// HMAC (RFC 2104) over MD2, whose block is 16 bytes.
pub fn hmac_md2(key: &[u8; 16], message: &[&[u8]]) -> [u8; 16] {
    let mut inner = Md2::default();
    inner.update(&key.map(|k| k ^ 0x36));
    for part in message {
        inner.update(part);
    }
    let inner = inner.finish();
    let mut outer = Md2::default();
    outer.update(&key.map(|k| k ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

/// The runtime's key.
const KEY: [u8; 16] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];

/// What the digest covers besides the devices, laid out as the runtime lays it out.
#[repr(C)]
pub struct Facts {
    pub driver_version: u32,
    pub version: u32,
    pub process: u32,
    pub thread: u32,
    pub cudart_table: usize,
    pub integrity_table: usize,
    pub check_fn: usize,
    pub unix_seconds: u64,
}

const _: () = assert!(std::mem::size_of::<Facts>() == 48);

/// One device as the digest covers it.
#[repr(C)]
pub struct DeviceFacts {
    pub uuid: [u8; 16],
    pub pci_domain: i32,
    pub pci_bus: i32,
    pub pci_device: i32,
}

const _: () = assert!(std::mem::size_of::<DeviceFacts>() == 28);

fn bytes_of<T>(v: &T) -> &[u8] {
    // SAFETY: `T` is one of the plain `repr(C)` structs above, with no padding (asserted).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// The digest the runtime expects for `facts` and `devices`.
pub fn digest(facts: &Facts, devices: &[DeviceFacts]) -> [u64; 2] {
    // Versions ending in 0 or 1 expect fixed answers.
    match facts.version % 10 {
        0 => return [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        1 => return [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
        _ => {}
    }
    let mut parts: Vec<&[u8]> = vec![bytes_of(facts)];
    parts.extend(devices.iter().map(bytes_of));
    let d = hmac_md2(&KEY, &parts);
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&d[..8]);
    hi.copy_from_slice(&d[8..]);
    [u64::from_ne_bytes(lo), u64::from_ne_bytes(hi)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md2(s: &str) -> String {
        let mut m = Md2::default();
        m.update(s.as_bytes());
        m.finish().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(md2(""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn the_digest_depends_on_every_fact() {
        let facts = |thread| Facts {
            driver_version: 13000,
            version: 13002,
            process: 42,
            thread,
            cudart_table: 0x1000,
            integrity_table: 0x2000,
            check_fn: 0x3000,
            unix_seconds: 1_700_000_000,
        };
        let dev = DeviceFacts {
            uuid: [7; 16],
            pci_domain: 0,
            pci_bus: 6,
            pci_device: 0,
        };
        let a = digest(&facts(1), std::slice::from_ref(&dev));
        assert_ne!(a, digest(&facts(2), std::slice::from_ref(&dev)));
        assert_ne!(a, digest(&facts(1), &[]));
        let mut fixed = facts(1);
        fixed.version = 13000;
        assert_eq!(digest(&fixed, &[])[0], 0x3341_181C_03CB_675C);
    }
}
