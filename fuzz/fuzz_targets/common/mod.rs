//! What the parser targets share: the parse, re-emit, parse-again round trip.

/// Parses `$data` with `$repr::parse`; when that succeeds, emits the value into a buffer of its
/// `buffer_len()` (which must succeed) and checks that the emitted bytes parse back equal. Evaluates to
/// `Some((value, emitted bytes))`, or `None` when `$data` does not parse.
macro_rules! round_trip {
    ($repr:ident, $data:expr) => {
        $repr::parse($data).ok().map(|value| {
            let mut out = vec![0u8; value.buffer_len()];
            value.emit(&mut out).unwrap();
            assert_eq!($repr::parse(&out), Ok(value));
            (value, out)
        })
    };
}
