//! SQL Server's lease statements, in T-SQL: the `MERGE` acquire-or-renew, the releases, the read,
//! the fence and the versioned migration of the lease table, with bracket quoting of the table
//! names (the membership statements are in `member_tsql`).

use orion_beacon_entity::DEFAULT_TABLE;

/// The version name of the lease-table migration, the same as the SeaORM migration's.
pub const MIGRATION_NAME: &str = "m20261129_000001_create_orionbeacon_leases";

/// The versioned, idempotent T-SQL that creates the default lease table (the file
/// `sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql` of this crate, for those who
/// apply it by hand).
/// [`SqlServerLeaseStore::migration_sql`](super::SqlServerLeaseStore::migration_sql) gives it for the store's own table.
pub const MIGRATION_SQL: &str =
    include_str!("../sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql");

/// The version name of the migration that adds the payload columns, the same as the SeaORM
/// `AddLeasePayload`'s.
pub const PAYLOAD_MIGRATION_NAME: &str = "m20261203_000001_add_orionbeacon_leases_payload";

/// The versioned, idempotent T-SQL that adds the payload columns (`payload nvarchar(1024)`,
/// `payload_token bigint`, both nullable) to the default lease table in place (the file
/// `sql/m20261203_000001_add_orionbeacon_leases_payload.sqlserver.sql` of this crate).
pub const PAYLOAD_MIGRATION_SQL: &str =
    include_str!("../sql/m20261203_000001_add_orionbeacon_leases_payload.sqlserver.sql");

/// The payload of the row's current term, last in every lease row a statement returns:
/// the stored payload only while the term that wrote it is the row's.
fn current_payload(row: &str) -> String {
    format!(
        "CASE WHEN {row}payload_token = {row}fencing_token THEN {row}payload END AS current_payload"
    )
}

/// A table name, bracket-quoted (the name is validated first, so it never holds a `]`; one is
/// doubled anyway, as T-SQL quoting demands).
pub(super) fn quoted(table: &str) -> String {
    format!("[{}]", table.replace(']', "]]"))
}

/// The one-statement acquire-or-renew (after the `@now` declaration). Parameters: `@P1` the
/// resource, `@P2` the candidate, `@P3` whole seconds and `@P4` the remaining milliseconds of
/// the lease (`DATEADD` takes an `int`, and 366 days of milliseconds do not fit one).
///
/// - no row: insert with token 1, `acquired_at = renewed_at = now`;
/// - row expired (whoever held it): new term, token + 1, `acquired_at = renewed_at = now`;
/// - row live and held by the candidate: renew, token and `acquired_at` kept, `renewed_at` at
///   least one tick (100 ns) after `acquired_at`, so `acquired_at = renewed_at` holds exactly
///   for new terms;
/// - row live and held by another: no branch applies, nothing changes, no row is output.
///
/// An updated row's expiry is at least one tick after the old one ([`next_expiry`]).
/// `SET` expressions read the row as it was before the statement. The remaining time is
/// counted in nanoseconds (exact for `datetime2(7)`) and divided down to whole milliseconds;
/// `DATEDIFF_BIG(MILLISECOND, ...)` would count millisecond boundaries crossed, which rounds
/// up as often as down.
///
/// `@P5` is the payload (or `NULL`): the update writes it with `payload_token` set to the
/// row's new token, the insert with token 1, and the row's current payload is output last
/// (`current_payload`).
pub(super) fn upsert_sql(table: &str) -> String {
    let t = quoted(table);
    let set = "t.payload = @P5, \
               t.payload_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, ";
    let (columns, values) = (", payload, payload_token", ", @P5, 1");
    let output = format!(", {}", current_payload("inserted."));
    let expiry = "DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written))";
    let tick_after_acquired = "DATEADD(NANOSECOND, 100, t.acquired_at)";
    format!(
        "SET XACT_ABORT ON; \
         DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         DECLARE @locked int; \
         BEGIN TRANSACTION; \
         SELECT @locked = COUNT(*) FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE resource = @P1; \
         DECLARE @written datetime2(7) = SYSUTCDATETIME(); \
         MERGE {t} WITH (HOLDLOCK) AS t \
         USING (SELECT @P1 AS resource, @P2 AS holder) AS s \
         ON t.resource = s.resource \
         WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE SET \
         {set}t.fencing_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, \
         t.acquired_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.acquired_at END, \
         t.renewed_at = CASE WHEN t.expires_at <= @now THEN @now \
         WHEN @now > {tick_after_acquired} THEN @now ELSE {tick_after_acquired} END, \
         t.holder = s.holder, \
         t.expires_at = {next} \
         WHEN NOT MATCHED THEN INSERT (resource, holder, fencing_token, expires_at, acquired_at, renewed_at{columns}) \
         VALUES (s.resource, s.holder, 1, {expiry}, @now, @now{values}) \
         OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, \
         inserted.renewed_at, {remaining} AS remaining_ms{output}; \
         COMMIT TRANSACTION;",
        next = next_expiry(expiry),
        remaining = remaining_ms("inserted.expires_at"),
    )
}

