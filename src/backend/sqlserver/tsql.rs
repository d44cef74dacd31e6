//! SQL Server's statements, in T-SQL: the `MERGE` acquire-or-renew, the releases, the read,
//! the fence, the membership heartbeat, read and leave, and the versioned migrations, with
//! bracket quoting of the table names.

use orion_beacon_entity::{DEFAULT_MEMBER_TABLE, DEFAULT_TABLE};

/// The version name of the lease-table migration, the same as the SeaORM migration's.
pub const MIGRATION_NAME: &str = "m20261129_000001_create_orionbeacon_leases";

/// The versioned, idempotent T-SQL that creates the default lease table (the file
/// `sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql` of this crate, for those who
/// apply it by hand).
/// [`SqlServerLeaseStore::migration_sql`](super::SqlServerLeaseStore::migration_sql) gives it for the store's own table.
pub const MIGRATION_SQL: &str =
    include_str!("../../../sql/m20261129_000001_create_orionbeacon_leases.sqlserver.sql");

/// The version name of the membership-table migration, the same as the SeaORM migration's
/// (`CreateMemberTable::NAME`).
pub const MEMBER_MIGRATION_NAME: &str = "m20261201_000001_create_orionbeacon_members";

/// The versioned, idempotent T-SQL that creates the default membership table of shard sets (the
/// file `sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql` of this crate, for those
/// who apply it by hand).
/// [`SqlServerLeaseStore::member_migration_sql`](super::SqlServerLeaseStore::member_migration_sql)
/// gives it for the store's own membership table.
pub const MEMBER_MIGRATION_SQL: &str =
    include_str!("../../../sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql");

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
pub(super) fn upsert_sql(table: &str) -> String {
    let t = quoted(table);
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
         t.fencing_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, \
         t.acquired_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.acquired_at END, \
         t.renewed_at = CASE WHEN t.expires_at <= @now THEN @now \
         WHEN @now > {tick_after_acquired} THEN @now ELSE {tick_after_acquired} END, \
         t.holder = s.holder, \
         t.expires_at = {next} \
         WHEN NOT MATCHED THEN INSERT (resource, holder, fencing_token, expires_at, acquired_at, renewed_at) \
         VALUES (s.resource, s.holder, 1, {expiry}, @now, @now) \
         OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, \
         inserted.renewed_at, {remaining} AS remaining_ms; \
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
pub(super) fn renew_all_sql(table: &str) -> String {
    let t = quoted(table);
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
         inserted.renewed_at, {remaining} AS remaining_ms, inserted.resource \
         FROM {t} AS t JOIN {held} \
         WHERE t.expires_at > @now; \
         COMMIT TRANSACTION;",
        next = next_expiry("DATEADD(MILLISECOND, @P2, DATEADD(SECOND, @P1, @written))"),
        remaining = remaining_ms("inserted.expires_at"),
    )
}

/// Whole milliseconds from `@now` until `expires` (truncated; negative once past).
fn remaining_ms(expires: &str) -> String {
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

/// The stored row of a resource with its remaining time. Parameter: `@P1` the resource.
pub(super) fn current_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         SELECT holder, fencing_token, expires_at, acquired_at, renewed_at, {remaining} AS remaining_ms \
         FROM {t} WHERE resource = @P1;",
        remaining = remaining_ms("expires_at"),
        t = quoted(table),
    )
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

/// [`MEMBER_MIGRATION_SQL`] for `table`, changed as [`migration_sql`] changes the lease
/// table's.
pub(super) fn member_migration_sql(table: &str) -> String {
    MEMBER_MIGRATION_SQL
        .replace(&quoted(DEFAULT_MEMBER_TABLE), &quoted(table))
        .replace(
            &quoted(&format!("PK_{DEFAULT_MEMBER_TABLE}")),
            &quoted(&format!("PK_{table}")),
        )
}

/// The live members of the shard set `@P1` at `@now`, with their remaining time. `member` is
/// bracket-quoted everywhere (an ISO keyword, `MEMBER OF`).
fn live_members_sql(t: &str) -> String {
    format!(
        "SELECT shard_set, [member], draining, joined_at, heartbeat_at, {remaining} AS remaining_ms \
         FROM {t} WHERE shard_set = @P1 AND expires_at > @now;",
        remaining = remaining_ms("expires_at"),
    )
}

