//! Fencing tokens: the number that orders leadership terms, and the term a fence checks.

use std::fmt;

/// The fencing token of one leadership term.
///
/// Every new term of a resource gets a token strictly greater than every earlier term's; a
/// renew keeps it. Hand it to downstream systems with each write and have them reject a token
/// smaller than the largest they have seen: that fences out a leader whose lease lapsed while it
/// was paused.
///
/// It is a column type of your own SeaORM entities (a `BIGINT`), and binds in queries:
///
/// ```
/// use orion_beacon::FencingToken;
/// use sea_orm::entity::prelude::*;
///
/// #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
/// #[sea_orm(table_name = "reports")]
/// pub struct Model {
///     #[sea_orm(primary_key)]
///     pub id: i64,
///     /// The term that wrote the row.
///     pub written_by: FencingToken,
/// }
/// # #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
/// # pub enum Relation {}
/// # impl ActiveModelBehavior for ActiveModel {}
///
/// let newer = Entity::find().filter(Column::WrittenBy.gt(FencingToken::new(41)));
/// ```
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

// A token is a column type of the application's own entities (a `BIGINT`, like the lease
// table's `fencing_token`): a model field can be a `FencingToken`, and a query binds one.

impl From<FencingToken> for sea_orm::Value {
    fn from(token: FencingToken) -> Self {
        token.0.into()
    }
}

impl sea_orm::TryGetable for FencingToken {
    fn try_get_by<I: sea_orm::ColIdx>(
        res: &sea_orm::QueryResult,
        index: I,
    ) -> Result<Self, sea_orm::TryGetError> {
        i64::try_get_by(res, index).map(FencingToken)
    }
}

impl sea_orm::sea_query::ValueType for FencingToken {
    fn try_from(v: sea_orm::Value) -> Result<Self, sea_orm::sea_query::ValueTypeErr> {
        <i64 as sea_orm::sea_query::ValueType>::try_from(v).map(FencingToken)
    }

    fn type_name() -> String {
        "FencingToken".to_owned()
    }

    fn array_type() -> sea_orm::sea_query::ArrayType {
        sea_orm::sea_query::ArrayType::BigInt
    }

    fn column_type() -> sea_orm::sea_query::ColumnType {
        sea_orm::sea_query::ColumnType::BigInteger
    }
}

impl sea_orm::sea_query::Nullable for FencingToken {
    fn null() -> sea_orm::Value {
        <i64 as sea_orm::sea_query::Nullable>::null()
    }
}

impl sea_orm::IntoActiveValue<FencingToken> for FencingToken {
    fn into_active_value(self) -> sea_orm::ActiveValue<FencingToken> {
        sea_orm::ActiveValue::Set(self)
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
