//! GPT-2's byte ↔ character map (`bytes_to_unicode`).
//!
//! Byte-level BPE vocabularies store every token as text in which each byte is one character:
//! the printable bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` stand for themselves, and the other 68
//! bytes (controls, space, DEL, NBSP, soft hyphen…) take U+0100.. in byte order, so `Ġ` (U+0120)
//! is the space. Encoding maps input bytes through it; decoding maps token text back.

/// Whether byte `b` stands for itself (the character with the same code point).
const fn is_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character of each byte.
const BYTE_TO_CHAR: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next_shifted = 0x100u32;
    let mut b = 0usize;
    while b < 256 {
        let code = if is_printable(b as u8) {
            b as u32
        } else {
            next_shifted += 1;
            next_shifted - 1
        };
        // Every code is below U+0144, so never a surrogate: the fallback is unreachable.
        table[b] = match char::from_u32(code) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
};

/// The byte of each shifted character U+0100..U+0144 (the non-printable bytes in order).
const SHIFTED_TO_BYTE: [u8; 68] = {
    let mut table = [0u8; 68];
    let mut n = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !is_printable(b as u8) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

/// The character that stands for byte `b` in token text.
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte that character `c` stands for, or `None` for a character outside the map.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let code = c as u32;
    match u8::try_from(code) {
        Ok(b) if is_printable(b) => Some(b),
        Ok(_) => None,
        Err(_) => code
            .checked_sub(0x100)
            .and_then(|i| SHIFTED_TO_BYTE.get(i as usize).copied()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_through_a_distinct_character() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "byte {b} shares {c:?}");
            assert_eq!(char_to_byte(c), Some(b));
        }
    }

    #[test]
    fn known_characters_match_gpt2() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), '\u{100}');
        assert_eq!(byte_to_char(0x7F), '\u{121}');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xE9), 'é');
    }

    #[test]
    fn characters_outside_the_map_have_no_byte() {
        for c in [
            '\0', ' ', '\u{7F}', '\u{A0}', '\u{AD}', '\u{144}', '€', '😀',
        ] {
            assert_eq!(char_to_byte(c), None, "{c:?}");
        }
    }
}