/// A member's heartbeat, then the set's live members: one `MERGE ... WITH (HOLDLOCK)` keyed on
/// `(shard_set, member)` (two first heartbeats of one member cannot both insert), then the read,
/// both at one reading of the database clock (`@now`), so the caller is always among the
/// members read. `joined_at` restarts when the row had lapsed (a member that comes back is a new
/// membership). Parameters: `@P1` the shard set, `@P2` the member, `@P3` whole seconds and `@P4`
/// the remaining milliseconds of the time to live, `@P5` draining (`bit`).
pub(super) fn heartbeat_sql(table: &str) -> String {
    let t = quoted(table);
    let expiry = "DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now))";
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         MERGE {t} WITH (HOLDLOCK) AS t \
         USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s \
         ON t.shard_set = s.shard_set AND t.[member] = s.[member] \
         WHEN MATCHED THEN UPDATE SET \
         t.joined_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.joined_at END, \
         t.draining = @P5, \
         t.heartbeat_at = @now, \
         t.expires_at = {expiry} \
         WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at) \
         VALUES (s.shard_set, s.[member], @P5, @now, @now, {expiry}); \
         {live}",
        live = live_members_sql(&t),
    )
}

/// The live members of a shard set. Parameter: `@P1` the shard set.
pub(super) fn members_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); {live}",
        live = live_members_sql(&quoted(table)),
    )
}

/// A member leaves: its live row is deleted, then the set's lapsed rows (members that died
/// without leaving), and one row says how many live rows the first `DELETE` removed (0 or 1).
/// Parameters: `@P1` the shard set, `@P2` the member.
pub(super) fn leave_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         DECLARE @removed int; \
         DELETE FROM {t} WHERE shard_set = @P1 AND [member] = @P2 AND expires_at > @now; \
         SET @removed = @@ROWCOUNT; \
         DELETE FROM {t} WHERE shard_set = @P1 AND expires_at <= @now; \
         SELECT @removed AS removed;",
        t = quoted(table),
    )
}

/// The membership statements of one table.
#[derive(Debug)]
pub(super) struct MemberStatements {
    pub(super) heartbeat: String,
    pub(super) members: String,
    pub(super) leave: String,
}

impl MemberStatements {
    pub(super) fn new(table: &str) -> Self {
        Self {
            heartbeat: heartbeat_sql(table),
            members: members_sql(table),
            leave: leave_sql(table),
        }
    }
}

/// The statements of one table.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) upsert: String,
    pub(super) release: String,
    pub(super) release_write: String,
    pub(super) current: String,
    pub(super) renew_all: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        Self {
            upsert: upsert_sql(table),
            release: release_sql(table),
            release_write: release_write_sql(table),
            current: current_sql(table),
            renew_all: renew_all_sql(table),
        }
    }
}

#[cfg(test)]
mod tests {
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
                "t.fencing_token = CASE WHEN t.expires_at <= @now THEN t.fencing_token + 1 ELSE t.fencing_token END, ",
                "t.acquired_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.acquired_at END, ",
                "t.renewed_at = CASE WHEN t.expires_at <= @now THEN @now ",
                "WHEN @now > DATEADD(NANOSECOND, 100, t.acquired_at) THEN @now ELSE DATEADD(NANOSECOND, 100, t.acquired_at) END, ",
                "t.holder = s.holder, ",
                "t.expires_at = CASE WHEN DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)) > DATEADD(NANOSECOND, 100, t.expires_at) ",
                "THEN DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)) ELSE DATEADD(NANOSECOND, 100, t.expires_at) END ",
                "WHEN NOT MATCHED THEN INSERT (resource, holder, fencing_token, expires_at, acquired_at, renewed_at) ",
                "VALUES (s.resource, s.holder, 1, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @written)), @now, @now) ",
                "OUTPUT inserted.holder, inserted.fencing_token, inserted.expires_at, inserted.acquired_at, ",
                "inserted.renewed_at, DATEDIFF_BIG(NANOSECOND, @now, inserted.expires_at) / 1000000 AS remaining_ms; ",
                "COMMIT TRANSACTION;",
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

