//! FNV-1a, the one hash CARMA's history signatures use (a model file with
//! its batch size; a transparent job's name and script): stable across
//! releases and platforms, so a signature written by one version is found
//! by the next.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a over the bytes in order.
pub fn fnv1a<'a>(bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    bytes.into_iter().fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::fnv1a;

    #[test]
    fn published_test_vectors() {
        // From the FNV reference (draft-eastlake-fnv): "" and "a".
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
