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
