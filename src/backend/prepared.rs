//! Statements rendered once per store and then only re-bound.
//!
//! sea-query renders the (long) acquire-or-renew statement from scratch on every call, which
//! costs more client CPU than the database spends running it. The text depends only on the
//! backend and the table, so each statement is rendered once with marker values, and each call
//! just binds its own values into the recorded parameter slots. The driver's prepared-statement
//! cache then sees the same text every time, too.

use sea_orm::{DbBackend, DbErr, Statement, Value, Values};

use super::dialect::Dialect;

const RESOURCE: &str = "\u{1}orion-beacon:resource\u{1}";
const CANDIDATE: &str = "\u{1}orion-beacon:candidate\u{1}";
/// The payload's marker: a statement of the payload shape is built with it, and each call
/// binds its own payload (or `NULL`) there.
pub(crate) const PAYLOAD: &str = "\u{1}orion-beacon:payload\u{1}";
/// A lease length no caller can pass (validated leases are at most 366 days).
const MILLIS: i64 = 987_654_321_987;

#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Resource,
    Candidate,
    Payload,
    /// The lease length, in the form the backend binds it ([`Dialect::lease_value`]).
    Lease,
    Fixed(Value),
}

/// A rendered statement and where each call's values go.
#[derive(Clone)]
pub(crate) struct Prepared {
    dialect: &'static dyn Dialect,
    backend: DbBackend,
    sql: String,
    slots: Vec<Slot>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("backend", &self.backend)
            .field("sql", &self.sql)
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Renders `build` once with marker values and records the parameter slots.
    pub(crate) fn new(
        dialect: &'static dyn Dialect,
        build: impl Fn(&str, &str, i64) -> Result<Statement, DbErr>,
    ) -> Result<Self, DbErr> {
        let stmt = build(RESOURCE, CANDIDATE, MILLIS)?;
        let lease = dialect.lease_value(MILLIS);
        let slots = stmt
            .values
            .map(|v| v.0)
            .unwrap_or_default()
            .into_iter()
            .map(|value| match &value {
                Value::String(Some(s)) if s == RESOURCE => Slot::Resource,
                Value::String(Some(s)) if s == CANDIDATE => Slot::Candidate,
                Value::String(Some(s)) if s == PAYLOAD => Slot::Payload,
                _ if value == lease => Slot::Lease,
                _ => Slot::Fixed(value),
            })
            .collect();
        Ok(Self {
            dialect,
            backend: stmt.db_backend,
            sql: stmt.sql,
            slots,
        })
    }

    /// The statement for these values: the same as rendering it afresh.
    pub(crate) fn bind(&self, resource: &str, candidate: &str, millis: i64) -> Statement {
        self.bind_with(resource, candidate, millis, None)
    }

