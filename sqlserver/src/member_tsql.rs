//! SQL Server's membership statements, in T-SQL: the heartbeat, the read and the leave of a
//! shard set's members, the heartbeat and the read of a ranked election's candidates, and the
//! versioned migrations of the membership table.

use orion_beacon_entity::DEFAULT_MEMBER_TABLE;

use super::tsql::{quoted, remaining_ms};

/// The version name of the membership-table migration, the same as the SeaORM migration's
/// (`CreateMemberTable::NAME`).
pub const MEMBER_MIGRATION_NAME: &str = "m20261201_000001_create_orionbeacon_members";

/// The versioned, idempotent T-SQL that creates the default membership table of shard sets (the
/// file `sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql` of this crate, for those
/// who apply it by hand).
/// [`SqlServerLeaseStore::member_migration_sql`](super::SqlServerLeaseStore::member_migration_sql)
/// gives it for the store's own membership table.
pub const MEMBER_MIGRATION_SQL: &str =
    include_str!("../sql/m20261201_000001_create_orionbeacon_members.sqlserver.sql");

/// The version name of the members' counts migration, the same as the SeaORM migration's
/// (`AddMemberHolding::NAME`).
pub const HOLDING_MIGRATION_NAME: &str = "m20261205_000001_add_orionbeacon_members_holding";

/// The versioned, idempotent T-SQL that adds the members' counts to the default membership
/// table (the file `sql/m20261205_000001_add_orionbeacon_members_holding.sqlserver.sql` of this
/// crate). With them a shard-set node skips its look at the set's leases while the members'
/// counts say no resource can be free.
pub const HOLDING_MIGRATION_SQL: &str =
    include_str!("../sql/m20261205_000001_add_orionbeacon_members_holding.sqlserver.sql");

/// [`HOLDING_MIGRATION_SQL`] for `table`.
pub(super) fn holding_migration_sql(table: &str) -> String {
    HOLDING_MIGRATION_SQL.replace(&quoted(DEFAULT_MEMBER_TABLE), &quoted(table))
}

/// The version name of the candidate rank's migration, the same as the SeaORM migration's
/// (`AddMemberRank::NAME`).
pub const RANK_MIGRATION_NAME: &str = "m20261207_000001_add_orionbeacon_members_rank";

/// The versioned, idempotent T-SQL that adds the candidate rank (`candidate_rank bigint NULL`)
/// to the default membership table (the file
/// `sql/m20261207_000001_add_orionbeacon_members_rank.sqlserver.sql` of this crate). Only ranked
/// electors (`ElectorBuilder::rank`) need it; shard sets work without it.
pub const RANK_MIGRATION_SQL: &str =
    include_str!("../sql/m20261207_000001_add_orionbeacon_members_rank.sqlserver.sql");

/// [`RANK_MIGRATION_SQL`] for `table`.
pub(super) fn rank_migration_sql(table: &str) -> String {
    RANK_MIGRATION_SQL.replace(&quoted(DEFAULT_MEMBER_TABLE), &quoted(table))
}

/// [`MEMBER_MIGRATION_SQL`] for `table`, changed as
/// [`migration_sql`](super::tsql::migration_sql) changes the lease table's.
pub(super) fn member_migration_sql(table: &str) -> String {
    MEMBER_MIGRATION_SQL
        .replace(&quoted(DEFAULT_MEMBER_TABLE), &quoted(table))
        .replace(
            &quoted(&format!("PK_{DEFAULT_MEMBER_TABLE}")),
            &quoted(&format!("PK_{table}")),
        )
}

/// The live members of the shard set `@P1` at `@now`, with their remaining time and the counts
/// their last heartbeat wrote. `member` is bracket-quoted everywhere (an ISO keyword,
/// `MEMBER OF`).
fn live_members_sql(t: &str) -> String {
    let counts = ", CASE WHEN counted_at = heartbeat_at THEN leases_held END AS leases_held, \
                  CASE WHEN counted_at = heartbeat_at THEN set_hash END AS set_hash";
    format!(
        "SELECT shard_set, [member], draining, joined_at, heartbeat_at, {remaining} AS remaining_ms{counts} \
         FROM {t} WHERE shard_set = @P1 AND expires_at > @now;",
        remaining = remaining_ms("expires_at"),
    )
}