    fn params(sql: &str) -> Vec<&str> {
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
            (&sql.upsert, vec!["@P1", "@P2", "@P3", "@P4"]),
            (&sql.release, vec!["@P1", "@P2"]),
            (&sql.release_write, vec!["@P1", "@P2", "@P3", "@P4"]),
            (&sql.current, vec!["@P1"]),
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
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms \
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
                "inserted.renewed_at, DATEDIFF_BIG(NANOSECOND, @now, inserted.expires_at) / 1000000 AS remaining_ms, inserted.resource ",
                "FROM [orionbeacon_leases] AS t JOIN ",
                "OPENJSON(@P3) WITH (r nvarchar(255) '$.r', h nvarchar(255) '$.h', tk bigint '$.t') AS held ",
                "ON t.resource = held.r COLLATE Latin1_General_100_BIN2 ",
                "AND t.holder = held.h COLLATE Latin1_General_100_BIN2 AND t.fencing_token = held.tk ",
                "WHERE t.expires_at > @now; ",
                "COMMIT TRANSACTION;",
            )
        );
    }

    #[test]
    fn heartbeat_is_one_merge_keyed_on_set_and_member_then_the_live_members() {
        assert_eq!(
            heartbeat_sql(DEFAULT_MEMBER_TABLE),
            concat!(
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "MERGE [orionbeacon_members] WITH (HOLDLOCK) AS t ",
                "USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s ",
                "ON t.shard_set = s.shard_set AND t.[member] = s.[member] ",
                "WHEN MATCHED THEN UPDATE SET ",
                "t.joined_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.joined_at END, ",
                "t.draining = @P5, ",
                "t.heartbeat_at = @now, ",
                "t.expires_at = DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)) ",
                "WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at) ",
                "VALUES (s.shard_set, s.[member], @P5, @now, @now, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now))); ",
                "SELECT shard_set, [member], draining, joined_at, heartbeat_at, ",
                "DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms ",
                "FROM [orionbeacon_members] WHERE shard_set = @P1 AND expires_at > @now;",
            )
        );
        let sql = heartbeat_sql(DEFAULT_MEMBER_TABLE);
        // One MERGE, serializable on the key range; the key is in ON and nothing else is.
        assert_eq!(sql.matches("MERGE ").count(), 1);
        let on = &sql[sql.find(" ON ").unwrap()..sql.find(" WHEN MATCHED").unwrap()];
        assert_eq!(
            on,
            " ON t.shard_set = s.shard_set AND t.[member] = s.[member]"
        );
        // One reading of the database clock for the write and the read.
        assert_eq!(sql.matches("SYSUTCDATETIME()").count(), 1);
        assert!(sql.find("MERGE ").unwrap() < sql.find("SELECT shard_set").unwrap());
    }

    #[test]
    fn members_and_leave_text() {
        assert_eq!(
            members_sql(DEFAULT_MEMBER_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             SELECT shard_set, [member], draining, joined_at, heartbeat_at, \
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms \
             FROM [orionbeacon_members] WHERE shard_set = @P1 AND expires_at > @now;"
        );
        assert_eq!(
            leave_sql(DEFAULT_MEMBER_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             DECLARE @removed int; \
             DELETE FROM [orionbeacon_members] WHERE shard_set = @P1 AND [member] = @P2 AND expires_at > @now; \
             SET @removed = @@ROWCOUNT; \
             DELETE FROM [orionbeacon_members] WHERE shard_set = @P1 AND expires_at <= @now; \
             SELECT @removed AS removed;"
        );
    }

    #[test]
    fn membership_values_are_parameters_only() {
        let sql = MemberStatements::new(DEFAULT_MEMBER_TABLE);
        for (sql, expected) in [
            (&sql.heartbeat, vec!["@P1", "@P2", "@P3", "@P4", "@P5"]),
            (&sql.members, vec!["@P1"]),
            (&sql.leave, vec!["@P1", "@P2"]),
        ] {
            assert_eq!(params(sql), expected, "{sql}");
            assert!(!sql.contains('\''), "no string literals: {sql}");
            assert!(
                !sql.contains('"'),
                "no quoted identifiers or literals: {sql}"
            );
            assert!(sql.ends_with(';'), "{sql}");
        }
        let custom = MemberStatements::new("shard_members");
        for sql in [&custom.heartbeat, &custom.members, &custom.leave] {
            assert!(sql.contains("[shard_members]"), "{sql}");
            assert!(!sql.contains(DEFAULT_MEMBER_TABLE), "{sql}");
        }
    }

    #[test]
    fn member_migration_is_the_shipped_file() {
        assert!(MEMBER_MIGRATION_SQL.contains(MEMBER_MIGRATION_NAME));
        assert!(MEMBER_MIGRATION_SQL.contains(
            "IF OBJECT_ID(N'[orionbeacon_members]', N'U') IS NULL\nCREATE TABLE [orionbeacon_members] ("
        ));
        for column in [
            "shard_set nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "[member] nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL",
            "draining bit NOT NULL",
            "joined_at datetime2(7) NOT NULL",
            "heartbeat_at datetime2(7) NOT NULL",
            "expires_at datetime2(7) NOT NULL",
            "CONSTRAINT [PK_orionbeacon_members] PRIMARY KEY CLUSTERED (shard_set, [member])",
        ] {
            assert!(MEMBER_MIGRATION_SQL.contains(column), "{column}");
        }
        assert!(!MEMBER_MIGRATION_SQL.contains("\nGO"), "one batch");
        assert_eq!(
            member_migration_sql(DEFAULT_MEMBER_TABLE),
            MEMBER_MIGRATION_SQL
        );
        let custom = member_migration_sql("shard_members");
        assert!(custom.contains(
            "IF OBJECT_ID(N'[shard_members]', N'U') IS NULL\nCREATE TABLE [shard_members] ("
        ));
        assert!(custom
            .contains("CONSTRAINT [PK_shard_members] PRIMARY KEY CLUSTERED (shard_set, [member])"));
        assert!(!custom.contains("[orionbeacon_members]"));
        assert!(!custom.contains("[PK_orionbeacon_members]"));
        // The lease table's migration is untouched by the member table's.
        assert!(!MIGRATION_SQL.contains("orionbeacon_members"));
    }
}