/// The expiry of a write to a lease row (`t`) that replaces `t.expires_at`: `expiry` (a whole
/// lease from the write), but at least one tick (100 ns) after the old expiry. A write is
/// named by its holder, token and expiry ([`release_write_sql`]), and within a term the
/// expiry only grows, so no two writes of a term share a name (not two renews in one tick,
/// not a renew asking for a shorter lease). For a new term the old expiry has passed and this
/// is `expiry`.
fn next_expiry(expiry: &str) -> String {
    let tick_after_expiry = "DATEADD(NANOSECOND, 100, t.expires_at)";
    format!("CASE WHEN {expiry} > {tick_after_expiry} THEN {expiry} ELSE {tick_after_expiry} END")
}

/// The batch renew (after the `@now` declaration). Parameters: `@P1` whole seconds and `@P2`
/// the remaining milliseconds of the lease, `@P3` the leases as one JSON document
/// (`[{"r": resource, "h": holder, "t": token}, ...]`). Each lease whose row still has that
/// holder and token and is live at `@now` gets a whole lease from the write (after the rows'
/// locks are taken, as in [`upsert_sql`]; at least one tick past its expiry, see
/// [`next_expiry`]), and `renewed_at` as a renew sets it; nothing else
/// changes, no term starts. `OUTPUT` lists the renewed rows, the resource last. The JSON
/// columns take the table's binary collation, so names compare byte for byte.
///
/// Each row's current payload is output last (`current_payload`); a batch renew keeps it.
pub(super) fn renew_all_sql(table: &str) -> String {
    let t = quoted(table);
    let output = format!(", {}", current_payload("inserted."));
    let held = "OPENJSON(@P3) WITH (r nvarchar(255) '$.r', h nvarchar(255) '$.h', tk bigint '$.t') AS held \
                ON t.resource = held.r COLLATE Latin1_General_100_BIN2 \
                AND t.holder = held.h COLLATE Latin1_General_100_BIN2 AND t.fencing_token = held.tk";
    let tick_after_acquired = "DATEADD(NANOSECOND, 100, t.acquired_at)";
    format!(
        "SET XACT_ABORT ON; \
         DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         DECLARE @locked int; \
         BEGIN TRANSACTION; \
         SELECT @locked = COUNT(*) FROM {t} AS t WITH (UPDLOCK, HOLDLOCK) JOIN {held}; \
         DECLARE @written datetime2(7) = SYSUTCDATETIME(); \
         UPDATE t SET \
         t.expires_at = {next}, \
         t.renewed_at = CASE WHEN @now > {tick_after_acquired} THEN @now ELSE {tick_after_acquired} END \
         OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, \
         inserted.renewed_at, {remaining} AS remaining_ms, inserted.resource{output} \
         FROM {t} AS t JOIN {held} \
         WHERE t.expires_at > @now; \
         COMMIT TRANSACTION;",
        next = next_expiry("DATEADD(MILLISECOND, @P2, DATEADD(SECOND, @P1, @written))"),
        remaining = remaining_ms("inserted.expires_at"),
    )
}

