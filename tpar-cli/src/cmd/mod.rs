//! One file per subcommand; `bench`, `check` and `tune` drive the harness the same way on
//! every kind of rank.

pub mod bench;
pub mod check;
pub mod doctor;
pub mod model;
pub mod plan;
pub mod selftest;
pub mod settings;
pub mod sim;
pub mod topo;
pub mod tune;