/// A member's heartbeat, then the set's live members: one `MERGE ... WITH (HOLDLOCK)` keyed on
/// `(shard_set, member)` (two first heartbeats of one member cannot both insert), then the read,
/// both at one reading of the database clock (`@now`), so the caller is always among the
/// members read. `joined_at` restarts when the row had lapsed (a member that comes back is a new
/// membership). Parameters: `@P1` the shard set, `@P2` the member, `@P3` whole seconds and `@P4`
/// the remaining milliseconds of the time to live, `@P5` draining (`bit`), `@P6` the leases
/// the member leads and `@P7` its list's fingerprint (`bigint`s, or `NULL`s), written with
/// `counted_at = @now`.
pub(super) fn heartbeat_sql(table: &str) -> String {
    let t = quoted(table);
    let written = Written {
        draining: "@P5",
        set: ", t.leases_held = @P6, t.set_hash = @P7, t.counted_at = @now",
        columns: ", leases_held, set_hash, counted_at",
        values: ", @P6, @P7, @now",
    };
    merge_then_read(&t, &written, &live_members_sql(&t))
}

/// What a membership `MERGE` writes beside the key and the times: the draining flag, and the
/// further columns of the update (`set`) and of the insert (`columns`, `values`).
struct Written {
    draining: &'static str,
    set: &'static str,
    columns: &'static str,
    values: &'static str,
}

/// One membership heartbeat at one reading of the clock (`@now`), then `live`: a
/// `MERGE ... WITH (HOLDLOCK)` keyed on `(@P1, @P2)`, its time to live `@P3` whole seconds and
/// `@P4` milliseconds, `joined_at` restarting when the row had lapsed.
fn merge_then_read(t: &str, written: &Written, live: &str) -> String {
    let expiry = "DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now))";
    let Written {
        draining,
        set,
        columns,
        values,
    } = written;
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
         MERGE {t} WITH (HOLDLOCK) AS t \
         USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s \
         ON t.shard_set = s.shard_set AND t.[member] = s.[member] \
         WHEN MATCHED THEN UPDATE SET \
         t.joined_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.joined_at END, \
         t.draining = {draining}, \
         t.heartbeat_at = @now, \
         t.expires_at = {expiry}{set} \
         WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at{columns}) \
         VALUES (s.shard_set, s.[member], {draining}, @now, @now, {expiry}{values}); \
         {live}"
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

/// A read that names the columns of the membership table's last migration (the counts) and
/// returns nothing: error 207 (invalid column name) on a table made before them.
pub(super) fn members_probe_sql(table: &str) -> String {
    format!(
        "SELECT TOP 0 leases_held, set_hash, counted_at FROM {t};",
        t = quoted(table)
    )
}

/// The live candidates of the election kept under `@P1` at `@now`: each one's rank, how long it
/// has been live (from `joined_at` to `@now`, counted as `remaining_ms` counts) and its
/// remaining time. A row without a rank is no candidate.
fn live_candidates_sql(t: &str) -> String {
    format!(
        "SELECT [member], candidate_rank, {live_for} AS live_for_ms, {remaining} AS remaining_ms \
         FROM {t} WHERE shard_set = @P1 AND expires_at > @now AND candidate_rank IS NOT NULL;",
        live_for = "DATEDIFF_BIG(NANOSECOND, joined_at, @now) / 1000000",
        remaining = remaining_ms("expires_at"),
    )
}

