//! `completions SHELL`: prints clap's completion script; needs no database.

use clap::CommandFactory;

use crate::args::Cli;
use crate::render::emit;

pub fn run(shell: clap_complete::Shell) {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "orion-beacon", &mut out);
    emit(&String::from_utf8_lossy(&out));
}
