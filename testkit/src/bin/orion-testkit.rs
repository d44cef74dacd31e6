//! Private servers by hand: `cargo run -p orion-beacon-testkit -- postgres mariadb` starts them,
//! prints one line per server (`<kind> <url> <dir> <pid>`), and stops and removes them when its
//! standard input closes or it is killed (Ctrl-C, SIGKILL: the supervisors clean up).
#![forbid(unsafe_code)]

use std::io::{Read, Write};

use orion_beacon_testkit::{MariaDb, Postgres};

fn main() {
    let kinds: Vec<String> = std::env::args().skip(1).collect();
    let kinds = if kinds.is_empty() {
        vec!["postgres".to_owned(), "mariadb".to_owned()]
    } else {
        kinds
    };
    let mut out = std::io::stdout();
    for kind in &kinds {
        let line = match kind.as_str() {
            "postgres" => {
                let pg = Postgres::shared();
                format!(
                    "postgres {} {} {}",
                    pg.url(),
                    pg.data_dir().parent().unwrap_or(pg.data_dir()).display(),
                    pg.pid().unwrap_or(0)
                )
            }
            "mariadb" | "mysql" => {
                let db = MariaDb::shared();
                format!(
                    "mariadb {} {} {}",
                    db.url(),
                    db.data_dir().parent().unwrap_or(db.data_dir()).display(),
                    db.pid().unwrap_or(0)
                )
            }
            other => {
                let _ = writeln!(
                    std::io::stderr(),
                    "unknown server kind {other} (postgres, mariadb)"
                );
                std::process::exit(2);
            }
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    // Until standard input closes.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