/// Whole milliseconds from `@now` until `expires` (truncated; negative once past).
pub(super) fn remaining_ms(expires: &str) -> String {
    format!("DATEDIFF_BIG(NANOSECOND, @now, {expires}) / 1000000")
}

/// The guarded release: a tombstone only for the live lease of the candidate. The expiry moves
/// back to the term's last renew (never later than now), so a renew already in flight, which
/// started after that renew, sees the lease ended instead of extending it. Parameters: `@P1`
/// the resource, `@P2` the candidate.
pub(super) fn release_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         UPDATE {t} SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
         WHERE resource = @P1 AND holder = @P2 AND expires_at > @now;",
        t = quoted(table),
    )
}

/// The release of one exact write: [`release_sql`], only while the row still carries the
/// token and the expiry the holder was last granted. Parameters: `@P1` the resource, `@P2`
/// the holder, `@P3` the token, `@P4` the expiry (`datetime2`, as read from the row).
pub(super) fn release_write_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         UPDATE {t} SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
         WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at = @P4 \
         AND expires_at > @now;",
        t = quoted(table),
    )
}

/// The offer of a live term to a named successor (`LeaseStore::offer`): the term of `@P2`
/// with token `@P3` ends and a new one begins, its token one higher, held by `@P4` (the
/// offer's marker) from now until `@P5` seconds and `@P6` milliseconds after. Parameters:
/// `@P1` the resource.
pub(super) fn offer_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         UPDATE {t} SET holder = @P4, fencing_token = fencing_token + 1, acquired_at = @now, \
         renewed_at = @now, expires_at = DATEADD(MILLISECOND, @P6, DATEADD(SECOND, @P5, @now)) \
         WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at > @now;",
        t = quoted(table),
    )
}

/// The take of an open offer: the row held by the marker `@P2` with token `@P3` becomes
/// `@P4`'s for `@P5` seconds and `@P6` milliseconds from now, as a renew writes it (at least
/// one tick past its expiry, see [`next_expiry`]). Parameters: `@P1` the resource.
pub(super) fn take_offer_sql(table: &str) -> String {
    let tick_after_acquired = "DATEADD(NANOSECOND, 100, t.acquired_at)";
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         UPDATE t SET t.holder = @P4, \
         t.renewed_at = CASE WHEN @now > {tick_after_acquired} THEN @now ELSE {tick_after_acquired} END, \
         t.expires_at = {next} \
         FROM {t} AS t \
         WHERE t.resource = @P1 AND t.holder = @P2 AND t.fencing_token = @P3 AND t.expires_at > @now;",
        t = quoted(table),
        next = next_expiry("DATEADD(MILLISECOND, @P6, DATEADD(SECOND, @P5, @now))"),
    )
}

/// The transactional fence: one row while the term is current, and a shared lock on the lease
/// row held to the end of the caller's transaction (`HOLDLOCK`), so a rival's `MERGE` waits.
/// Parameters: `@P1` the resource, `@P2` the holder, `@P3` the token.
pub(super) fn fence_sql(table: &str) -> String {
    format!(
        "SELECT 1 AS held FROM {t} WITH (HOLDLOCK, ROWLOCK) \
         WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at > SYSUTCDATETIME();",
        t = quoted(table),
    )
}

/// The stored row of a resource with its remaining time and its current payload last.
/// Parameter: `@P1` the resource.
pub(super) fn current_sql(table: &str) -> String {
    let output = format!(", {}", current_payload(""));
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         SELECT holder, fencing_token, expires_at, acquired_at, renewed_at, {remaining} AS remaining_ms{output} \
         FROM {t} WHERE resource = @P1;",
        remaining = remaining_ms("expires_at"),
        t = quoted(table),
    )
}

/// A read that names the columns of the lease table's last migration (the payload columns) and
/// returns nothing: error 207 (invalid column name) on a table made before them.
pub(super) fn payload_probe_sql(table: &str) -> String {
    format!(
        "SELECT TOP 0 {} FROM {t};",
        current_payload(""),
        t = quoted(table)
    )
}

