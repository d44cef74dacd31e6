//! Fencing tokens: the number that orders leadership terms.

use std::fmt;

/// The fencing token of one leadership term.
///
/// Every new term of a resource gets a token strictly greater than every earlier term's; a
/// renew keeps it. Hand it to downstream systems with each write and have them reject a token
/// smaller than the largest they have seen: that fences out a leader whose lease lapsed while it
/// was paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct FencingToken(i64);

impl FencingToken {
    /// Wraps a raw token, as read from a lease row or a downstream store.
    pub const fn new(raw: i64) -> Self {
        Self(raw)
    }

    /// The raw value (a `bigint` in the lease table).
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for i64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl From<i64> for FencingToken {
    fn from(raw: i64) -> Self {
        Self(raw)
    }
}
