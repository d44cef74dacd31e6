use super::*;

fn registered(name: &str) -> runner::Registered {
    let job = Job::new(
        name,
        Schedule::every(Duration::from_secs(1)).expect("an interval"),
        |_run| async { Ok(()) },
    );
    let policy = job.policy().expect("valid");
    runner::Registered::new(job, policy)
}

#[test]
fn the_job_set_is_a_digest_and_the_names_as_json() {
    let set = job_set(&[registered("report \"daily\""), registered("a\\b")]);
    let digest = job_set_digest(&set).expect("a digest");
    assert_eq!(digest.len(), 16);
    assert!(
        set.ends_with(r#"(2 jobs) ["a\\b","report \"daily\""]"#),
        "{set}"
    );
    // The order jobs were added in does not change it.
    let again = job_set(&[registered("a\\b"), registered("report \"daily\"")]);
    assert_eq!(set, again);
    assert_ne!(
        job_set_digest(&job_set(&[registered("a\\b")])),
        Some(digest)
    );
}

#[test]
fn a_large_job_set_fits_a_payload_and_keeps_its_array_whole() {
    let jobs: Vec<_> = (0..300)
        .map(|i| registered(&format!("{i:03}-{}", "x".repeat(40))))
        .collect();
    let set = job_set(&jobs);
    assert!(set.len() <= crate::store::MAX_PAYLOAD_LEN, "{}", set.len());
    crate::store::validate_payload(&set).expect("a valid payload");
    assert!(
        set.contains("(300 jobs) [\"000-") && set.ends_with("\"]"),
        "{set}"
    );
}

/// A scheduler's jobs whose cron expressions read alike (text and zone) hold one parse between
/// them, however each job's schedule was made.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn jobs_of_one_cron_expression_share_its_parse() {
    let db = sea_orm::Database::connect("sqlite::memory:")
        .await
        .expect("an in-memory SQLite");
    let job = |name: &str, zone: &str| {
        Job::new(
            name,
            Schedule::cron("0 2 * * *", zone).expect("a cron schedule"),
            |_run| async { Ok(()) },
        )
    };
    let jobs = Jobs::builder(SeaOrmLeaseStore::new(db))
        .job(job("a", "Europe/Berlin"))
        .job(job("b", "Europe/Berlin"))
        .job(job("c", "UTC"))
        .build()
        .expect("valid jobs");
    let parses: Vec<_> = jobs
        .shared
        .jobs
        .iter()
        .map(|reg| reg.job.schedule.parse_id())
        .collect();
    assert_eq!(parses[0], parses[1], "same text and zone: one parse");
    assert_ne!(parses[0], parses[2], "another zone: a parse of its own");
}
