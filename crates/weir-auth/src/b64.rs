use base64::alphabet;
use base64::engine::{DecodePaddingMode, Engine, GeneralPurpose, GeneralPurposeConfig};

/// PostgreSQL's decoder tolerates missing padding and stray low bits, and
/// secrets in auth files may come from other tools, so decode leniently while
/// always encoding canonically.
const ENGINE: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

pub(crate) fn encode(data: &[u8]) -> String {
    ENGINE.encode(data)
}

pub(crate) fn decode(text: &[u8]) -> Option<Vec<u8>> {
    ENGINE.decode(text).ok()
}

/// Decodes a value that must be exactly one SHA-256 output long.
pub(crate) fn decode_key(text: &[u8]) -> Option<[u8; 32]> {
    decode(text)?.try_into().ok()
}