    /// [`bind`](Self::bind), with `payload` where the statement was built with [`PAYLOAD`].
    pub(crate) fn bind_with(
        &self,
        resource: &str,
        candidate: &str,
        millis: i64,
        payload: Option<&str>,
    ) -> Statement {
        let values = self
            .slots
            .iter()
            .map(|slot| match slot {
                Slot::Resource => Value::from(resource),
                Slot::Candidate => Value::from(candidate),
                Slot::Payload => Value::from(payload.map(str::to_owned)),
                Slot::Lease => self.dialect.lease_value(millis),
                Slot::Fixed(v) => v.clone(),
            })
            .collect();
        Statement::from_sql_and_values(self.backend, self.sql.clone(), Values(values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{mysql, postgres, postgres::Postgres, sqlite::Sqlite, statements};
    use sea_orm::sea_query::Alias;

    fn table() -> Alias {
        Alias::new("orionbeacon_leases")
    }

    type Build = Box<dyn Fn(&str, &str, i64) -> Result<Statement, DbErr>>;
    type Case = (DbBackend, &'static dyn Dialect, Build);

    /// Binding into the cached text gives exactly what rendering afresh gives.
    #[test]
    fn bound_statements_equal_fresh_ones() {
        let cases: Vec<Case> = vec![
            (
                DbBackend::Postgres,
                &Postgres,
                Box::new(|r, c, m| {
                    postgres::statements::upsert_reporting(&Postgres, &table(), r, c, m, None)
                        .map(|q| DbBackend::Postgres.build(&q))
                }),
            ),
            (
                DbBackend::Sqlite,
                &Sqlite,
                Box::new(|r, c, m| {
                    statements::upsert(&Sqlite, &table(), r, c, m, None)
                        .map(|q| DbBackend::Sqlite.build(&q))
                }),
            ),
            (
                DbBackend::MySql,
                &mysql::MySql,
                Box::new(|r, c, m| mysql::statements::upsert_returning(&table(), r, c, m, None)),
            ),
            (
                DbBackend::Postgres,
                &Postgres,
                Box::new(|r, c, _| {
                    Ok(
                        DbBackend::Postgres.build(&postgres::statements::release_notifying(
                            &Postgres,
                            &table(),
                            "orionbeacon_leases",
                            r,
                            c,
                        )),
                    )
                }),
            ),
            (
                DbBackend::MySql,
                &mysql::MySql,
                Box::new(|r, c, _| {
                    Ok(DbBackend::MySql.build(&statements::release(&mysql::MySql, &table(), r, c)))
                }),
            ),
            (
                DbBackend::Sqlite,
                &Sqlite,
                Box::new(|r, _, _| {
                    Ok(DbBackend::Sqlite.build(&statements::current(
                        &Sqlite as &dyn crate::backend::dialect::Dialect,
                        &table(),
                        r,
                    )))
                }),
            ),
        ];
        for (backend, dialect, build) in cases {
            let prepared = Prepared::new(dialect, &build).unwrap();
            for (r, c, m) in [
                ("nightly-report", "node-a", 15_000),
                ("r", "c", 1),
                ("é", "x y", 31_622_400_000),
            ] {
                let fresh = build(r, c, m).unwrap();
                let bound = prepared.bind(r, c, m);
                assert_eq!(bound.sql, fresh.sql, "{backend:?}");
                assert_eq!(bound.values, fresh.values, "{backend:?} {r} {c} {m}");
            }
        }
    }

    type PayloadBuild = Box<dyn Fn(&str, &str, i64, Option<&str>) -> Result<Statement, DbErr>>;

    /// The same for the payload forms: the payload (or `NULL`) lands in every payload slot.
    #[test]
    fn bound_payload_statements_equal_fresh_ones() {
        let cases: Vec<(&'static dyn Dialect, PayloadBuild)> = vec![
            (
                &Postgres,
                Box::new(|r, c, m, p| {
                    postgres::statements::upsert_reporting(&Postgres, &table(), r, c, m, p)
                        .map(|q| DbBackend::Postgres.build(&q))
                }),
            ),
            (
                &Sqlite,
                Box::new(|r, c, m, p| {
                    statements::upsert(&Sqlite, &table(), r, c, m, p)
                        .map(|q| DbBackend::Sqlite.build(&q))
                }),
            ),
            (
                &mysql::MySql,
                Box::new(|r, c, m, p| mysql::statements::upsert_returning(&table(), r, c, m, p)),
            ),
        ];
        for (dialect, build) in cases {
            let prepared = Prepared::new(dialect, |r, c, m| build(r, c, m, Some(PAYLOAD))).unwrap();
            for payload in [
                Some("http://node-a:8080"),
                None,
                Some(""),
                Some("é 'x' \"y\""),
            ] {
                let fresh = build("r", "c", 15_000, payload).unwrap();
                let bound = prepared.bind_with("r", "c", 15_000, payload);
                assert_eq!(bound.sql, fresh.sql);
                assert_eq!(bound.values, fresh.values, "{payload:?}");
            }
        }
    }
}
