//! The `tpar` command line.
fn main() {
    println!("tpar");
}