/// A ranked election's candidate heartbeat, then the election's live candidates: the member
/// heartbeat's `MERGE ... WITH (HOLDLOCK)` keyed on `(shard_set, member)` and its read, at one
/// reading of the database clock (`@now`), on the row kept under the election's stored name
/// (`stored_candidates`, which no shard set's has). `joined_at` restarts when the row had lapsed
/// (how long a candidate has been live decides a handover to it); the row is never draining and
/// its counts stay `NULL`. Parameters: `@P1` the election's stored name, `@P2` the candidate,
/// `@P3` whole seconds and `@P4` the remaining milliseconds of the time to live, `@P5` the rank
/// (`bigint`).
pub(super) fn candidate_heartbeat_sql(table: &str) -> String {
    let t = quoted(table);
    let written = Written {
        draining: "0",
        set: ", t.candidate_rank = @P5",
        columns: ", candidate_rank",
        values: ", @P5",
    };
    merge_then_read(&t, &written, &live_candidates_sql(&t))
}

/// The live candidates of an election. Parameter: `@P1` the election's stored name.
pub(super) fn candidates_sql(table: &str) -> String {
    format!(
        "DECLARE @now datetime2(7) = SYSUTCDATETIME(); {live}",
        live = live_candidates_sql(&quoted(table)),
    )
}

/// A read that names the candidate rank and returns nothing: error 207 on a table without
/// `AddMemberRank`'s column (which only candidate statements need).
pub(super) fn rank_probe_sql(table: &str) -> String {
    format!("SELECT TOP 0 candidate_rank FROM {t};", t = quoted(table))
}

/// The membership statements of one table.
#[derive(Debug)]
pub(super) struct MemberStatements {
    pub(super) heartbeat: String,
    pub(super) members: String,
    pub(super) leave: String,
    pub(super) probe: String,
    pub(super) candidate_heartbeat: String,
    pub(super) candidates: String,
    pub(super) rank_probe: String,
}

