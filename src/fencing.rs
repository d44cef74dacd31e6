//! Fencing tokens: the number that orders leadership terms, and the term a fence checks.

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

/// What a fence checks: one term of one holder on one resource.
///
/// A [`LeaderTerm`](crate::LeaderTerm) converts into one (`&term`); the checks themselves are
/// [`SeaOrmLeaseStore::fence`](crate::SeaOrmLeaseStore::fence) and friends.
#[derive(Debug, Clone, Copy)]
pub struct Term<'a> {
    /// The resource.
    pub resource: &'a str,
    /// The holder.
    pub holder: &'a str,
    /// The term's token.
    pub token: FencingToken,
}

impl FencingToken {
    /// For a store *outside* the lease database: a condition that admits a write fenced by this
    /// token on a row that remembers the highest token that wrote it (`column`), i.e. `column IS
    /// NULL OR column <= token`. Set the column to this token in the same statement; a leader
    /// whose term was superseded then updates nothing.
    ///
    /// ```
    /// use orion_beacon::FencingToken;
    /// use sea_orm::sea_query::{Alias, Expr, ExprTrait, PostgresQueryBuilder, Query};
    ///
    /// let token = FencingToken::new(42);
    /// let write = Query::update()
    ///     .table(Alias::new("reports"))
    ///     .value(Alias::new("body"), "...")
    ///     .value(Alias::new("last_token"), token.get())
    ///     .and_where(Expr::col(Alias::new("id")).eq(1))
    ///     .and_where(token.admits(Alias::new("last_token")))
    ///     .to_string(PostgresQueryBuilder);
    /// assert_eq!(
    ///     write,
    ///     r#"UPDATE "reports" SET "body" = '...', "last_token" = 42 WHERE "id" = 1 AND ("last_token" IS NULL OR "last_token" <= 42)"#
    /// );
    /// ```
    pub fn admits<C: sea_orm::sea_query::IntoColumnRef>(
        self,
        column: C,
    ) -> sea_orm::sea_query::Expr {
        use sea_orm::sea_query::{Expr, ExprTrait};
        let column = column.into_column_ref();
        Expr::col(column.clone())
            .is_null()
            .or(Expr::col(column).lte(self.0))
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
