//! The crate's default features pull no command line and no database driver into the
//! application that depends on it (the drivers come from the application's own sea-orm).

use std::process::Command;

fn normal_dependencies(features: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args([
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ])
        .args(["-p", "orion-beacon-migration"]);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    let out = cmd.output().expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn crates(tree: &str) -> Vec<&str> {
    tree.lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect()
}

#[test]
fn defaults_have_no_cli_and_no_driver() {
    let tree = normal_dependencies(&[]);
    let found = crates(&tree);
    assert!(found.contains(&"sea-orm-migration"), "{tree}");
    for heavy in [
        "sqlx-mysql",
        "sqlx-postgres",
        "sqlx-sqlite",
        "clap",
        "sea-orm-cli",
    ] {
        assert!(
            !found.contains(&heavy),
            "default features pull in {heavy}:\n{tree}"
        );
    }
    // The check itself can fail: the command line's features do pull them in.
    let full = normal_dependencies(&["cli", "mysql"]);
    let found = crates(&full);
    assert!(
        found.contains(&"sqlx-mysql") && found.contains(&"clap"),
        "{full}"
    );
}