impl MemberStatements {
    pub(super) fn new(table: &str) -> Self {
        Self {
            heartbeat: heartbeat_sql(table),
            members: members_sql(table),
            leave: leave_sql(table),
            probe: members_probe_sql(table),
            candidate_heartbeat: candidate_heartbeat_sql(table),
            candidates: candidates_sql(table),
            rank_probe: rank_probe_sql(table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tsql::tests::params;
    use crate::tsql::MIGRATION_SQL;

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
                "t.expires_at = DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)), ",
                "t.leases_held = @P6, t.set_hash = @P7, t.counted_at = @now ",
                "WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at, leases_held, set_hash, counted_at) ",
                "VALUES (s.shard_set, s.[member], @P5, @now, @now, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)), @P6, @P7, @now); ",
                "SELECT shard_set, [member], draining, joined_at, heartbeat_at, ",
                "DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms, ",
                "CASE WHEN counted_at = heartbeat_at THEN leases_held END AS leases_held, ",
                "CASE WHEN counted_at = heartbeat_at THEN set_hash END AS set_hash ",
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

    // The counts ride on the same MERGE, at the same `@now`, and are read back only from the
    // heartbeat that wrote them.
    #[test]
    fn a_counted_heartbeat_writes_and_reads_the_counts() {
        let sql = heartbeat_sql(DEFAULT_MEMBER_TABLE);
        assert!(
            sql.contains(
                "t.expires_at = DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)), \
             t.leases_held = @P6, t.set_hash = @P7, t.counted_at = @now WHEN NOT MATCHED"
            ),
            "{sql}"
        );
        assert!(sql.contains(
            "INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at, leases_held, set_hash, counted_at) \
             VALUES (s.shard_set, s.[member], @P5, @now, @now, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)), @P6, @P7, @now);"
        ), "{sql}");
        assert_eq!(sql.matches("SYSUTCDATETIME()").count(), 1);
        let read = "remaining_ms, CASE WHEN counted_at = heartbeat_at THEN leases_held END AS leases_held, \
             CASE WHEN counted_at = heartbeat_at THEN set_hash END AS set_hash FROM [orionbeacon_members]";
        assert!(sql.contains(read), "{sql}");
        assert!(members_sql(DEFAULT_MEMBER_TABLE).contains(read));
        let statements = MemberStatements::new("shard_members");
        for sql in [
            &statements.heartbeat,
            &statements.members,
            &statements.probe,
        ] {
            assert!(sql.contains("[shard_members]") && !sql.contains(DEFAULT_MEMBER_TABLE));
        }
        assert_eq!(
            statements.probe,
            "SELECT TOP 0 leases_held, set_hash, counted_at FROM [shard_members];"
        );
    }

    #[test]
    fn holding_migration_is_the_shipped_file() {
        assert!(HOLDING_MIGRATION_SQL.contains(HOLDING_MIGRATION_NAME));
        assert!(HOLDING_MIGRATION_SQL.contains(
            "IF COL_LENGTH(N'[orionbeacon_members]', N'leases_held') IS NULL\n\
             ALTER TABLE [orionbeacon_members] ADD leases_held bigint NULL, set_hash bigint NULL, counted_at datetime2(7) NULL;"
        ));
        let custom = holding_migration_sql("shard_members");
        assert!(custom.contains("COL_LENGTH(N'[shard_members]', N'leases_held')"));
        assert!(custom.contains("ALTER TABLE [shard_members] ADD"));
        assert!(!custom.contains("[orionbeacon_members]"));
    }

    #[test]
    fn candidate_heartbeat_is_one_merge_keyed_on_set_and_member_then_the_live_candidates() {
        assert_eq!(
            candidate_heartbeat_sql(DEFAULT_MEMBER_TABLE),
            concat!(
                "DECLARE @now datetime2(7) = SYSUTCDATETIME(); ",
                "MERGE [orionbeacon_members] WITH (HOLDLOCK) AS t ",
                "USING (SELECT @P1 AS shard_set, @P2 AS [member]) AS s ",
                "ON t.shard_set = s.shard_set AND t.[member] = s.[member] ",
                "WHEN MATCHED THEN UPDATE SET ",
                "t.joined_at = CASE WHEN t.expires_at <= @now THEN @now ELSE t.joined_at END, ",
                "t.draining = 0, ",
                "t.heartbeat_at = @now, ",
                "t.expires_at = DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)), ",
                "t.candidate_rank = @P5 ",
                "WHEN NOT MATCHED THEN INSERT (shard_set, [member], draining, joined_at, heartbeat_at, expires_at, candidate_rank) ",
                "VALUES (s.shard_set, s.[member], 0, @now, @now, DATEADD(MILLISECOND, @P4, DATEADD(SECOND, @P3, @now)), @P5); ",
                "SELECT [member], candidate_rank, ",
                "DATEDIFF_BIG(NANOSECOND, joined_at, @now) / 1000000 AS live_for_ms, ",
                "DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms ",
                "FROM [orionbeacon_members] ",
                "WHERE shard_set = @P1 AND expires_at > @now AND candidate_rank IS NOT NULL;",
            )
        );
        let sql = candidate_heartbeat_sql(DEFAULT_MEMBER_TABLE);
        // The member heartbeat's key and clock: one MERGE, the key alone in ON, one reading.
        assert_eq!(sql.matches("MERGE ").count(), 1);
        let on = &sql[sql.find(" ON ").unwrap()..sql.find(" WHEN MATCHED").unwrap()];
        assert_eq!(
            on,
            " ON t.shard_set = s.shard_set AND t.[member] = s.[member]"
        );
        assert_eq!(sql.matches("SYSUTCDATETIME()").count(), 1);
        assert!(sql.find("MERGE ").unwrap() < sql.find("SELECT [member]").unwrap());
        // The counts are a shard-set member's: a candidate's row leaves them NULL.
        for counts in ["leases_held", "set_hash", "counted_at"] {
            assert!(!sql.contains(counts), "{sql}");
        }
        // The shard-set statements never name the rank (tables without it serve them).
        let members = MemberStatements::new(DEFAULT_MEMBER_TABLE);
        for sql in [
            &members.heartbeat,
            &members.members,
            &members.leave,
            &members.probe,
        ] {
            assert!(!sql.contains("candidate_rank"), "{sql}");
        }
    }

    #[test]
    fn candidates_and_rank_probe_text() {
        assert_eq!(
            candidates_sql(DEFAULT_MEMBER_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             SELECT [member], candidate_rank, \
             DATEDIFF_BIG(NANOSECOND, joined_at, @now) / 1000000 AS live_for_ms, \
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms \
             FROM [orionbeacon_members] \
             WHERE shard_set = @P1 AND expires_at > @now AND candidate_rank IS NOT NULL;"
        );
        assert_eq!(
            rank_probe_sql(DEFAULT_MEMBER_TABLE),
            "SELECT TOP 0 candidate_rank FROM [orionbeacon_members];"
        );
        let custom = MemberStatements::new("shard_members");
        assert_eq!(
            custom.rank_probe,
            "SELECT TOP 0 candidate_rank FROM [shard_members];"
        );
        assert!(custom
            .candidate_heartbeat
            .contains("MERGE [shard_members] WITH (HOLDLOCK) AS t "));
        assert!(custom.candidates.contains(" FROM [shard_members] WHERE "));
    }

    #[test]
    fn rank_migration_is_the_shipped_file() {
        assert!(RANK_MIGRATION_SQL.contains(RANK_MIGRATION_NAME));
        assert!(RANK_MIGRATION_SQL.contains(
            "IF COL_LENGTH(N'[orionbeacon_members]', N'candidate_rank') IS NULL\n\
             ALTER TABLE [orionbeacon_members] ADD candidate_rank bigint NULL;\n"
        ));
        assert!(!RANK_MIGRATION_SQL.contains("\nGO"), "one batch");
        // One statement runs; the down step is a comment.
        let statements: Vec<&str> = RANK_MIGRATION_SQL
            .lines()
            .filter(|l| !l.starts_with("--"))
            .collect();
        assert_eq!(
            statements,
            [
                "IF COL_LENGTH(N'[orionbeacon_members]', N'candidate_rank') IS NULL",
                "ALTER TABLE [orionbeacon_members] ADD candidate_rank bigint NULL;",
            ]
        );
        assert_eq!(rank_migration_sql(DEFAULT_MEMBER_TABLE), RANK_MIGRATION_SQL);
        let custom = rank_migration_sql("shard_members");
        assert!(custom.contains(
            "IF COL_LENGTH(N'[shard_members]', N'candidate_rank') IS NULL\n\
             ALTER TABLE [shard_members] ADD candidate_rank bigint NULL;"
        ));
        assert!(custom.contains("-- ALTER TABLE [shard_members] DROP COLUMN candidate_rank;"));
        assert!(!custom.contains("[orionbeacon_members]"));
        // Not the counts' migration: each file adds its own column.
        assert!(!HOLDING_MIGRATION_SQL.contains("candidate_rank"));
        assert!(!RANK_MIGRATION_SQL.contains("leases_held"));
    }

    #[test]
    fn members_and_leave_text() {
        assert_eq!(
            members_sql(DEFAULT_MEMBER_TABLE),
            "DECLARE @now datetime2(7) = SYSUTCDATETIME(); \
             SELECT shard_set, [member], draining, joined_at, heartbeat_at, \
             DATEDIFF_BIG(NANOSECOND, @now, expires_at) / 1000000 AS remaining_ms, \
             CASE WHEN counted_at = heartbeat_at THEN leases_held END AS leases_held, \
             CASE WHEN counted_at = heartbeat_at THEN set_hash END AS set_hash \
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
            (
                &sql.heartbeat,
                vec!["@P1", "@P2", "@P3", "@P4", "@P5", "@P6", "@P7"],
            ),
            (&sql.members, vec!["@P1"]),
            (&sql.leave, vec!["@P1", "@P2"]),
            (
                &sql.candidate_heartbeat,
                vec!["@P1", "@P2", "@P3", "@P4", "@P5"],
            ),
            (&sql.candidates, vec!["@P1"]),
            (&sql.rank_probe, vec![]),
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
        for sql in [
            &custom.heartbeat,
            &custom.members,
            &custom.leave,
            &custom.candidate_heartbeat,
            &custom.candidates,
            &custom.rank_probe,
        ] {
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
