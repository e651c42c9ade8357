//! What a module image is and how long: the driver gets only a pointer. A fat binary and the
//! CUDA runtime's wrapper around one carry their size in their header, an ELF cubin in its
//! section table, and PTX is a NUL-terminated string.

use gpushare_protocol::control::ModuleFormat;

use crate::types::{FATBIN_MAGIC, FATBIN_WRAPPER_MAGIC};

/// Largest image believed: a header claiming more is corrupt.
const MAX_IMAGE: usize = 4 << 30;

/// An image's format and extent, from its first bytes.
///
/// # Safety
/// `p` points to a module image the program handed to the driver: readable for as far as the
/// image's own header says it extends (which is what CUDA relies on too).
pub unsafe fn locate(p: *const u8) -> Option<(ModuleFormat, *const u8, usize)> {
    if p.is_null() {
        return None;
    }
    // SAFETY: all reads are within the image, per the contract, and unaligned.
    unsafe {
        let magic = p.cast::<u32>().read_unaligned();
        if magic == FATBIN_WRAPPER_MAGIC {
            // { int magic; int version; const void *data; void *filename_or_fatbins }
            let data = p.add(8).cast::<*const u8>().read_unaligned();
            return locate(data).filter(|(f, _, _)| *f == ModuleFormat::Fatbin);
        }
        if magic == FATBIN_MAGIC {
            // { u32 magic; u16 version; u16 header_size; u64 fat_size }
            let header = p.add(6).cast::<u16>().read_unaligned() as usize;
            let body = p.add(8).cast::<u64>().read_unaligned() as usize;
            let len = header
                .checked_add(body)
                .filter(|l| (16..=MAX_IMAGE).contains(l))?;
            return Some((ModuleFormat::Fatbin, p, len));
        }
        if p.cast::<[u8; 4]>().read_unaligned() == *b"\x7fELF" {
            return elf_len(p).map(|len| (ModuleFormat::Cubin, p, len));
        }
        let len = std::ffi::CStr::from_ptr(p.cast()).to_bytes_with_nul().len();
        (len > 1 && len <= MAX_IMAGE).then_some((ModuleFormat::Ptx, p, len))
    }
}

/// The extent of a 64-bit ELF image: the furthest of its section table, its sections' data
/// and its program headers.
///
/// # Safety
/// As [`locate`].
unsafe fn elf_len(p: *const u8) -> Option<usize> {
    // SAFETY: all reads are inside the image, per the contract.
    unsafe {
        if *p.add(4) != 2 {
            return None; // not ELFCLASS64
        }
        let u16_at = |o: usize| p.add(o).cast::<u16>().read_unaligned() as usize;
        let u64_at = |o: usize| p.add(o).cast::<u64>().read_unaligned() as usize;
        let (phoff, shoff) = (u64_at(0x20), u64_at(0x28));
        let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
        let (shentsize, shnum) = (u16_at(0x3a), u16_at(0x3c));
        if shoff > MAX_IMAGE || phoff > MAX_IMAGE || (shnum > 0 && shentsize < 0x40) {
            return None;
        }
        let mut end = 0x40usize
            .max(shoff + shentsize * shnum)
            .max(phoff + phentsize * phnum);
        for i in 0..shnum {
            let sh = shoff + i * shentsize;
            const SHT_NOBITS: u32 = 8;
            if p.add(sh + 4).cast::<u32>().read_unaligned() == SHT_NOBITS {
                continue;
            }
            let (offset, size) = (u64_at(sh + 0x18), u64_at(sh + 0x20));
            if offset > MAX_IMAGE || size > MAX_IMAGE {
                return None;
            }
            end = end.max(offset + size);
        }
        (end <= MAX_IMAGE).then_some(end)
    }
}

/// An image's format from bytes already in hand (a file).
pub fn format_of(bytes: &[u8]) -> Option<ModuleFormat> {
    let magic = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    Some(match magic {
        FATBIN_MAGIC => ModuleFormat::Fatbin,
        _ if bytes.starts_with(b"\x7fELF") => ModuleFormat::Cubin,
        _ => ModuleFormat::Ptx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fatbin(body: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        v.extend_from_slice(&1u16.to_le_bytes());
        v.extend_from_slice(&16u16.to_le_bytes());
        v.extend_from_slice(&(body as u64).to_le_bytes());
        v.extend(std::iter::repeat_n(0xab, body));
        v
    }

    #[test]
    fn a_fat_binary_and_its_wrapper_say_how_long_they_are() {
        let fb = fatbin(100);
        // SAFETY: a whole image in a Vec.
        let (format, start, len) = unsafe { locate(fb.as_ptr()) }.expect("fatbin");
        assert_eq!(
            (format, start, len),
            (ModuleFormat::Fatbin, fb.as_ptr(), 116)
        );
        let mut wrapper = Vec::new();
        wrapper.extend_from_slice(&FATBIN_WRAPPER_MAGIC.to_le_bytes());
        wrapper.extend_from_slice(&1u32.to_le_bytes());
        wrapper.extend_from_slice(&(fb.as_ptr() as usize).to_le_bytes());
        wrapper.extend_from_slice(&0usize.to_le_bytes());
        // SAFETY: the wrapper points at the fat binary above, alive.
        let got = unsafe { locate(wrapper.as_ptr()) }.expect("wrapper");
        assert_eq!((got.1, got.2), (fb.as_ptr(), 116));
    }

    #[test]
    fn ptx_is_its_string_with_the_nul() {
        let ptx = b".version 8.0\n.target sm_90\n\0garbage";
        // SAFETY: NUL-terminated.
        let (format, _, len) = unsafe { locate(ptx.as_ptr()) }.expect("ptx");
        assert_eq!((format, len), (ModuleFormat::Ptx, 28));
    }

    #[test]
    fn an_elf_image_ends_where_its_furthest_part_ends() {
        // An ELF64 header, one section of data at 0x100..0x180, section table at 0x200.
        let mut e = vec![0u8; 0x200 + 2 * 0x40];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[0x28..0x30].copy_from_slice(&0x200u64.to_le_bytes());
        e[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
        e[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        let sh = 0x240; // the second section: PROGBITS at 0x100, 0x80 bytes
        e[sh + 4..sh + 8].copy_from_slice(&1u32.to_le_bytes());
        e[sh + 0x18..sh + 0x20].copy_from_slice(&0x100u64.to_le_bytes());
        e[sh + 0x20..sh + 0x28].copy_from_slice(&0x80u64.to_le_bytes());
        // SAFETY: the whole image is in the Vec.
        let (format, _, len) = unsafe { locate(e.as_ptr()) }.expect("elf");
        assert_eq!((format, len), (ModuleFormat::Cubin, 0x280));
    }

    #[test]
    fn formats_of_files() {
        assert_eq!(format_of(&fatbin(0)), Some(ModuleFormat::Fatbin));
        assert_eq!(format_of(b"\x7fELF\x02"), Some(ModuleFormat::Cubin));
        assert_eq!(format_of(b".version 8.0"), Some(ModuleFormat::Ptx));
        assert_eq!(format_of(b"ab"), None);
    }
}