/// [`PAYLOAD_MIGRATION_SQL`] for `table`.
pub(super) fn payload_migration_sql(table: &str) -> String {
    PAYLOAD_MIGRATION_SQL.replace(&quoted(DEFAULT_TABLE), &quoted(table))
}

/// [`MIGRATION_SQL`] for `table`: the bracket-quoted table name and its primary key's name are
/// the only places the default name is changed.
pub(super) fn migration_sql(table: &str) -> String {
    MIGRATION_SQL
        .replace(&quoted(DEFAULT_TABLE), &quoted(table))
        .replace(
            &quoted(&format!("PK_{DEFAULT_TABLE}")),
            &quoted(&format!("PK_{table}")),
        )
}

/// The statements of one table.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) upsert: String,
    pub(super) release: String,
    pub(super) release_write: String,
    pub(super) offer: String,
    pub(super) take_offer: String,
    pub(super) current: String,
    pub(super) renew_all: String,
    pub(super) payload_probe: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        Self {
            upsert: upsert_sql(table),
            release: release_sql(table),
            release_write: release_write_sql(table),
            offer: offer_sql(table),
            take_offer: take_offer_sql(table),
            current: current_sql(table),
            renew_all: renew_all_sql(table),
            payload_probe: payload_probe_sql(table),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    // The statements are plain text: pin every character of them.
    #[test]
    fn upsert_is_one_merge_with_holdlock_and_output() {
        assert_eq!(
            upsert_sql(DEFAULT_TABLE),
            concat!(
                "SET XACT_ABORT ON; ",
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "DECLARE @locked int; ",
                "BEGIN TRANSACTION; ",
                "SELECT @locked = COUNT(*) FROM [orionbeacon_leases] WITH (UPDLOCK, HOLDLOCK) WHERE resource = @P1; ",
                "DECLARE @written datetime2(7) = SYSUTCDATETIME(); ",
                "MERGE [orionbeacon_leases] WITH (HOLDLOCK) AS t ",
                "USING (SELECT @P1 AS resource, @P2 AS holder) AS s ",
                "ON t.resource = s.resource ",
                "WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE SET ",
                "t.payload = @P5, ",
                "t.payload_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, ",
                "t.fencing_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, ",
                "t.acquired_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.acquired_at END, ",
                "t.renewed_at = CASE WHEN t.expires_at <= @now THEN @now ",
                "WHEN @now > DATEADD(NANOSECOND, 100, t.acquired_at) THEN @now ELSE DATEADD(NANOSECOND, 100, t.acquired_at) END, ",
                "t.holder = s.holder, ",
                "t.expires_at = CASE WHEN DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)) > DATEADD(NANOSECOND, 100, t.expires_at) ",
                "THEN DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)) ELSE DATEADD(NANOSECOND, 100, t.expires_at) END ",
                "WHEN NOT MATCHED THEN INSERT (resource, holder, fencing_token, expires_at, acquired_at, renewed_at, payload, payload_token) ",
                "VALUES (s.resource, s.holder, 1, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)), @now, @now, @P5, 1) ",
                "OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, ",
                "inserted.renewed_at, DATEDIFF_BIG(NANOSECOND, @now, inserted.expires_at) / 1000000 AS remaining_ms, ",
                "CASE WHEN inserted.payload_token = inserted.fencing_token THEN inserted.payload END AS current_payload; ",
                "COMMIT TRANSACTION;",
            )
        );
    }

    #[test]
    fn offer_and_take_are_one_guarded_update_each() {
        assert_eq!(
            offer_sql(DEFAULT_TABLE),
            concat!(
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "UPDATE [orionbeacon_leases] SET holder = @P4, fencing_token = fencing_token + 1, acquired_at = @now, ",
                "renewed_at = @now, expires_at = DATEADD(MILLISECOND, @P6, DATEADD(SECOND, @P5, @now)) ",
                "WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at > @now;",
            )
        );
        assert_eq!(
            take_offer_sql(DEFAULT_TABLE),
            concat!(
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "UPDATE t SET t.holder = @P4, ",
                "t.renewed_at = CASE WHEN @now > DATEADD(NANOSECOND, 100, t.acquired_at) THEN @now ELSE DATEADD(NANOSECOND, 100, t.acquired_at) END, ",
                "t.expires_at = CASE WHEN DATEADD(MILLISECOND, @P6, DATEADD(SECOND, @P5, @now)) > DATEADD(NANOSECOND, 100, t.expires_at) ",
                "THEN DATEADD(MILLISECOND, @P6, DATEADD(SECOND, @P5, @now)) ELSE DATEADD(NANOSECOND, 100, t.expires_at) END ",
                "FROM [orionbeacon_leases] AS t ",
                "WHERE t.resource = @P1 AND t.holder = @P2 AND t.fencing_token = @P3 AND t.expires_at > @now;",
            )
        );
    }

    #[test]
    fn upsert_respects_the_known_pitfalls() {
        let sql = upsert_sql(DEFAULT_TABLE);
        // One MERGE, serializable on the key range, terminated.
        assert_eq!(sql.matches("MERGE ").count(), 1);
        assert!(sql.contains("MERGE [orionbeacon_leases] WITH (HOLDLOCK) AS t "));
        assert!(sql.ends_with(';'));
        // The lease filter is in WHEN MATCHED AND, never in ON.
        let on = &sql[sql.find(" ON ").unwrap()..sql.find(" WHEN MATCHED").unwrap()];
        assert_eq!(on, " ON t.resource = s.resource");
        assert!(sql.contains(
            "WHEN MATCHED AND (t.holder = s.holder OR t.expires_at <= @now) THEN UPDATE"
        ));
        // The clock is read twice per batch: liveness at the start (`@now`), the lease's end
        // after the row's key range is locked (`@written`), as the only later read.
        assert_eq!(sql.matches("SYSUTCDATETIME()").count(), 2);
        let lock = sql.find("WITH (UPDLOCK, HOLDLOCK)").unwrap();
        let written = sql.find("DECLARE @written").unwrap();
        assert!(lock < written && written < sql.find("MERGE ").unwrap());
        assert!(!sql.contains("DATEADD(SECOND, @P3, @now)"), "{sql}");
        // One transaction, rolled back whole on any error.
        assert!(
            sql.starts_with("SET XACT_ABORT ON; DECLARE @now datetime2(7) = SYSUTCDATETIME(); ")
        );
        assert!(sql.ends_with(" COMMIT TRANSACTION;"));
        // No output row means denied: OUTPUT sits on the MERGE itself.
        assert!(sql.contains(" OUTPUT inserted.holder,"));
    }

    pub(crate) fn params(sql: &str) -> Vec<&str> {
        let mut found: Vec<&str> = sql
            .match_indices("@P")
            .map(|(i, _)| {
                let digits = sql[i + 2..]
                    .find(|c: char| !c.is_ascii_digit())
                    .map_or(sql.len(), |end| i + 2 + end);
                &sql[i..digits]
            })
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    #[test]
    fn values_are_parameters_only() {
        let sql = Statements::new(DEFAULT_TABLE);
        for (sql, expected) in [
            (&sql.upsert, vec!["@P1", "@P2", "@P3", "@P4", "@P5"]),
            (&sql.release, vec!["@P1", "@P2"]),
            (&sql.release_write, vec!["@P1", "@P2", "@P3", "@P4"]),
            (&sql.current, vec!["@P1"]),
            (&sql.payload_probe, vec![]),
        ] {
            assert_eq!(params(sql), expected, "{sql}");
            assert!(!sql.contains('\''), "no string literals: {sql}");
            assert!(
                !sql.contains('"'),
                "no quoted identifiers or literals: {sql}"
            );
            assert!(sql.ends_with(';'), "{sql}");
        }
    }

    #[test]
    fn fence_text() {
        assert_eq!(
            fence_sql(DEFAULT_TABLE),
            "SELECT 1 AS held FROM [orionbeacon_leases] WITH (HOLDLOCK, ROWLOCK) \
             WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at > SYSUTCDATETIME();"
        );
    }

    #[test]
    fn release_and_current_text() {
        assert_eq!(
            release_sql(DEFAULT_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             UPDATE [orionbeacon_leases] SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
             WHERE resource = @P1 AND holder = @P2 AND expires_at > @now;"
        );
        assert_eq!(
            release_write_sql(DEFAULT_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             UPDATE [orionbeacon_leases] SET expires_at = CASE WHEN renewed_at < @now THEN renewed_at ELSE @now END \
             WHERE resource = @P1 AND holder = @P2 AND fencing_token = @P3 AND expires_at = @P4 \
             AND expires_at > @now;"
        );
        assert_eq!(
            current_sql(DEFAULT_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             SELECT holder, fencing_token, expires_at, acquired_at, renewed_at, \
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms, \
             CASE WHEN payload_token = fencing_token THEN payload END AS current_payload \
             FROM [orionbeacon_leases] WHERE resource = @P1;"
        );
    }

    #[test]
    fn batch_renew_is_one_update_from_json() {
        assert_eq!(
            renew_all_sql(DEFAULT_TABLE),
            concat!(
                "SET XACT_ABORT ON; ",
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "DECLARE @locked int; ",
                "BEGIN TRANSACTION; ",
                "SELECT @locked = COUNT(*) FROM [orionbeacon_leases] AS t WITH (UPDLOCK, HOLDLOCK) JOIN ",
                "OPENJSON(@P3) WITH (r nvarchar(255) '$.r', h nvarchar(255) '$.h', tk bigint '$.t') AS held ",
                "ON t.resource = held.r COLLATE Latin1_General_100_BIN2 ",
                "AND t.holder = held.h COLLATE Latin1_General_100_BIN2 AND t.fencing_token = held.tk; ",
                "DECLARE @written datetime2(7) = SYSUTCDATETIME(); ",
                "UPDATE t SET ",
                "t.expires_at = CASE WHEN DATEADD(MILLISECOND, @P2, DATEADD(SECOND, @P1, @written)) > DATEADD(NANOSECOND, 100, t.expires_at) ",
                "THEN DATEADD(MILLISECOND, @P2, DATEADD(SECOND, @P1, @written)) ELSE DATEADD(NANOSECOND, 100, t.expires_at) END, ",
                "t.renewed_at = CASE WHEN @now > DATEADD(NANOSECOND, 100, t.acquired_at) THEN @now ELSE DATEADD(NANOSECOND, 100, t.acquired_at) END ",
                "OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, ",
                "inserted.renewed_at, DATEDIFF_BIG(NANOSECOND, @now, inserted.expires_at) / 1000000 AS remaining_ms, inserted.resource, ",
                "CASE WHEN inserted.payload_token = inserted.fencing_token THEN inserted.payload END AS current_payload ",
                "FROM [orionbeacon_leases] AS t JOIN ",
                "OPENJSON(@P3) WITH (r nvarchar(255) '$.r', h nvarchar(255) '$.h', tk bigint '$.t') AS held ",
                "ON t.resource = held.r COLLATE Latin1_General_100_BIN2 ",
                "AND t.holder = held.h COLLATE Latin1_General_100_BIN2 AND t.fencing_token = held.tk ",
                "WHERE t.expires_at > @now; ",
                "COMMIT TRANSACTION;",
            )
        );
    }
}
#[cfg(test)]
mod payload_forms {
    use super::*;

    // The probe names the payload columns unquoted, as the statements do.
    #[test]
    fn the_probe_names_the_last_steps_columns() {
        assert_eq!(
            payload_probe_sql(DEFAULT_TABLE),
            r#"SELECT TOP 0 CASE WHEN payload_token = fencing_token THEN payload END AS current_payload FROM [orionbeacon_leases];"#
        );
    }
}
