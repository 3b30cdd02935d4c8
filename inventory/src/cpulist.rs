//! CPU and node lists as the kernel writes them: ranges (`0-3,8,10-11`) and hex masks (`00000000,0000000f`).

/// More CPUs or nodes than any machine has (Linux's NR_CPUS tops out at 8,192).
const MAX_IDS: u32 = 1 << 16;

/// Parses a kernel list such as `0-3,8,10-11`. Returns `None` for anything malformed,
/// so a garbled file becomes a problem rather than a wrong answer.
pub fn parse_list(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    let mut out = Vec::new();
    if text.is_empty() {
        return Some(out);
    }
    for part in text.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                // A range that runs backwards or spans more than any machine has is garbage.
                if b < a || b - a > MAX_IDS {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
        // Many large ranges in a few bytes ("0-999999,0-999999,…") would take gigabytes.
        if out.len() > MAX_IDS as usize {
            return None;
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Parses a hex mask such as `00000000,0000000f` (the oldest kernels have no `*_list` files).
pub fn parse_mask(text: &str) -> Option<Vec<u32>> {
    let digits: Vec<u8> = text.trim().bytes().filter(|&b| b != b',').collect();
    if digits.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (pos, &digit) in digits.iter().rev().enumerate() {
        let nibble = (digit as char).to_digit(16)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                out.push(pos as u32 * 4 + bit);
            }
        }
    }
    Some(out)
}

/// Formats a sorted list back into the kernel's range form.
pub fn format_list(ids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_list(text: &str, expected: Option<&[u32]>) {
        assert_eq!(parse_list(text).as_deref(), expected, "{text:?}");
    }

    #[test]
    fn lists() {
        check_list("0-3,8,10-11\n", Some(&[0, 1, 2, 3, 8, 10, 11]));
        check_list("", Some(&[]));
        check_list("5", Some(&[5]));
        check_list("3-1", None);
        check_list("a-b", None);
        check_list("0-4294967295", None);
        // Found by fuzzing: a few bytes of large ranges must not become gigabytes of CPU ids.
        check_list(&vec!["0-60000"; 400].join(","), None);
    }

    #[test]
    fn masks() {
        assert_eq!(parse_mask("00000000,0000000f").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse_mask("1,00000001").unwrap(), vec![0, 32]);
        assert_eq!(parse_mask("zz"), None);
    }

    #[test]
    fn formats_round_trip() {
        for text in ["0-3,8,10-11", "0", "0,2,4", "1-127"] {
            assert_eq!(format_list(&parse_list(text).unwrap()), text);
        }
    }
}

/// Properties: a CPU set formatted the kernel's way parses back to itself, and a mask of it too.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn format_then_parse_is_identity(set in proptest::collection::btree_set(0u32..4096, 0..200)) {
            let ids: Vec<u32> = set.into_iter().collect();
            let text = super::format_list(&ids);
            let back = if ids.is_empty() { Some(Vec::new()) } else { super::parse_list(&text) };
            prop_assert_eq!(back, Some(ids));
        }

        #[test]
        fn masks_parse_to_their_bits(set in proptest::collection::btree_set(0u32..256, 0..64)) {
            let ids: Vec<u32> = set.into_iter().collect();
            let mut words = [0u32; 8];
            for &id in &ids {
                words[(id / 32) as usize] |= 1 << (id % 32);
            }
            let mask: Vec<String> = words.iter().rev().map(|w| format!("{w:08x}")).collect();
            prop_assert_eq!(super::parse_mask(&mask.join(",")), Some(ids));
        }
    }
}
